--[[
ember.multinomial -- em.multinomial(probs, n[, replacement]) and
probs:multinomial(...): n 1-based class indices (int64) drawn from the weights of a
1-D probs, or of each row of a 2-D one.
]]
local ffi = require 'ffi'
local core = require 'ember.ffi'
require 'ember.tensor'
require 'ember.ops_more'
local raise, kind = core.raise, core.kind
local box_t, istype = core.box_t, ffi.istype
local Tensor = core.Tensor

local M = {}

local function create() return require 'ember.create' end
local function is_int(v) return type(v) == 'number' and v % 1 == 0 end

-- -- multinomial ------------------------------------------------------------------------
-- With replacement, each draw is the category whose cumulative weight first passes
-- u * total (u uniform in [0, 1)): the count of cumulative weights <= u * total.
-- Few draws of few categories count by comparing each draw with every cumulative
-- weight at once (one op, and a sum); past CELLS comparisons, the count is a
-- binary search that every draw runs in step (ceil(log2 k) rounds of a gather and
-- a compare: rows * n * log k work where the comparisons are rows * n * k). Both
-- count the same, so the draws do not depend on which ran.
-- Without, the n largest of p / E (E exponential, from -log u) -- the order in which
-- sequential draws without replacement come out. The uniforms come from ember's
-- generator (uniform_), so em.manual_seed makes the draws reproducible.
local CELLS = 2 ^ 20    -- the most (draw, category) comparisons made at once

-- For each target (rows, n), the count of the row's cumulative weights cdf (rows, k,
-- ascending) that are <= it: 0 .. k.
local function count_le(cdf, target)
  local k = cdf.shape[2]
  local em = create()
  local lo = em.zeros(target.shape, { dtype = 'int64', device = target.device })
  local step = 1
  while step * 2 <= k do step = step * 2 end
  while step >= 1 do
    -- (taken when the cdf's (lo + step)th weight, if there is one, is <= the target)
    local at = lo + step
    local v = cdf:gather(2, at:clamp(1, k))
    lo = lo + (v:le(target):logical_and(at:le(k))):long() * step
    step = step / 2
  end
  return lo
end

-- On the CPU the draws with replacement, and the checks of the weights, are one
-- kernel (em_cpu_multinomial, core/cpu/multinomial.c), which reads each row once
-- and counts exactly as count_le does: the same draws under a seed.
local cpu_code = { float32 = core.C.EM_FLOAT32, float64 = core.C.EM_FLOAT64 }
local function draws_cpu(probs, n)
  local em = create()
  local p = probs:detach()
  if not cpu_code[p.dtype] then p = p:float() end
  p = p:contiguous()
  local rows, k = p.shape[1], p.shape[2]
  local u = em.empty({ rows, n }, { dtype = 'float64' })
  u:uniform_()
  local out = em.empty({ rows, n }, { dtype = 'int64' })
  local C = core.C
  core.check(C.em_cpu_multinomial(core.S, cpu_code[p.dtype], rows, k, C.em_tensor_data(p._h), n,
    C.em_tensor_data(u._h), C.em_tensor_data(out._h)))
  return out
end

local function check_probs(probs, n, replacement)
  local op = 'multinomial'
  if not istype(box_t, probs) then
    raise(('%s: expected a tensor of probabilities as argument 1, got %s'):format(op, kind(probs)))
  end
  local nd = probs:dim()
  if nd ~= 1 and nd ~= 2 then
    raise(('%s: probs must be 1-D or 2-D, got shape [%s]'):format(op, table.concat(probs.shape, ',')))
  end
  if not probs:is_floating_point() then
    raise(('%s: probs must be a floating-point tensor, got %s'):format(op, probs.dtype))
  end
  if not is_int(n) or n < 1 then
    raise(('%s: the number of samples must be a positive integer, got %s'):format(op,
      type(n) == 'number' and tostring(n) or kind(n)))
  end
  local k = probs.shape[nd]
  if k == 0 then raise(op .. ': probs has no categories') end
  if not replacement and n > k then
    raise(('%s: can\'t draw %d samples without replacement from %d categories (pass '
      .. 'replacement = true, or n <= %d)'):format(op, n, k, k))
  end
  if probs.device == 'meta' then return end   -- no values to check
  if replacement and probs.device == 'cpu' then return end   -- draws_cpu checks them
  local p = probs:double():detach()
  local lo = p:min():item()
  if lo ~= lo or p:max():item() == math.huge then
    raise(op .. ': probs must be finite and not NaN')
  end
  if lo < 0 then
    raise(('%s: probs must be non-negative, got a minimum of %g'):format(op, lo))
  end
  if p:sum(nd):min():item() <= 0 then
    raise(op .. ': every row of probs must have a positive sum')
  end
  if not replacement and p:gt(0):long():sum(nd):min():item() < n then
    raise(('%s: a row of probs has fewer than %d categories of non-zero probability, '
      .. 'too few to draw %d samples without replacement'):format(op, n, n))
  end
  return p
end

function M.multinomial(probs, n, replacement)
  if replacement == nil then replacement = false end
  if type(replacement) ~= 'boolean' then
    raise('multinomial: replacement must be a boolean, got ' .. kind(replacement))
  end
  -- (the probabilities in float64, as checked)
  local p = check_probs(probs, n, replacement)
  local one = probs:dim() == 1
  if replacement and probs.device == 'cpu' then
    local r = draws_cpu(one and probs:unsqueeze(1) or probs, n)
    return one and r:squeeze(1) or r
  end
  if one and p then p = p:unsqueeze(1) end
  local em = create()
  if probs.device == 'meta' then
    local rows = one and 1 or probs.shape[1]
    return em.empty(one and { n } or { rows, n }, { dtype = 'int64', device = 'meta' })
  end
  local rows, k = p.shape[1], p.shape[2]
  -- one uniform per draw with replacement, one per category without
  local u = em.empty({ rows, replacement and n or k }, { dtype = 'float64', device = probs.device })
  u:uniform_()
  local r
  if replacement then
    local cdf = p:cumsum(2)
    local target = u * cdf:narrow(2, k, 1)
    local counts
    if rows * n * k <= CELLS then
      counts = cdf:unsqueeze(2):le(target:unsqueeze(3)):long():sum(3)
    else
      counts = count_le(cdf, target)
    end
    r = counts:add(1):clamp(1, k)
  else
    local e = u:log():neg()
    local _, idx = (p / e):topk(n, 2)
    r = idx
  end
  if one then r = r:squeeze(1) end
  return r
end
function Tensor.multinomial(probs, n, replacement) return M.multinomial(probs, n, replacement) end

return M
