--[[
test_checkpoint_shard.lua -- sharded checkpoints (em.checkpoint.save / load of a
sharded model: a folder with index.json and one safetensors file per replica).

Through `ember --replicas N` (tests/lua/dist/shard_ckpt.lua): saved on 1 to 4
replicas, loaded on 1 to 4 in other shard modes and unit groupings, into a plain
model, and from a plain checkpoint file, with Adam and SGD-momentum state, every
value compared exactly with a plain model trained on the same gradients; a
process that dies at each step of a save leaves the previous checkpoint (or,
once the index is replaced, the new one) loadable, and the next save removes
what it left. In this process (one replica): each refused load (another kind of
optimizer, a missing or extra parameter, a shape or dtype mismatch, a truncated
file, a file of another save, a missing file) names the file and the parameter
and leaves the model and optimizer as they were; an error at each step of a save
leaves a loadable checkpoint.

The sharded model is a stand-in with the real one's interface
(tests/lua/dist/shard_standin.lua), used through shard() only.
]]
local dir = (arg and arg[0] and arg[0]:match('^(.*/)')) or
            ((os.getenv('EMBER_TESTS') or 'tests') .. '/lua/')
local H = dofile(dir .. 'harness.lua')
local em = require 'ember'
local nn = em.nn
local ember = arg[-1] or 'ember'
local standin = dofile(dir .. 'dist/shard_standin.lua')
local hooks = require 'ember.checkpoint.shard_save'

local tmp = os.tmpname()
os.remove(tmp)
os.execute('mkdir -p ' .. tmp)

local function sh(cmd)
  local p = io.popen(cmd .. ' 2>&1; echo "exit=$?"')
  local out = p:read('*a')
  p:close()
  return out, tonumber(out:match('exit=(%d+)%s*$'))
end

local function replicas(n, args)
  return sh(('%s --replicas %d %sdist/shard_ckpt.lua %s'):format(ember, n, dir, args))
end

local function ls(d)
  local out = sh('ls ' .. d)
  local names = {}
  for name in out:gmatch('[^\n]+') do
    if not name:match('^exit=') then names[#names + 1] = name end
  end
  return names
end

-- Every replica printed 'match true', and epoch `epoch`.
local function all_match(out, n, epoch, what)
  local ok, ep = 0, 0
  for _ in out:gmatch('match true') do ok = ok + 1 end
  for e in out:gmatch('epoch (%d+) note hi') do if tonumber(e) == epoch then ep = ep + 1 end end
  H.eq(ok, n, what .. ': every replica matches the reference')
  H.eq(ep, n, what .. ': epoch ' .. epoch .. ' and the other fields')
  if ok ~= n then print(out) end
end

-- -- Across replicas ---------------------------------------------------------------------------

local modes = { 'optimizer', 'gradients', 'parameters' }

H.test('saved on 1-4 replicas, loaded on 1-4 in every mode (Adam)', function()
  for n = 1, 4 do
    local d = ('%s/adam%d'):format(tmp, n)
    local out, rc = replicas(n, ('save %s adam %s %d'):format(d, modes[n % 3 + 1], n % 2 + 1))
    H.eq(rc, 0, 'save on ' .. n)
    H.eq(#ls(d), n + 1, 'index.json and one file per replica')
    for m = 1, 4 do
      out, rc = replicas(m, ('load %s adam %s %d'):format(d, modes[m % 3 + 1], m == 3 and 3 or 1))
      H.eq(rc, 0, ('%d -> %d exits 0'):format(n, m))
      all_match(out, m, 1, ('%d -> %d replicas'):format(n, m))
    end
    out, rc = sh(('%s %sdist/shard_ckpt.lua loadplain %s adam'):format(ember, dir, d))
    H.eq(rc, 0)
    all_match(out, 1, 1, n .. ' replicas -> a plain model')
  end
end)

H.test('SGD with momentum, and plain checkpoint files into sharded models', function()
  local d = tmp .. '/sgd3'
  local _, rc = replicas(3, 'save ' .. d .. ' sgd parameters 1')
  H.eq(rc, 0)
  for _, m in ipairs({ 1, 2, 4 }) do
    local out = replicas(m, ('load %s sgd optimizer 2'):format(d))
    all_match(out, m, 1, 'sgd 3 -> ' .. m)
  end
  local out = sh(('%s %sdist/shard_ckpt.lua loadplain %s sgd'):format(ember, dir, d))
  all_match(out, 1, 1, 'sgd 3 -> plain')
  for _, opt in ipairs({ 'adam', 'sgd' }) do
    local f = tmp .. '/plain-' .. opt .. '.ckpt'
    _, rc = sh(('%s %sdist/shard_ckpt.lua saveplain %s %s'):format(ember, dir, f, opt))
    H.eq(rc, 0)
    for m = 1, 4 do
      out = replicas(m, ('load %s %s %s %d'):format(f, opt, modes[m % 3 + 1], m % 2 + 1))
      all_match(out, m, 1, 'plain file (' .. opt .. ') -> ' .. m .. ' replicas')
    end
  end
end)

H.test('a process dying at each step of a save leaves a loadable checkpoint', function()
  local steps = { begin = 1, written = 1, commit = 1, committed = 2, cleaned = 2 }
  for _, step in ipairs({ 'begin', 'written', 'commit', 'committed', 'cleaned' }) do
    local d = tmp .. '/crash-' .. step
    local who = (step == 'begin' or step == 'written') and 2 or 0
    local out, rc = replicas(3, ('crash %s adam optimizer 1 %s %d'):format(d, step, who))
    H.check(out:find('crashing at ' .. step, 1, true) ~= nil and rc ~= 0,
      step .. ': the process died there (' .. tostring(rc) .. ')')
    H.check(not out:find('not crashed'), step)
    out = replicas(2, ('load %s adam gradients 2'):format(d))
    all_match(out, 2, steps[step], 'after dying at ' .. step)
    -- The next save removes what the dead one left.
    _, rc = replicas(3, ('save %s adam optimizer 1'):format(d))
    H.eq(rc, 0)
    H.eq(#ls(d), 4, step .. ': after the next save, index.json and 3 files only')
  end
end)

-- -- In this process --------------------------------------------------------------------------

local s = em.distribute.mirrored{}

local function shard(model, mode) return standin.wrap(s, model, { shard = mode or 'optimizer' }) end

local function build(seed, widths)
  em.manual_seed(seed)
  widths = widths or { 7, 5, 3 }
  local m = nn.Sequential(nn.Linear(widths[1], widths[2]), nn.BatchNorm1d(widths[2]),
    nn.Linear(widths[2], widths[3]))
  return m
end

-- A sharded model and an optimizer with state (one step).
local function trained(seed, kind, widths)
  local m = build(seed, widths)
  local dm = shard(m)
  local opt = kind == 'sgd' and em.optim.SGD(dm:parameters(), { lr = 0.1, momentum = 0.9 })
    or em.optim.Adam(dm:parameters(), { lr = 0.01 })
  for _, p in ipairs(dm:parameters()) do p.grad = em.randn(p:numel()) end
  opt:step()
  return dm, opt, m
end

-- Everything a load could change, copied.
local function snapshot(dm, opt)
  local snap = { lr = opt.lr }
  for i, p in ipairs(dm:parameters()) do
    snap[#snap + 1] = p:detach():clone()
    for k, v in pairs(opt.state[i] or {}) do
      snap[#snap + 1] = type(v) == 'number' and v or v:clone()
    end
  end
  for _, b in ipairs(dm.module:buffers()) do snap[#snap + 1] = b:clone() end
  return snap
end

local function same_snap(a, b)
  if #a ~= #b or a.lr ~= b.lr then return false end
  for i = 1, #a do
    if type(a[i]) == 'number' then
      if a[i] ~= b[i] then return false end
    elseif a[i]:numel() ~= b[i]:numel() or a[i]:ne(b[i]):sum():item() ~= 0 then
      return false
    end
  end
  return true
end

-- load must fail with every fragment in its message, changing nothing.
local function refused(path, dm, opt, ...)
  local before = snapshot(dm, opt)
  H.raises(function() em.checkpoint.load(path, { model = dm, optimizer = opt }) end, ...)
  H.check(same_snap(before, snapshot(dm, opt)), 'the model and optimizer are untouched', 2)
end

local function copy_dir(from, to)
  sh(('rm -rf %s && cp -R %s %s'):format(to, from, to))
end

H.test('refused loads name the file and the parameter and change nothing', function()
  local A = tmp .. '/A'
  local dm, opt = trained(1, 'adam')
  em.checkpoint.save(A, { model = dm, optimizer = opt, epoch = 5 })
  local file = A .. '/' .. ls(A)[2]
  H.check(file:match('rank%-00000%-of%-00001%.%x+%.safetensors$') ~= nil, file)

  local dm2, sgd = trained(2, 'sgd')
  refused(A, dm2, sgd, 'holds the state of a Adam optimizer, not of a SGD', A)

  local big, bopt = trained(3, 'adam', { 7, 6, 3 })
  refused(A, big, bopt, 'parameter 1.weight is float32 [5,7] in the checkpoint, float32 [6,7]', A)

  -- a model with one more layer: its parameter is missing from the checkpoint
  em.manual_seed(4)
  local more = shard(nn.Sequential(nn.Linear(7, 5), nn.BatchNorm1d(5), nn.Linear(5, 3),
    nn.Linear(3, 2)))
  local mopt = em.optim.Adam(more:parameters())
  refused(A, more, mopt, 'has no parameter 4.weight', A)
  -- and one with fewer: the checkpoint's extra parameters are named
  em.manual_seed(4)
  local fewer = shard(nn.Sequential(nn.Linear(7, 5), nn.BatchNorm1d(5)))
  refused(A, fewer, em.optim.Adam(fewer:parameters()), 'that the model lacks: 3.bias, 3.weight', A)

  em.manual_seed(5)
  local dbl = shard(build(5):to('float64'))
  refused(A, dbl, em.optim.Adam(dbl:parameters()), 'parameter 1.weight is float32 [5,7] in the ' ..
    'checkpoint, float64 [5,7]')

  local dm3, opt3 = trained(6, 'adam')
  -- a truncated file
  local T = tmp .. '/T'
  copy_dir(A, T)
  local tf = T .. '/' .. ls(T)[2]
  local f = io.open(tf, 'rb')
  local bytes = f:read('*a')
  f:close()
  f = io.open(tf, 'wb')
  f:write(bytes:sub(1, #bytes - 10))
  f:close()
  refused(T, dm3, opt3, tf)
  -- a file of another save in its place
  local B, R = tmp .. '/B', tmp .. '/R'
  em.checkpoint.save(B, { model = dm3, optimizer = opt3 })
  copy_dir(A, R)
  sh(('cp %s/%s %s/%s'):format(B, ls(B)[2], R, ls(R)[2]))
  refused(R, dm3, opt3, 'belongs to another checkpoint', R .. '/' .. ls(R)[2])
  -- a missing file
  local M = tmp .. '/M'
  copy_dir(A, M)
  local mf = M .. '/' .. ls(M)[2]
  os.remove(mf)
  refused(M, dm3, opt3, "can't open", mf)
  -- a plain model from the same folder still loads, exactly
  local plain = build(9)
  local popt = em.optim.Adam(plain:parameters())
  local rest = em.checkpoint.load(A, { model = plain, optimizer = popt })
  H.eq(rest.epoch, 5)
  local sd = dm:state_dict()
  for _, np in ipairs(plain:named_parameters()) do
    H.eq(np[2]:detach():ne(sd[np[1]]):sum():item(), 0, np[1])
  end
  H.eq(popt.state[1].exp_avg:reshape(35):ne(opt.state[1].exp_avg):sum():item(), 0, 'exp_avg')
  H.eq(popt.state[1].step, 1, 'step')
end)

H.test('an error at each step of a save leaves a loadable checkpoint', function()
  local expect = { begin = 1, written = 1, commit = 1, committed = 2, cleaned = 2 }
  for _, step in ipairs({ 'begin', 'written', 'commit', 'committed', 'cleaned' }) do
    local d = tmp .. '/err-' .. step
    local dm, opt = trained(11, 'adam')
    em.checkpoint.save(d, { model = dm, optimizer = opt, epoch = 1 })
    local v1 = dm:state_dict()
    for _, p in ipairs(dm:parameters()) do p.grad = em.ones(p:numel()) end
    opt:step()
    local v2 = dm:state_dict()
    hooks._hook = function(name) if name == step then error('injected at ' .. name) end end
    H.raises(function() em.checkpoint.save(d, { model = dm, optimizer = opt, epoch = 2 }) end,
      'injected at ' .. step)
    hooks._hook = nil
    local m = build(12)
    local rest = em.checkpoint.load(d, { model = m, optimizer = em.optim.Adam(m:parameters()) })
    H.eq(rest.epoch, expect[step], step)
    local want = expect[step] == 1 and v1 or v2
    for _, np in ipairs(m:named_parameters()) do
      H.eq(np[2]:detach():ne(want[np[1]]):sum():item(), 0, step .. ': ' .. np[1])
    end
    em.checkpoint.save(d, { model = dm, optimizer = opt, epoch = 3 })
    H.eq(#ls(d), 2, step .. ': the next save leaves index.json and one file')
  end
end)

H.test('save checks the optimizer and its state', function()
  local dm = trained(13, 'adam')
  local other = em.optim.Adam(build(14):parameters())
  H.raises(function() em.checkpoint.save(tmp .. '/X', { model = dm, optimizer = other }) end,
    'the optimizer is not built on the model\'s parameters', 'dm:parameters()')
  local d, opt = trained(15, 'adam')
  opt.state[1].odd = em.zeros(3)
  H.raises(function() em.checkpoint.save(tmp .. '/Y', { model = d, optimizer = opt }) end,
    "optimizer state 'odd' of 1.weight has 3 elements, its shard 35")
end)

sh('rm -rf ' .. tmp)
H.done()
