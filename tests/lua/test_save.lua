--[[
test_save.lua -- em.save / em.load and em.checkpoint.

  - round trips: every dtype, nested tables as dotted names, lists, strided
    tensors, metadata, {nested = true};
  - files written by another writer (tests/fixtures/safetensors/, made by
    gen_safetensors.py with torch's values in reference.lua) load with the right
    names, dtypes, shapes and values; corrupt ones raise errors naming the file;
  - our files pass the strict Python reader of gen_safetensors.py (--read), which
    decodes them independently; skipped when python3 is missing;
  - checkpoints: a fake model / optimizer / data loader with state_dict and
    load_state_dict, extra fields of every kind, RNG restore (em.rand after load
    equals em.rand after save), errors;
  - a checkpoint writer killed with kill -9 in the middle of a save (a child
    `ember` process saving a 16 MiB checkpoint in a loop) leaves the previous
    checkpoint loadable and whole, and readers running meanwhile never see a
    partial file.
]]
local dir = (arg and arg[0] and arg[0]:match('^(.*/)')) or
            ((os.getenv('EMBER_TESTS') or 'tests') .. '/lua/')
local H = dofile(dir .. 'harness.lua')
local em = require 'ember'

local fixtures = dir .. '../fixtures/safetensors/'
local gen = dir .. '../fixtures/gen_safetensors.py'
local ember_bin = arg and arg[-1] or 'ember'

local function ok_status(r) return r == 0 or r == true end

-- A scratch folder of our own (tmpfs when there is one), removed at the end.
local scratch
do
  local base = os.tmpname()
  os.remove(base)
  local root = ok_status(os.execute('test -d /dev/shm -a -w /dev/shm')) and '/dev/shm' or '/tmp'
  scratch = root .. '/ember-save-' .. base:match('[^/]+$')
  assert(ok_status(os.execute('mkdir -p ' .. scratch)), 'cannot create ' .. scratch)
end
local function tmp(name) return scratch .. '/' .. name end

local function read_all(cmd)
  local p = io.popen(cmd)
  local s = p:read('*a')
  p:close()
  return s
end

local function sorted_keys(t)
  local ks = {}
  for k in pairs(t) do ks[#ks + 1] = k end
  table.sort(ks, function(a, b) return tostring(a) < tostring(b) end)
  return ks
end

-- Same dtype, shape and values (NaN equal to NaN).
local function same(got, want, what)
  if not H.check(em.is_tensor(got), (what or 'value') .. ' is not a tensor', 2) then return end
  H.check(got.dtype == want.dtype, ('%s: dtype %s, want %s'):format(what, got.dtype, want.dtype), 2)
  H.check(H.deep_eq(got.shape, want.shape), ('%s: shape %s, want %s'):format(what,
    H.show(got.shape), H.show(want.shape)), 2)
  H.check(H.deep_eq(H.flat(got), H.flat(want)), ('%s: values %s, want %s'):format(what,
    H.show(H.flat(got)), H.show(H.flat(want))), 2)
end

local function some_tensors()
  return {
    f32 = em.tensor({{1.5, -2}, {3, 4}}),
    f64 = em.tensor({1e-300, -1e300, 0.1}, {dtype = 'float64'}),
    f16 = em.tensor({1, -0.5, 65504, 1 / 0, 0 / 0}, {dtype = 'float16'}),
    bf16 = em.tensor({3.140625, -1e30}, {dtype = 'bfloat16'}),
    i32 = em.tensor({-7, 2 ^ 31 - 1}, {dtype = 'int32'}),
    i64 = em.tensor({2 ^ 52 + 1, -3}, {dtype = 'int64'}),
    u8 = em.tensor({0, 255, 17}, {dtype = 'uint8'}),
    b = em.tensor({true, false, true}),
    scalar = em.tensor(2.5),
    empty = em.zeros(0, 4),
    strided = em.arange(12):view(3, 4):t():narrow(1, 2, 3),
    expanded = em.tensor({1, 2, 3}):expand(2, 3),
  }
end

-- -- em.save / em.load --------------------------------------------------------------------

H.test('save and load every dtype, strided tensors and metadata', function()
  local ts = some_tensors()
  local path = tmp('all.safetensors')
  em.save(path, ts, {author = 'me', n = 3, flag = true, ['caf\195\169'] = '\226\130\172'})
  local got, meta = em.load(path)
  H.eq(sorted_keys(got), sorted_keys(ts), 'names')
  for name, t in pairs(ts) do
    same(got[name], t, name)
    H.check(got[name]:is_contiguous(), name .. ' is not contiguous')
  end
  H.eq(meta.author, 'me', 'metadata string')
  H.eq(meta.n, '3', 'metadata number')
  H.eq(meta.flag, 'true', 'metadata boolean')
  H.eq(meta['caf\195\169'], '\226\130\172', 'metadata unicode')
  local none, m2 = em.load(fixtures .. 'empty.safetensors')
  H.eq(next(none), nil, 'no tensors')
  H.eq(next(m2), nil, 'no metadata')
end)

H.test('nested tables become dotted names, and come back nested', function()
  local w, b, l1, l2 = em.randn(3, 2), em.zeros(3), em.ones(2), em.full({2}, 7)
  local path = tmp('nested.safetensors')
  em.save(path, {model = {fc = {weight = w, bias = b}}, layers = {l1, l2}, top = w})
  local flat = em.load(path)
  H.eq(sorted_keys(flat), {'layers.1', 'layers.2', 'model.fc.bias', 'model.fc.weight', 'top'},
    'flat names')
  local n = em.load(path, {nested = true})
  same(n.model.fc.weight, w, 'model.fc.weight')
  same(n.model.fc.bias, b, 'model.fc.bias')
  H.eq(#n.layers, 2, 'a list comes back as a list')
  same(n.layers[1], l1, 'layers[1]')
  same(n.layers[2], l2, 'layers[2]')
  same(n.top, w, 'top')
  -- a name that is both a tensor and a prefix can't nest
  em.save(path, {a = w, ['a.b'] = b})
  H.raises(function() em.load(path, {nested = true}) end, 'load', "'a'", 'prefix')
  H.eq(sorted_keys(em.load(path)), {'a', 'a.b'}, 'flat load still works')
end)

H.test('save and load errors', function()
  local t = em.zeros(2)
  H.raises(function() em.save(tmp('x'), t) end, 'save', 'table of tensors')
  H.raises(function() em.save(tmp('x'), {a = 1}) end, 'save', "'a' is a number")
  H.raises(function() em.save(tmp('x'), {a = {b = 'str'}}) end, 'save', "'a.b' is a string")
  H.raises(function() em.save(tmp('x'), {a = t, ['a'] = t, [1.5] = t}) end, 'save', 'integers')
  H.raises(function() em.save(tmp('x'), {['a.b'] = t, a = {b = t}}) end, 'save',
    "both be named 'a.b'")
  H.raises(function() em.save(tmp('x'), {a = t}, {k = {}}) end, 'save', "metadata value of 'k'")
  H.raises(function() em.save(tmp('x'), {__metadata__ = t}) end, 'save', '__metadata__')
  H.raises(function() em.save(scratch .. '/no/such/dir/x', {a = t}) end, 'save',
    'no/such/dir/x', 'No such file')
  H.raises(function() em.load(tmp('missing.safetensors')) end, 'load', 'missing.safetensors',
    "can't open")
  H.raises(function() em.load(fixtures .. 'bad_gap.safetensors') end, 'load',
    'bad_gap.safetensors', 'belong to no tensor')
  H.raises(function() em.load(fixtures .. 'bad_json_deep.safetensors') end, 'load',
    'bad_json_deep.safetensors', 'nesting deeper')
  H.raises(function() em.load(fixtures .. 'unsupported_i16.safetensors') end, 'load',
    "tensor 'a' has dtype I16")
  local err = H.raises(function() em.load(fixtures .. 'bad_overlap.safetensors') end, 'overlap')
  H.check(err:find('test_save.lua', 1, true), 'the error points at the caller: ' .. err)
end)

-- -- Files from another writer --------------------------------------------------------------

H.test('files written by another writer load with torch\'s values', function()
  local ref = dofile(fixtures .. 'reference.lua')
  for _, file in ipairs(sorted_keys(ref)) do
    local want = ref[file]
    local got, meta = em.load(fixtures .. file)
    H.eq(sorted_keys(got), sorted_keys(want.tensors), file .. ' names')
    H.eq(sorted_keys(meta), sorted_keys(want.metadata), file .. ' metadata keys')
    for k, v in pairs(want.metadata) do H.eq(meta[k], v, file .. ' metadata ' .. k) end
    for name, w in pairs(want.tensors) do
      local t = got[name]
      if H.check(t ~= nil, file .. ': no tensor ' .. name) then
        H.eq(t.dtype, w.dtype, file .. ' ' .. name .. ' dtype')
        H.eq(t.shape, w.shape, file .. ' ' .. name .. ' shape')
        H.eq(H.flat(t), w.data, file .. ' ' .. name .. ' values')
      end
    end
  end
end)

-- -- Our files, read by a strict independent reader ------------------------------------------

-- The system's python3 (a version manager's shim can take half a second to start).
local python = ok_status(os.execute('test -x /usr/bin/python3')) and '/usr/bin/python3' or 'python3'
local have_python = ok_status(os.execute(python .. ' -c "" >/dev/null 2>&1'))

H.test('our files pass the strict Python reader', function()
  if not have_python then H.skip('python3 is not installed') return end
  local ts = some_tensors()
  ts['caf\195\169 "quoted" \\ name'] = em.tensor({1, 2})
  local path = tmp('strict.safetensors')
  em.save(path, ts, {format = 'pt', note = 'line\nbreak "q"'})
  local text = read_all(('%s %s --read %s 2>&1'):format(python, gen, path))
  local chunk = loadstring(text)
  if not H.check(chunk, 'the reader said: ' .. text:sub(1, 300)) then return end
  local res = chunk().file
  H.eq(res.metadata.format, 'pt', 'metadata format')
  H.eq(res.metadata.note, 'line\nbreak "q"', 'metadata note')
  H.eq(sorted_keys(res.tensors), sorted_keys(ts), 'names')
  for name, t in pairs(ts) do
    local r = res.tensors[name]
    if H.check(r, 'the reader lacks ' .. name) then
      H.eq(r.dtype, t.dtype, name .. ' dtype')
      H.eq(r.shape, t.shape, name .. ' shape')
      H.eq(r.data, H.flat(t), name .. ' values')
    end
  end
  -- and a checkpoint is a valid safetensors file too
  em.checkpoint.save(tmp('ck.safetensors'), {w = em.ones(2, 2), step = 1})
  text = read_all(('%s %s --read %s 2>&1'):format(python, gen,
    tmp('ck.safetensors')))
  H.check(text:match('^%-%- Generated'), 'checkpoint refused: ' .. text:sub(1, 300))
end)

-- -- Checkpoints -----------------------------------------------------------------------------

-- A stand-in for em.nn modules and em.optim optimizers: state_dict returns a
-- nested table of tensors and plain values, load_state_dict copies it back.
local Fake = {}
Fake.__index = Fake
local function fake(t) return setmetatable(t, Fake) end
function Fake:state_dict()
  return { weight = self.weight, bias = self.bias, cfg = self.cfg }
end
function Fake:load_state_dict(sd)
  self.weight:copy_(sd.weight)
  self.bias:copy_(sd.bias)
  self.cfg = sd.cfg
  self.loaded = (self.loaded or 0) + 1
end

local Opt = {}
Opt.__index = Opt
function Opt:state_dict()
  return { state = { { step = 3, exp_avg = self.m[1] }, { step = 3, exp_avg = self.m[2] } },
    param_groups = { { lr = 1e-3, betas = { 0.9, 0.999 }, eps = 1e-8, nesterov = false } } }
end
function Opt:load_state_dict(sd) self.sd = sd end

local Loader = {}
Loader.__index = Loader
function Loader:state_dict() return { epoch = self.epoch, position = self.position } end
function Loader:load_state_dict(sd) self.epoch, self.position = sd.epoch, sd.position end

H.test('checkpoint round trip: objects, extra fields, tensors', function()
  local m = fake({ weight = em.randn(4, 3), bias = em.randn(4),
    cfg = { hidden = 3, act = 'relu', dropout = 0.1 } })
  local opt = setmetatable({ m = { em.randn(4, 3), em.randn(4) } }, Opt)
  local loader = setmetatable({ epoch = 2, position = 1234 }, Loader)
  local shared = em.arange(5)
  local extra = {
    step = 1000, lr = 3e-4, best = -math.huge, nan = 0 / 0, big = 2 ^ 60, neg = -17,
    name = 'run \226\130\172 "1"', raw = 'bytes\0\255\1', flag = true, off = false,
    list = { 1, 'two', { three = 3 }, shared }, again = shared,
    sparse = { [1] = 'a', [3] = 'c' }, mixed = { 1, 2, x = 'y' }, marker = { __tensor__ = 'x' },
    negzero = -0.0, keys = { ['\255bin'] = 1, plain = 2 },
    id = 9007199254740993LL, uid = 18446744073709551615ULL, empty = {},
    t = em.tensor({ { 1, 2 }, { 3, 4 } }, { dtype = 'float64' }):t(),
    half = em.tensor({ 0.5 }, { dtype = 'float16' }),
  }
  local state = { model = m, optimizer = opt, loader = loader }
  for k, v in pairs(extra) do state[k] = v end
  local path = tmp('ck.safetensors')
  em.checkpoint.save(path, state)

  -- tensors are stored under readable names
  local flat, meta = em.load(path)
  H.eq(sorted_keys(flat), { 'again', 'half', 'model.bias', 'model.weight',
    'optimizer.state.1.exp_avg', 'optimizer.state.2.exp_avg', 't' }, 'tensor names')
  H.eq(meta.format, 'ember.checkpoint', 'format')

  local m2 = fake({ weight = em.zeros(4, 3), bias = em.zeros(4) })
  local opt2 = setmetatable({}, Opt)
  local loader2 = setmetatable({}, Loader)
  local rest = em.checkpoint.load(path, { model = m2, optimizer = opt2, loader = loader2 })
  same(m2.weight, m.weight, 'model weight')
  same(m2.bias, m.bias, 'model bias')
  H.eq(m2.cfg.hidden, 3, 'model cfg')
  H.eq(m2.cfg.act, 'relu', 'model cfg string')
  H.eq(m2.loaded, 1, 'load_state_dict called once')
  same(opt2.sd.state[1].exp_avg, opt.m[1], 'optimizer state 1')
  same(opt2.sd.state[2].exp_avg, opt.m[2], 'optimizer state 2')
  H.eq(opt2.sd.state[2].step, 3, 'optimizer step')
  H.eq(opt2.sd.param_groups[1].lr, 1e-3, 'optimizer lr')
  H.eq(opt2.sd.param_groups[1].betas, { 0.9, 0.999 }, 'optimizer betas')
  H.eq(opt2.sd.param_groups[1].nesterov, false, 'optimizer flag')
  H.eq(loader2.epoch, 2, 'loader epoch')
  H.eq(loader2.position, 1234, 'loader position')
  H.eq(rest.model, nil, 'model is not returned')
  H.eq(rest.optimizer, nil, 'optimizer is not returned')
  H.eq(rest.loader, nil, 'loader is not returned')
  for _, k in ipairs({ 'step', 'lr', 'best', 'nan', 'big', 'neg', 'name', 'raw', 'flag', 'off' }) do
    H.eq(rest[k], extra[k], 'field ' .. k)
  end
  H.eq(rest.list[1], 1, 'list[1]')
  H.eq(rest.list[2], 'two', 'list[2]')
  H.eq(rest.list[3].three, 3, 'list[3]')
  same(rest.list[4], shared, 'list[4]')
  H.check(rawequal(rest.again, rest.list[4]), 'a tensor saved twice comes back as one')
  H.eq(em.load(path).again:numel(), 5, 'stored once, under the first name in key order')
  H.eq(rest.sparse[1], 'a', 'sparse[1]')
  H.eq(rest.sparse[3], 'c', 'sparse[3]')
  H.eq(rest.sparse[2], nil, 'sparse[2]')
  H.eq({ rest.mixed[1], rest.mixed[2], rest.mixed.x }, { 1, 2, 'y' }, 'mixed table')
  H.eq(rest.marker.__tensor__, 'x', 'a user key that looks like a tag')
  H.eq(1 / rest.negzero, -math.huge, 'negative zero')
  H.eq({ rest.keys['\255bin'], rest.keys.plain }, { 1, 2 }, 'a key that is not UTF-8')
  H.check(rest.id == 9007199254740993LL, 'int64 cdata: ' .. tostring(rest.id))
  H.check(rest.uid == 18446744073709551615ULL, 'uint64 cdata: ' .. tostring(rest.uid))
  H.eq(next(rest.empty), nil, 'empty table')
  same(rest.t, extra.t, 'transposed tensor field')
  same(rest.half, extra.half, 'float16 field')

  -- without objects, state dicts come back as tables
  local all = em.checkpoint.load(path)
  same(all.model.weight, m.weight, 'model state dict as a table')
  H.eq(all.loader.epoch, 2, 'loader state dict as a table')
end)

H.test('checkpoint restores the RNG', function()
  em.manual_seed(1234)
  em.rand(10)
  local path = tmp('rng.safetensors')
  em.checkpoint.save(path, { step = 1 })
  local after_save = em.rand(6)
  local n_after = em.randn(3)
  em.rand(1000)
  em.manual_seed(99)
  local rest = em.checkpoint.load(path)
  H.eq(rest.step, 1, 'step')
  same(em.rand(6), after_save, 'em.rand after load')
  same(em.randn(3), n_after, 'em.randn after load')
end)

H.test('checkpoint errors', function()
  local path = tmp('ck-err.safetensors')
  H.raises(function() em.checkpoint.save(path, { f = print }) end, 'checkpoint.save',
    "'f' is a function")
  H.raises(function() em.checkpoint.save(path, { a = { b = { c = coroutine.create(print) } } }) end,
    "'a.b.c' is a thread")
  local cyc = {}
  cyc.self = cyc
  H.raises(function() em.checkpoint.save(path, { c = cyc }) end, 'contains itself')
  H.raises(function() em.checkpoint.save(path, 3) end, 'checkpoint.save', 'expected a table')
  em.save(path, { w = em.zeros(2) })
  H.raises(function() em.checkpoint.load(path) end, 'checkpoint.load', 'not an ember checkpoint')
  em.checkpoint.save(path, { step = 1 })
  H.raises(function() em.checkpoint.load(path, { model = {} }) end, 'objects.model',
    'load_state_dict')
  H.raises(function() em.checkpoint.load(path, { model = fake({}) }) end,
    "no 'model' entry")
  H.raises(function() em.checkpoint.load(fixtures .. 'bad_short.safetensors') end,
    'checkpoint.load:', 'bad_short.safetensors', 'too short')
  H.raises(function() em.checkpoint.save(scratch .. '/no/dir/ck', { step = 1 }) end,
    'checkpoint.save:', 'no/dir/ck')
  -- a checkpoint whose document lies
  em.save(path, {}, { format = 'ember.checkpoint',
    ['ember.checkpoint'] = '{"version":1,"rng":{"seed":"1","offset":"2"},"fields":{"w":{"__tensor__":"nope"}}}' })
  H.raises(function() em.checkpoint.load(path) end, 'corrupt checkpoint document', 'nope')
  em.save(path, {}, { format = 'ember.checkpoint', ['ember.checkpoint'] = '{"version":1,' ..
    string.rep('[', 500) })
  H.raises(function() em.checkpoint.load(path) end, 'corrupt checkpoint document')
  em.save(path, {}, { format = 'ember.checkpoint', ['ember.checkpoint'] = '{"version":1} x' })
  H.raises(function() em.checkpoint.load(path) end, 'corrupt checkpoint document', 'trailing')
end)

-- -- A writer killed mid-save -----------------------------------------------------------------

local function sh(cmd) return ok_status(os.execute(cmd)) end

local function alive(pid)
  local f = io.open('/proc/' .. pid .. '/stat', 'r')
  if not f then return false end
  local s = f:read('*a')
  f:close()
  return not s:match('^%d+ %b() [ZX]')
end

local function tmp_files(folder)
  local n = 0
  for line in read_all('ls -a ' .. folder):gmatch('[^\n]+') do
    if line:find('.tmp-', 1, true) then n = n + 1 end
  end
  return n
end

-- The checkpoint at path is whole: step k, w filled with k, pad all zeros.
local function check_checkpoint(path)
  local ok, rest = pcall(em.checkpoint.load, path)
  if not ok then return false, rest end
  local k, w, pad = rest.step, rest.w, rest.pad
  if type(k) ~= 'number' or not em.is_tensor(w) or not em.is_tensor(pad) or
      pad:numel() ~= 4 * 2 ^ 20 then
    return false, 'missing or wrong fields'
  end
  if w:min():item() ~= k or w:max():item() ~= k or rest.note ~= 'step ' .. k or
      pad:min():item() ~= 0 or pad:max():item() ~= 0 then
    return false, ('step %d with w in [%g, %g], note %s'):format(k, w:min():item(),
      w:max():item(), tostring(rest.note))
  end
  return true, k
end

-- The same, then the 16 MiB read are handed back at once: fresh memory costs
-- page faults, and the reads go on in a loop.
local function consistent(path)
  local ok, k = check_checkpoint(path)
  em.collect()
  return ok, k
end

H.test('a checkpoint killed mid-save leaves the previous one intact', function()
  local folder = tmp('kill')
  sh('mkdir -p ' .. folder)
  local path, child, pidfile = folder .. '/ck.safetensors', tmp('child.lua'), tmp('pid')
  -- The child saves from step arg[2] on, forever; almost all of its time goes
  -- into writing the 16 MiB of pad, so a kill mostly lands inside a save.
  local f = assert(io.open(child, 'w'))
  f:write([[
local em = require 'ember'
local w, pad = em.zeros(1024), em.zeros(4, 1024, 1024)
for step = tonumber(arg[2]), 1e9 do
  w:fill_(step)
  em.checkpoint.save(arg[1], {step = step, w = w, pad = pad, note = 'step ' .. step})
end
]])
  f:close()
  em.checkpoint.save(path, { step = 0, w = em.zeros(1024), pad = em.zeros(4, 1024, 1024),
    note = 'step 0' })
  local caught, bad_reads, last = 0, 0, 0
  for attempt = 1, 6 do
    local start = last + 1
    sh(('%s %s %s %d >/dev/null 2>&1 & echo $! > %s'):format(ember_bin, child, path, start,
      pidfile))
    local pid = io.open(pidfile):read('*l')
    -- read while it writes: every read must see a whole checkpoint
    for _ = 1, 500 do
      local ok, k = consistent(path)
      if not ok then
        bad_reads = bad_reads + 1
        H.check(false, 'a reader saw a broken checkpoint: ' .. tostring(k))
      else
        last = k
      end
      if last > start then break end
      sh('sleep 0.01')
    end
    H.check(last > start, ('the child did not get to save twice (step %d)'):format(last))
    sh(('sleep 0.0%d; kill -9 %s'):format(attempt, pid))
    for _ = 1, 200 do
      if not alive(pid) then break end
      sh('sleep 0.01')
    end
    H.check(not alive(pid), 'the child is still running')
    if tmp_files(folder) > 0 then caught = caught + 1 end
    local ok, k = consistent(path)
    H.check(ok, 'after kill -9: ' .. tostring(k))
    H.check(ok and k >= last, ('after kill -9 the checkpoint is at step %s, earlier than %d')
      :format(tostring(k), last))
    last = ok and k or last
    sh('rm -f ' .. folder .. '/*.tmp-*')
    if caught >= 2 then break end
  end
  H.check(caught >= 1, 'no kill landed in the middle of a save (no temporary file left)')
  H.eq(bad_reads, 0, 'broken reads')
end)

os.execute('rm -rf ' .. scratch)
H.done()
