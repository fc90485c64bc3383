--[[
test_hf_safetensors.lua -- safetensors interoperability with Hugging Face's own
library, both ways (tests/fixtures/gen_hf_safetensors.py makes the fixtures).

  - every file in tests/fixtures/hf/ was written by the `safetensors` library
    (numpy, raw bfloat16 bits, torch); em.load must give exactly the tensors
    listed in expected.json: names, dtypes, shapes, every value (NaN, the
    infinities and the sign of zero included; int64 values read bit-exact) and
    every metadata entry;
  - the big_header fixture really has a JSON header over 100 KB;
  - ember still writes, byte for byte, the files in tests/fixtures/hf/ember/:
    the ones the library read back as ember meant them (the generator keeps them
    only then, with write.lua, the snippet that wrote them, and lists each in
    ember_written_verdict.txt with its OK). A change to how ember writes fails
    here until the generator has verified the new files.
]]
local dir = (arg and arg[0] and arg[0]:match('^(.*/)')) or
            ((os.getenv('EMBER_TESTS') or 'tests') .. '/lua/')
local H = dofile(dir .. 'harness.lua')
local em = require 'ember'
local ffi = require 'ffi'
local decode = require 'ember.checkpoint.json'

local hf = dir .. '../fixtures/hf/'

local function read_file(path)
  local f = assert(io.open(path, 'rb'))
  local s = f:read('*a')
  f:close()
  return s
end

local function sorted_keys(t)
  local ks = {}
  for k in pairs(t) do ks[#ks + 1] = k end
  table.sort(ks)
  return ks
end

local expected = decode(read_file(hf .. 'expected.json'), 16)

-- Does got (a Lua number read from the tensor) match want from the JSON: "nan",
-- "inf", "-inf" or a number, with -0 apart from +0?
local function float_matches(got, want)
  if want == 'nan' then return got ~= got end
  if want == 'inf' then return got == math.huge end
  if want == '-inf' then return got == -math.huge end
  if got ~= want then return false end
  return want ~= 0 or 1 / got == 1 / want
end

-- int64 values straight from memory: a Lua number holds only 53 bits. want is a
-- number (|v| <= 2^53) or the exact decimal string.
local function int64_matches(got, want)
  if type(want) == 'string' then return tostring(got) == want .. 'LL' end
  return got == want
end

-- Compares tensor t with the JSON description w; one check per tensor (a
-- mismatch names the first differing value).
local function check_tensor(file, name, t, w)
  local what = ('%s: %q'):format(file, name)
  if not H.check(em.is_tensor(t), what .. ' is missing', 2) then return end
  if not H.check(t.dtype == w.dtype, ('%s: dtype %s, want %s'):format(what, t.dtype, w.dtype), 2)
    or not H.check(H.deep_eq(t.shape, w.shape), ('%s: shape %s, want %s'):format(what,
      H.show(t.shape), H.show(w.shape)), 2) then
    return
  end
  local n, want = t:numel(), w.values
  if not H.check(n == #want, ('%s: %d values, want %d'):format(what, n, #want), 2) then return end
  local bad
  if t.dtype == 'int64' then
    H.check(t:is_contiguous(), what .. ' is not contiguous', 2)
    local p = ffi.cast('int64_t *', t:data_ptr())
    for i = 1, n do
      if not int64_matches(p[i - 1], want[i]) then
        bad = ('value %d is %s, want %s'):format(i, tostring(p[i - 1]), tostring(want[i]))
        break
      end
    end
  else
    local got = H.flat(t)
    local floating = t:is_floating_point()
    for i = 1, n do
      local ok
      if floating then ok = float_matches(got[i], want[i]) else ok = got[i] == want[i] end
      if not ok then
        bad = ('value %d is %.17g, want %s'):format(i, got[i], tostring(want[i]))
        break
      end
    end
  end
  H.check(not bad, ('%s: %s'):format(what, tostring(bad)), 2)
end

for _, file in ipairs(sorted_keys(expected.files)) do
  local want = expected.files[file]
  H.test(('%s (%s) loads with the values safetensors wrote'):format(file, want.writer), function()
    local got, meta = em.load(hf .. file)
    H.eq(sorted_keys(got), sorted_keys(want.tensors), file .. ': names')
    for _, name in ipairs(sorted_keys(want.tensors)) do
      check_tensor(file, name, got[name], want.tensors[name])
    end
    H.eq(sorted_keys(meta), sorted_keys(want.metadata), file .. ': metadata keys')
    for k, v in pairs(want.metadata) do
      H.eq(meta[k], v, ('%s: metadata %q'):format(file, k))
    end
  end)
end

H.test('the fixtures cover what they claim', function()
  -- every dtype ember knows, 0-d and empty tensors, metadata, a >100 KB header
  local dtypes, scalar, empty, meta = {}, false, false, false
  for _, f in pairs(expected.files) do
    if next(f.metadata) then meta = true end
    for _, t in pairs(f.tensors) do
      dtypes[t.dtype] = true
      if #t.shape == 0 then scalar = true end
      for _, d in ipairs(t.shape) do if d == 0 then empty = true end end
    end
  end
  H.eq(sorted_keys(dtypes), { 'bfloat16', 'bool', 'float16', 'float32', 'float64', 'int32',
    'int64', 'uint8' }, 'dtypes')
  H.check(scalar, 'no 0-d tensor')
  H.check(empty, 'no empty tensor')
  H.check(meta, 'no metadata')
  H.check(expected.files['torch_state_dict.safetensors'], 'no file written by torch')
  -- the header length is the file's first 8 bytes, little-endian
  local head = read_file(hf .. 'big_header.safetensors'):sub(1, 8)
  local len = 0
  for i = 8, 1, -1 do len = len * 256 + head:byte(i) end
  H.check(len > 100 * 1024, ('big_header.safetensors has a header of %d bytes'):format(len))
end)

-- The files of a folder, sorted.
local function listing(folder)
  local p = assert(io.popen("ls -A '" .. folder .. "'"))
  local names = {}
  for line in p:lines() do names[#names + 1] = line end
  p:close()
  table.sort(names)
  return names
end

H.test("ember writes, byte for byte, the files safetensors read as ember meant them", function()
  local text = read_file(hf .. 'ember_written_verdict.txt')
  local files = {}
  for name, state in text:gmatch('\nfile ([^:\n]+): (%u+)') do
    files[#files + 1] = name
    H.eq(state, 'OK', 'verdict for ' .. name)
  end
  H.check(#files >= 7, ('the verdict lists %d files'):format(#files))
  H.check(text:match('\nverdict: OK\n$'), 'the verdict does not end with "verdict: OK"')
  H.check(text:find(('\nsafetensors %s, '):format(expected.versions.safetensors), 1, true),
    'the verdict names another safetensors than expected.json')
  -- the kept files are exactly the verified ones, and the snippet
  local kept = hf .. 'ember/'
  local want_list = { 'write.lua' }
  for _, f in ipairs(files) do want_list[#want_list + 1] = f end
  table.sort(want_list)
  H.eq(listing(kept), want_list, 'files in tests/fixtures/hf/ember/')
  -- write them again, here and now
  local tmp = H.tmpdir()
  local ok, err = pcall(assert(loadfile(kept .. 'write.lua')), tmp)
  H.check(ok, 'write.lua failed: ' .. tostring(err))
  for _, f in ipairs(files) do
    local want, got = H.read(kept .. f), H.read(tmp .. '/' .. f)
    local at
    if want and got and want ~= got then
      at = 1
      while want:byte(at) == got:byte(at) do at = at + 1 end
    end
    H.check(want and got and want == got, ('%s: %s'):format(f, not want and 'no fixture'
      or not got and 'ember wrote no such file' or ('%d bytes, the verified file %d; first '
      .. 'difference at byte %d'):format(#got, #want, at or 0)))
  end
  os.execute("rm -rf '" .. tmp .. "'")
end)

H.done()
