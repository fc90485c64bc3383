--[[
test_cuda_loader.lua -- ds:loader{device = 'cuda', pin_memory = true} from Lua, on
the emulated runtime (EMBER_CUDA_EMULATE=2:64; the test runs itself again with
it otherwise): batches arrive on the device with the CPU loader's values, in
order, for several epochs, pinned (with and without workers, with a transform
after `batch`) and pageable; a small model computes on them as on the CPU; the
copy statistics; pinned CPU batches; the option errors; and, without a CUDA
device, pin_memory falling back to ordinary memory with a warning (as PyTorch's
DataLoader does) while device = 'cuda' is an error. The pinned-buffer reuse rule,
the overlap and the leak checks are in tests/c/test_cuda_loader.c, which can
reach the emulator's counters and slow its copy stream down.
]]
local dir = (arg and arg[0] and arg[0]:match('^(.*/)')) or
            ((os.getenv('EMBER_TESTS') or 'tests') .. '/lua/')
local no_cuda_run = os.getenv('EMBER_TEST_NO_CUDA_CHILD')
local H, em
if no_cuda_run then H, em = dofile(dir .. 'harness.lua'), require 'ember'
else H, em = dofile(dir .. 'cuda_emulated.lua')('2:64') end
local T = em.data.T

local function dataset(after)
  em.manual_seed(5)
  local x = (em.rand(150, 2, 6) * 255):byte()
  local y = em.arange(1, 151):long()
  local ds = em.data.tensors(x, y):shuffle{ seed = 9 }:batch(16)
  if after then ds = ds:map(after) end
  return ds
end

local function collect(loader, epoch)
  local r = {}
  for x, y in loader:epoch(epoch) do r[#r + 1] = { x, y } end
  return r
end

local function check_same(got, want, what)
  H.eq(#got, #want, what .. ': batch count')
  local bad = 0
  for i = 1, math.min(#got, #want) do
    local gx, gy = got[i][1], got[i][2]
    local function str(t) return table.concat(H.flat(t), ',') end
    if gx.device ~= 'cuda:0' or gy.device ~= 'cuda:0' or gx.dtype ~= want[i][1].dtype or
       str(gx:cpu()) ~= str(want[i][1]) or str(gy:cpu()) ~= str(want[i][2]) then
      bad = bad + 1
    end
  end
  H.eq(bad, 0, what .. ': batches that differ from the CPU loader')
end

H.test('batches on cuda match the CPU loader, in order, every epoch', function()
  for _, case in ipairs{
    { 'pinned, 2 workers', {}, { workers = 2, device = 'cuda', pin_memory = true } },
    { 'pinned, no workers, 2 ahead', {}, { device = 'cuda', pin_memory = true, device_prefetch = 2 } },
    { 'pinned, to_float after batch', { T.to_float() }, { workers = 2, device = 'cuda', pin_memory = true } },
    { 'pageable', {}, { workers = 2, device = 'cuda' } },
  } do
    local name, after, opts = case[1], case[2][1], case[3]
    local ds = dataset(after)
    local cpu, dev = ds:loader{ workers = 1 }, ds:loader(opts)
    for epoch = 1, 3 do check_same(collect(dev, epoch), collect(cpu, epoch), name .. ' epoch ' .. epoch) end
    local st = dev:stats()
    H.eq(st.copies, 3 * 10, name .. ': copies')
    H.eq(st.copies_done, st.copies, name .. ': all ran')
    H.check(st.copy_s > 0, name .. ': copy time in stats')
    local xb = after and 4 or 1
    H.eq(st.copy_bytes, 3 * 150 * (12 * xb + 8), name .. ': bytes copied')
    if opts.pin_memory then
      H.check(st.pinned_buffers > 0 and st.pinned_bytes > 0, name .. ': a pinned pool')
    else
      H.eq(st.pinned_buffers, 0, name .. ': no pinned pool')
    end
    H.check(st.buffer_waits >= 0 and st.copies_late >= 0 and st.buffer_wait_s >= 0, name)
    dev:close()
  end
end)

H.test('a model computes on the fed batches as on the CPU', function()
  local ds = dataset(T.to_float())
  em.manual_seed(1)
  local m = em.nn.Linear(12, 3)
  local md = em.nn.Linear(12, 3)
  md:load_state_dict(m:state_dict())
  md:to('cuda')
  local cpu = collect(ds:loader{ workers = 1 }, 1)
  local i, worst = 0, 0
  for x, y in ds:loader{ workers = 2, device = 'cuda', pin_memory = true }:epoch(1) do
    i = i + 1
    local a = md(x:flatten(2)):sum():item()
    local b = m(cpu[i][1]:flatten(2)):sum():item()
    worst = math.max(worst, math.abs(a - b) / math.max(1, math.abs(b)))
    H.eq(y:cpu():totable(), cpu[i][2]:totable(), 'labels of batch ' .. i)
  end
  H.eq(i, #cpu)
  H.check(worst < 1e-5, 'model outputs agree: ' .. worst)
end)

H.test('pinned CPU batches, and the options', function()
  local ds = dataset()
  local l = ds:loader{ workers = 1, pin_memory = true }
  local n = 0
  for x, y in l:epoch(1) do
    n = n + 1
    H.check(x.device == 'cpu' and x:is_pinned() and y:is_pinned(), 'pinned cpu batch ' .. n)
    H.eq(x:cuda():cpu():totable(), x:totable(), 'its asynchronous copy')
  end
  H.eq(n, 10)
  H.eq(l:stats().copies, 0, 'the loader copied nothing itself')
  H.eq(ds:loader{}:stats().copies, nil, 'no copy stats on a plain loader')
  H.raises(function() ds:loader{ device = 'cuda', pin_memory = true, device_prefetch = 'x' } end,
           'device_prefetch')
  H.raises(function() ds:loader{ device = 'cuda:5' } end, 'loader', 'cuda:5')
  if not H.two_devices() then return end
  local d1 = ds:loader{ device = 'cuda:1', pin_memory = true }
  for x in d1:epoch(1) do H.eq(x.device, 'cuda:1'); break end
end)

H.test('without a CUDA device: pin_memory falls back, device cuda is an error', function()
  if no_cuda_run then return end
  local ember = arg[-1] or 'ember'
  local code = [[
    local em = require 'ember'
    if em.cuda.is_available() then print('has-cuda') return end
    local ds = em.data.tensors(em.ones(8, 2), em.ones(8)):batch(4)
    local l = ds:loader{ pin_memory = true }
    for x in l:epoch(1) do io.write('pinned=', tostring(x:is_pinned()), ' ') end
    local ok, err = pcall(function() return ds:loader{ device = 'cuda', pin_memory = true } end)
    print(ok and 'no-error' or ('error=' .. tostring(err)))
  ]]
  local f = io.popen(('env -u EMBER_CUDA_EMULATE EMBER_TEST_NO_CUDA_CHILD=1 %s -e %q 2>&1')
    :format(ember, code))
  local out = f:read('*a')
  f:close()
  if out:find('has-cuda', 1, true) then return H.skip('this machine has a GPU') end
  H.check(out:find('pin_memory needs a CUDA device', 1, true), 'the warning: ' .. out)
  H.check(out:find('pinned=false pinned=false', 1, true), 'ordinary memory: ' .. out)
  H.check(out:find('error=.*needs a CUDA device'), 'device cuda: ' .. out)
end)

H.done()
