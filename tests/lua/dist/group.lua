-- group.lua -- run by test_distribute_group.lua on 4 replicas (`ember --replicas
-- 4`, mpirun -np 4, 4 GPU replicas on emulated devices): groups of a mirrored
-- strategy as a pipeline of P = 2 stages x D = 2 replicas uses them, stage p's
-- replicas being ranks {p, p + 2}.
--   collectives  every collective of the group, each dtype, strided sources,
--                against values computed here; a world send between the same two
--                replicas pending across the group's collectives, a group send
--                received in the other order; s:split. Prints "rank R group G of
--                N backend B checks P failed F", one line per failed check.
--   train MODE   three steps of g:wrap(stage model, {shard = MODE}) (MODE none or
--                gradients) against one model trained here on the group's
--                combined batch. The stages' models differ in width, so groups
--                whose traffic mixed would fail. Prints "rank R maxdiff D".
--   error        world replica 3 (stage 1's replica 1) raises an error; its
--                group partner prints "caught: <message>"
local nn, F = em.nn, em.nn.functional
local mode = arg[1] or 'collectives'
local s = em.distribute.mirrored{ timeout = 60 }
local R, dev = s.rank, s.device
assert(s.world_size == 4, 'group.lua runs on 4 replicas')
local p = R % 2
local g = s:group{ p, p + 2 }
local partner = (R + 2) % 4

if mode == 'collectives' then
  local passed, failed = 0, 0
  local function check(ok, what)
    if ok then passed = passed + 1 else failed = failed + 1; print('FAILED ' .. what) end
  end
  check(g.rank == (R - p) / 2 and g.world_size == 2, 'rank and size')
  check(g.parent == s and g.ranks[1] == p and g.ranks[2] == p + 2, 'parent and ranks')
  check(g.device == s.device, 'device')
  local function val(w, k, i) return (w + 1) * 10 + k * 3 + i % 17 - 8 end
  local function source(dt, w, k)     -- an [8, 5] transposed view of a [5, 8] tensor
    local v = {}
    for c = 1, 5 do
      v[c] = {}
      for row = 1, 8 do v[c][row] = val(w, k, (row - 1) * 5 + c) end
    end
    return em.tensor(v, { dtype = dt }):to(dev):t()
  end
  local function expect(t, want, what)
    check(t.device == dev, what .. ': on ' .. dev .. ', got ' .. tostring(t.device))
    local v = t:to('cpu'):double():flatten():totable()
    if #v ~= #want then return check(false, ('%s: %d values, want %d'):format(what, #v, #want)) end
    for i = 1, #v do
      if v[i] ~= want[i] then
        return check(false, ('%s [%d]: got %s, want %s'):format(what, i, v[i], want[i]))
      end
    end
    check(true)
  end
  local members = { p, p + 2 }
  -- a world send to the partner, received after the group's collectives
  local pending = s:send(source('float32', R, 50), partner, { async = true })
  local gsend = g:send(source('int64', R, 51), 1 - g.rank, { async = true })
  for k, dt in ipairs({ 'float32', 'float64', 'float16', 'bfloat16', 'int32', 'int64' }) do
    local want = {}
    for i = 1, 40 do want[i] = val(p, k, i) + val(p + 2, k, i) end
    expect(g:allreduce(source(dt, R, k)), want, 'allreduce ' .. dt)
    for i = 1, 40 do want[i] = math.max(val(p, k, i), val(p + 2, k, i)) end
    expect(g:allreduce(source(dt, R, k), 'max', { async = true }):wait(), want, 'async max ' .. dt)
    if dt:find('float') then
      for i = 1, 40 do want[i] = (val(p, k, i) + val(p + 2, k, i)) / 2 end
      expect(g:allreduce(source(dt, R, k), 'mean'), want, 'mean ' .. dt)
    end
    for i = 1, 40 do want[i] = val(p + 2, k, i) end
    expect(g:broadcast(source(dt, R, k), 1), want, 'broadcast ' .. dt)
    local all = {}
    for m = 1, 2 do for i = 1, 40 do all[(m - 1) * 40 + i] = val(members[m], k, i) end end
    expect(g:allgather(source(dt, R, k)), all, 'allgather ' .. dt)
    local part = {}
    for i = 1, 20 do
      local j = g.rank * 20 + i
      part[i] = val(p, k, j) + val(p + 2, k, j)
    end
    expect(g:reduce_scatter(source(dt, R, k)), part, 'reduce_scatter ' .. dt)
    g:barrier()
  end
  local want = {}
  for i = 1, 40 do want[i] = val(partner, 51, i) end
  expect(g:recv(em.zeros({ 8, 5 }, { dtype = 'int64', device = dev }), 1 - g.rank), want, 'group recv')
  for i = 1, 40 do want[i] = val(partner, 50, i) end
  expect(s:recv(em.zeros({ 8, 5 }, { device = dev }), partner), want, 'world recv')
  pending:wait()
  gsend:wait()
  -- the world between the groups' work: everyone
  expect(s:allreduce(em.full({ 3 }, R, { device = dev })), { 6, 6, 6 }, 'world allreduce')
  local h = s:split(p)
  check(h.world_size == 2 and h.rank == g.rank and h.ranks[2] == p + 2, 'split')
  expect(h:allreduce(em.full({ 2 }, R, { device = dev })), { 2 * p + 2, 2 * p + 2 }, 'split allreduce')
  print(('rank %d group %d of %d backend %s checks %d failed %d'):format(R, g.rank,
    g.world_size, g.backend, passed, failed))
elseif mode == 'train' then
  local shard = arg[2] ~= 'none' and arg[2] or nil
  local width = 5 + 3 * p
  local function build()
    em.manual_seed(3 + p)
    return nn.Sequential(nn.Linear(6, width), nn.Tanh(), nn.Linear(width, width), nn.Tanh(),
      nn.Linear(width, 4))
  end
  local ref, model = build(), build()
  local dm = g:wrap(model, { shard = shard, bucket_mb = 200 / 2 ^ 20 })
  local opt = em.optim.SGD(dm:parameters(), { lr = 0.1, momentum = 0.9 })
  local ropt = em.optim.SGD(ref:parameters(), { lr = 0.1, momentum = 0.9 })
  local B, D = 3, g.world_size
  em.manual_seed(11 + p)
  for _ = 1, 3 do
    local X, Y = em.randn(B * D, 6), em.randn(B * D, 4)
    F.mse_loss(ref(X), Y):backward()
    ropt:step(); ropt:zero_grad()
    local x = X:narrow(1, g.rank * B + 1, B):to(dev)
    local y = Y:narrow(1, g.rank * B + 1, B):to(dev)
    F.mse_loss(dm(x), y):backward()
    opt:step(); opt:zero_grad()
  end
  local sd, worst = dm:state_dict(), 0
  for k, v in pairs(ref:state_dict()) do
    worst = math.max(worst, (sd[k]:to('cpu') - v):abs():max():item())
  end
  print(('rank %d maxdiff %.3g'):format(R, worst))
elseif mode == 'error' then
  if R == 3 then error('boom in stage one') end
  if p == 1 then
    local ok, err = pcall(function() return g:allreduce(em.ones({ 8 }, { device = dev })) end)
    print(('rank %d caught: %s'):format(R, ok and 'nothing' or tostring(err)))
  end
end
