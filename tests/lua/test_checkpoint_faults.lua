--[[
test_checkpoint_faults.lua -- em.checkpoint.load of a file it must refuse: cut
short at every part of its layout, or written by another run (another model,
another optimizer's groups, an entry missing). Each is an error naming the file,
and leaves the model, the optimizer and the RNG exactly as they were, whichever
object was restored first. (The slow faults -- replicas killed, stopped, cut
off, a full disk -- are tests/faults/run.sh, `make test-faults`.)
]]
local dir = (arg and arg[0] and arg[0]:match('^(.*/)')) or
            ((os.getenv('EMBER_TESTS') or 'tests') .. '/lua/')
local H = dofile(dir .. 'harness.lua')
local em = require 'ember'
local nn = em.nn

local scratch = os.tmpname()
os.remove(scratch)
os.execute('mkdir -p ' .. scratch)
local function tmp(name) return scratch .. '/' .. name end

local function net(hidden)
  return nn.Sequential(nn.Linear(4, hidden), nn.Tanh(), nn.Linear(hidden, 2))
end

-- A model and an Adam optimizer one step into training (so that it has state).
local function trained(seed, hidden, groups)
  em.manual_seed(seed)
  local m = net(hidden)
  local params = m:parameters()
  local opt
  if groups == 2 then
    opt = em.optim.Adam({ { params = { params[1], params[2] } },
                          { params = { params[3], params[4] }, lr = 0.01 } }, { lr = 0.1 })
  else
    opt = em.optim.Adam(params, { lr = 0.1 })
  end
  m(em.randn(5, 4)):pow(2):sum():backward()
  opt:step()
  return m, opt
end

-- Everything the objects hold, as host copies: parameters, moments, hyper-parameters.
local function snapshot(m, opt)
  local s = { params = {}, state = {}, lrs = {} }
  for i, p in ipairs(m:parameters()) do s.params[i] = p:clone() end
  for i, st in pairs(opt.state) do
    s.state[i] = { exp_avg = st.exp_avg:clone(), exp_avg_sq = st.exp_avg_sq:clone() }
  end
  for i, g in ipairs(opt.param_groups) do s.lrs[i] = g.lr end
  return s
end

local function same(a, b)
  if #a.params ~= #b.params or #a.lrs ~= #b.lrs then return false end
  for i = 1, #a.params do
    if (a.params[i] - b.params[i]):abs():max():item() ~= 0 then return false end
  end
  for i, st in pairs(a.state) do
    local o = b.state[i]
    if not o or (st.exp_avg - o.exp_avg):abs():max():item() ~= 0 or
       (st.exp_avg_sq - o.exp_avg_sq):abs():max():item() ~= 0 then return false end
  end
  for i = 1, #a.lrs do if a.lrs[i] ~= b.lrs[i] then return false end end
  return true
end

-- load(path) into a model and optimizer must raise an error that names path and
-- has each of `wants`, and leave both and the RNG untouched.
local function refused(path, m, opt, objects, ...)
  local before = snapshot(m, opt)
  em.manual_seed(42)
  local want_draw = em.rand(3)
  em.manual_seed(42)
  local ok, err = pcall(em.checkpoint.load, path, objects or { model = m, optimizer = opt })
  H.check(not ok, 'load of ' .. path .. ' raised')
  err = tostring(err)
  H.check(err:find('checkpoint.load', 1, true) and err:find(path, 1, true),
    'the error names the file: ' .. err)
  for _, w in ipairs({ ... }) do H.check(err:find(w, 1, true), ('"%s" in: %s'):format(w, err)) end
  H.check(same(snapshot(m, opt), before), 'the model and optimizer are untouched')
  H.check((em.rand(3) - want_draw):abs():max():item() == 0, 'the RNG is untouched')
end

local function read(path)
  local f = assert(io.open(path, 'rb'))
  local s = f:read('*a')
  f:close()
  return s
end
local function write(path, s)
  local f = assert(io.open(path, 'wb'))
  f:write(s)
  f:close()
end

H.test('a checkpoint cut short anywhere is refused, nothing restored', function()
  local m, opt = trained(1, 8)
  local good = tmp('good.ckpt')
  em.checkpoint.save(good, { model = m, optimizer = opt, step = 1 })
  local whole = read(good)
  local n = #whole
  local header = 8 + tonumber(whole:byte(1)) + 256 * tonumber(whole:byte(2))
  local dst, dopt = trained(2, 8)
  -- inside the length prefix, inside the JSON header, at its end, inside the
  -- tensor data, one byte short
  for _, cut in ipairs({ 0, 5, 8, math.floor(header / 2), header, header + 7, math.floor((header + n) / 2), n - 1 }) do
    local path = tmp('cut' .. cut .. '.ckpt')
    write(path, whole:sub(1, cut))
    refused(path, dst, dopt)
  end
  -- and the whole file still restores everything
  em.checkpoint.load(good, { model = dst, optimizer = dopt })
  H.check(same(snapshot(dst, dopt), snapshot(m, opt)), 'the whole file restores both')
end)

H.test('a checkpoint of another run is refused, nothing restored', function()
  local m, opt = trained(3, 8)
  -- another model: other layer sizes
  local other_m, other_opt = trained(4, 6)
  local path = tmp('other_model.ckpt')
  em.checkpoint.save(path, { model = other_m, optimizer = other_opt, step = 9 })
  refused(path, m, opt, nil, 'refused its state')
  -- the same model, an optimizer with other groups: the model, restorable by
  -- itself, is left alone too (whichever object load restores first)
  local same_m, two_groups = trained(5, 8, 2)
  path = tmp('other_groups.ckpt')
  em.checkpoint.save(path, { model = same_m, optimizer = two_groups, step = 9 })
  refused(path, m, opt, nil, 'objects.optimizer', 'parameter groups')
  local reversed = {}                    -- the other insertion order
  reversed.optimizer = opt
  reversed.model = m
  refused(path, m, opt, reversed, 'objects.optimizer', 'parameter groups')
  -- an entry the file lacks
  path = tmp('no_optimizer.ckpt')
  em.checkpoint.save(path, { model = same_m, step = 9 })
  refused(path, m, opt, nil, "no 'optimizer' entry")
  -- not a checkpoint at all
  path = tmp('plain.safetensors')
  em.save(path, { w = em.ones(2) })
  refused(path, m, opt, nil, 'not an ember checkpoint')
end)

os.execute('rm -rf ' .. scratch)
H.done()
