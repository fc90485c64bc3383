--[[
ember.distribute.pipeline.cut -- where a Sequential is cut into pipeline stages:
given child counts, or counts that balance a measured cost per child.

  cut.partition(costs, stages) -> counts   (each >= 1, summing to #costs)
  cut.time_costs(children, sample)         seconds of forward+backward per child
  cut.memory_costs(children, sample, held) bytes per child

partition minimises the largest stage's cost over every cut into consecutive
runs (dynamic programming over prefix sums: stages x children^2 steps, nothing
for the sizes pipelines have), ties going to the earliest cut.

Time: each child runs forward and backward on the sample a few times (the
first run warms caches and is dropped; the median of the rest is kept) on the
output of the children before it. Replicas measure different times, so the
caller agrees on one replica's costs before cutting (pipeline.lua broadcasts
replica 0's).

Memory: a child costs its parameters four times (the parameters, their
gradients and two optimizer moments, Adam's) plus what its forward leaves
allocated for backward -- the activations -- times the micro-batches a stage
holds at once (`held`). The activations are measured as the allocator's growth
over the child's forward with autograd on, on the sample's device.
]]
local em = require 'ember'
local handles = require 'ember.handles'

local M = {}

function M.partition(costs, stages)
  local n = #costs
  local pre = { [0] = 0 }
  for i = 1, n do pre[i] = pre[i - 1] + costs[i] end
  -- best[k][i]: the least largest cost of the first i children in k stages
  local best, from = {}, {}
  best[0] = { [0] = 0 }
  for k = 1, stages do
    best[k], from[k] = {}, {}
    for i = k, n - (stages - k) do
      local b, arg = math.huge, nil
      for j = k - 1, i - 1 do
        local prev = best[k - 1][j]
        if prev then
          local c = math.max(prev, pre[i] - pre[j])
          if c < b - 1e-12 then b, arg = c, j end
        end
      end
      best[k][i], from[k][i] = b, arg
    end
  end
  local counts, i = {}, n
  for k = stages, 1, -1 do
    local j = from[k][i]
    counts[k] = i - j
    i = j
  end
  return counts
end

local function sum_of(t)
  if type(t) == 'table' then
    local s
    for _, v in ipairs(t) do s = s and s + sum_of(v) or sum_of(v) end
    return s
  end
  return t:float():sum()
end

local function leaf(x)
  return em.no_grad(function() return x:detach() end):requires_grad_(x:is_floating_point())
end

function M.time_costs(children, sample, repeats)
  repeats = repeats or 3
  local costs, x = {}, sample
  for i, child in ipairs(children) do
    local times = {}
    for r = 0, repeats do
      local inp = leaf(x)
      local t0 = em.clock()
      local out = child(inp)
      if out.requires_grad then sum_of(out):backward() end
      if out.device ~= 'cpu' then em.cuda.synchronize() end
      if r > 0 then times[#times + 1] = em.clock() - t0 end
      if r == repeats then x = out:detach() end
    end
    for _, p in ipairs(child:parameters()) do p.grad = nil end
    table.sort(times)
    costs[i] = times[math.floor((#times + 1) / 2)]
  end
  return costs
end

local function param_bytes(m)
  local b = 0
  for _, p in ipairs(m:parameters()) do b = b + p:numel() * p:element_size() end
  return b
end

function M.memory_costs(children, sample, held)
  local costs, x = {}, sample
  local dev = sample.device
  for i, child in ipairs(children) do
    local inp = leaf(x)
    -- (garbage left from before would be freed at any moment, inside the
    -- child's forward too, and count against it)
    handles.collect()
    local before = em.memory_stats(dev).allocated
    local out = child(inp)
    local act = math.max(0, em.memory_stats(dev).allocated - before)
    costs[i] = 4 * param_bytes(child) + act * (held or 1)
    x = out:detach()
  end
  return costs
end

return M
