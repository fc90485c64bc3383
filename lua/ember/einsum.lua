--[[
ember.einsum -- em.einsum(eq, ...), PyTorch's Einstein summation: 'ij,jk->ik',
'bij,bjk->bik', 'i,j->ij', 'ii->i', 'ii', '...ij->...ji', implicit outputs (the
letters seen once, in alphabetical order, after the ellipsis dims).

Each operand first loses its repeated letters (the diagonal, a strided view) and
the letters no one else needs (a sum); then the operands are contracted left to
right, two at a time, as one batched matmul: the shared letters still needed
later are the batch, the shared letters needed nowhere else are summed by the
product. Size-1 dims broadcast. Everything is views, sums and matmul, so
gradients, CUDA and meta come with them.
]]
local ffi = require 'ffi'
local core = require 'ember.ffi'
require 'ember.tensor'
require 'ember.shape'
local C, S, wrap, fail, raise, kind = core.C, core.S, core.wrap, core.fail, core.raise, core.kind
local box_t, istype = core.box_t, ffi.istype
local H, out = core.H, core.out

local M = {}
local sizes_buf, strides_buf = ffi.new('int64_t[?]', 64), ffi.new('int64_t[?]', 64)
-- Letters standing for the ellipsis's dims (never valid subscripts themselves).
local ELLIPSIS = '0123456789'

-- The subscripts of one operand as a list of one-character letters; '...' becomes
-- as many ellipsis letters as it covers (right-aligned, so they broadcast).
local function subscripts(eq, term, ndim, i)
  local pre, post = term:match('^(.-)%.%.%.(.*)$')
  local explicit = pre and (pre .. post) or term
  if explicit:find('[^%a]') then
    raise(("einsum: invalid subscript in '%s' of equation '%s' (letters a-z, A-Z and '...' only)"):format(term, eq))
  end
  local letters = {}
  if not pre then
    if #term ~= ndim then
      raise(("einsum: subscripts '%s' give %d dims but operand %d has %d"):format(term, #term, i, ndim))
    end
    for c in term:gmatch('.') do letters[#letters + 1] = c end
    return letters, 0
  end
  local span = ndim - #explicit
  if span < 0 or span > #ELLIPSIS then
    raise(("einsum: subscripts '%s' don't fit operand %d's %d dims"):format(term, i, ndim))
  end
  for c in pre:gmatch('.') do letters[#letters + 1] = c end
  for j = span, 1, -1 do letters[#letters + 1] = ELLIPSIS:sub(j, j) end
  for c in post:gmatch('.') do letters[#letters + 1] = c end
  return letters, span
end

-- a with its repeated letters reduced to their diagonal (an as_strided view).
local function diagonal(eq, a, letters)
  local shape, strides = a.shape, {}
  for d = 1, #shape do strides[d] = a:stride(d) end
  local seen, ls, sz, st = {}, {}, {}, {}
  for d, c in ipairs(letters) do
    local at = seen[c]
    if at then
      if sz[at] ~= shape[d] then
        raise(("einsum: letter '%s' repeats in one operand of '%s' with sizes %d and %d"):format(
          c, eq, sz[at], shape[d]))
      end
      st[at] = st[at] + strides[d]
    else
      ls[#ls + 1], sz[#sz + 1], st[#st + 1] = c, shape[d], strides[d]
      seen[c] = #ls
    end
  end
  if #ls == #letters then return a, letters end
  for d = 1, #sz do sizes_buf[d - 1], strides_buf[d - 1] = sz[d], st[d] end
  if C.em_as_strided(S, H(a, 'einsum', 0), sizes_buf, strides_buf, #sz, a:storage_offset(),
      out) ~= 0 then
    fail()
  end
  return wrap(out[0]), ls
end

-- Sums the letters of t that `needed` lacks; returns t and its remaining letters.
local function drop(t, letters, needed)
  local dims, kept = {}, {}
  for d, c in ipairs(letters) do
    if needed[c] then kept[#kept + 1] = c else dims[#dims + 1] = d end
  end
  if #dims == 0 then return t, letters end
  return t:sum(dims), kept
end

local function prod(sizes, letters)
  local p = 1
  for _, c in ipairs(letters) do p = p * sizes[c] end
  return p
end

local function permuted(t, letters, order)
  local at, perm, same = {}, {}, true
  for d, c in ipairs(letters) do at[c] = d end
  for i, c in ipairs(order) do perm[i] = at[c]; same = same and perm[i] == i end
  if same or #perm == 0 then return t end
  return t:permute(perm)
end

-- The contraction of a and b as one batched matmul; `keep`: letters needed later.
local function contract(a, la, b, lb, keep, sizes)
  local ina, inb = {}, {}
  for _, c in ipairs(la) do ina[c] = true end
  for _, c in ipairs(lb) do inb[c] = true end
  local batch, aonly, red, bonly = {}, {}, {}, {}
  for _, c in ipairs(la) do
    if inb[c] then
      if keep[c] then batch[#batch + 1] = c else red[#red + 1] = c end
    else aonly[#aonly + 1] = c end
  end
  for _, c in ipairs(lb) do if not ina[c] then bonly[#bonly + 1] = c end end
  local ao, bo = {}, {}
  for _, l in ipairs({ batch, aonly, red }) do for _, c in ipairs(l) do ao[#ao + 1] = c end end
  for _, l in ipairs({ batch, red, bonly }) do for _, c in ipairs(l) do bo[#bo + 1] = c end end
  local nb, m, k, n = prod(sizes, batch), prod(sizes, aonly), prod(sizes, red), prod(sizes, bonly)
  local am = permuted(a, la, ao):reshape(nb, m, k)
  local bm = permuted(b, lb, bo):reshape(nb, k, n)
  local r, rl, shape = require('ember.index').matmul(am, bm), {}, {}
  for _, l in ipairs({ batch, aonly, bonly }) do
    for _, c in ipairs(l) do rl[#rl + 1] = c; shape[#shape + 1] = sizes[c] end
  end
  return r:reshape(shape), rl
end

function M.einsum(eq, ...)
  if type(eq) ~= 'string' then raise('einsum: expected an equation string, got ' .. kind(eq)) end
  local ops = { ... }
  if #ops == 1 and type(ops[1]) == 'table' and not istype(box_t, ops[1]) then ops = ops[1] end
  local e = eq:gsub('%s', '')
  local lhs, rhs = e:match('^(.-)%->(.*)$')
  lhs = lhs or e
  local terms = {}
  for term in (lhs .. ','):gmatch('([^,]*),') do terms[#terms + 1] = term end
  if #terms ~= #ops then
    raise(("einsum: equation '%s' has %d operands but %d tensors were given"):format(eq, #terms, #ops))
  end
  local sizes, count, letters, span = {}, {}, {}, 0
  for i, t in ipairs(ops) do
    if not istype(box_t, t) then raise(('einsum: operand %d is a %s, not a tensor'):format(i, kind(t))) end
    local ls, sp = subscripts(eq, terms[i], t:dim(), i)
    span = math.max(span, sp)
    local tl = t.shape
    for d, c in ipairs(ls) do
      local s = sizes[c]
      if s and s ~= tl[d] and s ~= 1 and tl[d] ~= 1 then
        raise(("einsum: letter '%s' has size %d in one operand and %d in another ('%s', shapes %s)"):format(
          c:find('%d') and '...' or c, s, tl[d], eq, core.shape_str(H(t, 'einsum', i))))
      end
      sizes[c] = math.max(s or 0, tl[d])
      if s == 0 or tl[d] == 0 then sizes[c] = 0 end
    end
    letters[i] = ls
    for _, c in ipairs(ls) do count[c] = (count[c] or 0) + 1 end
  end
  -- The output's letters: given, or the ellipsis then the letters seen once, sorted.
  local outl = {}
  if rhs then
    local ls = subscripts(eq, rhs, #rhs:gsub('%.%.%.', '') + (rhs:find('%.%.%.', 1) and span or 0), 0)
    local seen = {}
    for _, c in ipairs(ls) do
      if not sizes[c] then raise(("einsum: output letter '%s' of '%s' is in no operand"):format(c, eq)) end
      if seen[c] then raise(("einsum: output letter '%s' of '%s' appears twice"):format(c, eq)) end
      seen[c] = true
      outl[#outl + 1] = c
    end
  else
    for j = span, 1, -1 do outl[#outl + 1] = ELLIPSIS:sub(j, j) end
    local once = {}
    for c, n in pairs(count) do if n == 1 and not c:find('%d') then once[#once + 1] = c end end
    table.sort(once)
    for _, c in ipairs(once) do outl[#outl + 1] = c end
  end
  local inout = {}
  for _, c in ipairs(outl) do inout[c] = true end
  -- Each operand: its diagonal, broadcast size-1 dims, then the letters only it has.
  local ts = {}
  for i, t in ipairs(ops) do
    local a, ls = diagonal(eq, t, letters[i])
    local shape, grow = a.shape, false
    local target = {}
    for d, c in ipairs(ls) do target[d] = sizes[c]; grow = grow or shape[d] ~= sizes[c] end
    if grow then a = a:expand(target) end
    local needed = {}
    for c in pairs(inout) do needed[c] = true end
    for j, other in ipairs(letters) do
      if j ~= i then for _, c in ipairs(other) do needed[c] = true end end
    end
    ts[i], letters[i] = drop(a, ls, needed)
  end
  local r, rl = ts[1], letters[1]
  for i = 2, #ts do
    local keep = {}
    for c in pairs(inout) do keep[c] = true end
    for j = i + 1, #ts do for _, c in ipairs(letters[j]) do keep[c] = true end end
    r, rl = contract(r, rl, ts[i], letters[i], keep, sizes)
  end
  r, rl = drop(r, rl, inout)
  return permuted(r, rl, outl)
end

return M
