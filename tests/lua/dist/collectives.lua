-- collectives.lua -- run by test_distribute.lua under `ember --replicas N` and
-- mpirun: every collective of a mirrored strategy, for every dtype, synchronous and
-- asynchronous, on contiguous and strided tensors, against values computed here
-- in Lua numbers (each replica's input is a known function of its rank).
-- Prints "rank R checks P failed F" and one line per failed check.
local s = em.distribute.mirrored{ timeout = 60 }
local R, N = s.rank, s.world_size
local passed, failed = 0, 0
local function check(ok, what)
  if ok then passed = passed + 1 else failed = failed + 1; print('FAILED ' .. what) end
end
-- input of replica r, element i (1-based): small integers, exact in every dtype
local function val(r, i) return ((r + 1) * (i % 7) - 3 + r) % 11 - 5 end
local function input(dt, r, n) -- 1-D tensor of n values
  local t = {}
  for i = 1, n do t[i] = val(r, i) end
  return em.tensor(t, { dtype = dt })
end
local function close(a, b, dt)
  local tol = (dt == 'float16' or dt == 'bfloat16') and 0.05 or 1e-6
  return math.abs(a - b) <= tol * (1 + math.abs(b))
end
local function expect(t, f, dt, what)
  local v = t:double():flatten():totable()
  for i = 1, #v do
    if not close(v[i], f(i), dt) then
      check(false, ('%s %s [%d]: got %s, want %s'):format(what, dt, i, v[i], f(i)))
      return
    end
  end
  check(true)
end
local reduce = {
  sum = function(i) local a = 0; for r = 0, N - 1 do a = a + val(r, i) end; return a end,
  max = function(i) local a = -1e9; for r = 0, N - 1 do a = math.max(a, val(r, i)) end; return a end,
  min = function(i) local a = 1e9; for r = 0, N - 1 do a = math.min(a, val(r, i)) end; return a end,
}
reduce.mean = function(i) return reduce.sum(i) / N end

local dtypes = { 'float32', 'float64', 'float16', 'bfloat16', 'int32', 'int64' }
local n = 5000 + N        -- not a multiple of the replica count: uneven slices
for _, dt in ipairs(dtypes) do
  local is_float = dt:match('float') ~= nil
  for _, op in ipairs({ 'sum', 'mean', 'max', 'min' }) do
    if op ~= 'mean' or is_float then
      local t = input(dt, R, n)
      check(s:allreduce(t, op) == t, 'allreduce returns its tensor')
      expect(t, reduce[op], dt, 'allreduce ' .. op)
      local w = s:allreduce(input(dt, R, n), op, { async = true })
      expect(w:wait(), reduce[op], dt, 'async allreduce ' .. op)
      check(w:done(), 'done after wait')
    end
  end
  -- strided: the transpose of a (50, 3) tensor, reduced in place
  local base = input(dt, R, 150):view(50, 3)
  local tt = base:t()
  s:allreduce(tt, 'sum')
  expect(base, reduce.sum, dt, 'allreduce on a transposed view')
  -- broadcast from every root
  for root = 0, N - 1 do
    local t = input(dt, R, 33)
    s:broadcast(t, root)
    expect(t, function(i) return val(root, i) end, dt, 'broadcast from ' .. root)
  end
  -- allgather: (k, 2) from each replica -> (N*k, 2) in rank order
  local k = 4
  local g = s:allgather(input(dt, R, 2 * k):view(k, 2))
  check(g.shape[1] == N * k and g.shape[2] == 2, 'allgather shape')
  expect(g, function(i) local r = math.floor((i - 1) / (2 * k)); return val(r, (i - 1) % (2 * k) + 1) end,
    dt, 'allgather')
  local ga = s:allgather(input(dt, R, 2 * k):view(k, 2), { async = true }):wait()
  expect(ga, function(i) local r = math.floor((i - 1) / (2 * k)); return val(r, (i - 1) % (2 * k) + 1) end,
    dt, 'async allgather')
  -- reduce_scatter: dim 1 of (N*3, 2) split in N parts
  local rs = s:reduce_scatter(input(dt, R, N * 6):view(N * 3, 2), 'sum')
  check(rs.shape[1] == 3 and rs.shape[2] == 2, 'reduce_scatter shape')
  expect(rs, function(i) return reduce.sum(R * 6 + i) end, dt, 'reduce_scatter sum')
  local rm = s:reduce_scatter(input(dt, R, N * 6):view(N * 3, 2), 'max', { async = true }):wait()
  expect(rm, function(i) return reduce.max(R * 6 + i) end, dt, 'async reduce_scatter max')
end
s:barrier()
s:barrier({ async = true }):wait()
check(true)
print(('rank %d checks %d failed %d'):format(R, passed, failed))
