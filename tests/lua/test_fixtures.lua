--[[
test_fixtures.lua -- every case of tests/fixtures/tensor_ops.lua (PyTorch's results,
written by tests/fixtures/gen_fixtures.py) run through ember's Lua API and compared
element by element with atol + rtol * |ref| for the result's dtype.

A case makes its inputs (em.tensor + view + the recorded views: transpose, narrow,
expand, permute, select), calls the op as a method, an em.* function, an operator
or an in-place method, and compares every result's shape, dtype and values (for
an in-place op on a view, the base tensor as well). One check per case; cases are
grouped by op. Cases marked optional (ops beyond API.md's list) are skipped when
ember lacks the op.
]]
local dir = (arg and arg[0] and arg[0]:match('^(.*/)')) or
            ((os.getenv('EMBER_TESTS') or 'tests') .. '/lua/')
local H = dofile(dir .. 'harness.lua')
local em = require 'ember'
local unpack = unpack or table.unpack

local fixtures = os.getenv('EMBER_FIXTURES') or (dir .. '../fixtures/tensor_ops.lua')
local cases = dofile(fixtures)

-- Default tolerances per result dtype: {atol, rtol}.
local TOL = {
  float32 = {1e-5, 1e-5}, float64 = {1e-10, 1e-10},
  float16 = {1e-3, 1e-2}, bfloat16 = {1e-2, 2e-2},
  int32 = {0, 0}, int64 = {0, 0}, uint8 = {0, 0}, bool = {0, 0},
}

local function numel(shape)
  local n = 1
  for i = 1, #shape do n = n * shape[i] end
  return n
end

-- The input tensor: the base made from the data, then the recorded views.
local function make(spec)
  local opts = {dtype = spec.dtype}
  local base
  if #spec.shape == 0 then
    base = em.tensor(spec.data[1], opts)
  elseif numel(spec.shape) == 0 then
    base = em.zeros(spec.shape, opts)
  else
    base = em.tensor(spec.data, opts):view(spec.shape)
  end
  local t = base
  for _, v in ipairs(spec.view or {}) do
    local f = t[v[1]]
    if not f then error('no view method ' .. v[1]) end
    t = f(t, unpack(v, 2))
  end
  return t, base
end

local function resolve(args, ins)
  local res, n = {}, #args
  for i = 1, n do
    local a = args[i]
    if type(a) == 'table' and a.input then
      res[i] = ins[a.input]
    elseif type(a) == 'table' and a.list then
      local l = {}
      for j, k in ipairs(a.list) do l[j] = ins[k] end
      res[i] = l
    elseif type(a) == 'table' and a.none then
      res[i] = nil
    else
      res[i] = a
    end
  end
  return res, n
end

local BINOPS = {
  ['+'] = function(a, b) return a + b end, ['-'] = function(a, b) return a - b end,
  ['*'] = function(a, b) return a * b end, ['/'] = function(a, b) return a / b end,
  ['^'] = function(a, b) return a ^ b end,
}

-- Runs the case; returns the list of results (and self for in-place) or raises.
local function call(c, ins)
  local args, n = resolve(c.args or {}, ins)
  if c.call == 'method' or c.call == 'inplace' then
    local self = ins[1]
    local f = self[c.op]
    if f == nil then return nil, 'missing' end
    local r = {f(self, unpack(args, 1, n))}
    if c.call == 'inplace' then return {self} end
    return r
  elseif c.call == 'function' then
    local f = em[c.op]
    if f == nil then return nil, 'missing' end
    return {f(unpack(args, 1, n))}
  elseif c.op == 'unm' then
    return {-args[1]}
  else
    return {BINOPS[c.op](args[1], args[2])}
  end
end

local function shape_of(x)
  if type(x) == 'number' or type(x) == 'boolean' then return {} end
  local s = {}
  for i, v in ipairs(x.shape) do s[i] = tonumber(v) end
  return s
end

local function fmt_shape(s) return '[' .. table.concat(s, ',') .. ']' end

-- Compares one result with its expected spec; returns nil or what differs.
local function compare(got, want, atol, rtol, what)
  if type(got) ~= 'number' and type(got) ~= 'boolean' and
     (type(got) ~= 'table' and type(got) ~= 'cdata' and type(got) ~= 'userdata') then
    return ('%s: got a %s'):format(what, type(got))
  end
  local gs = shape_of(got)
  if not H.deep_eq(gs, want.shape) then
    return ('%s: shape %s, want %s'):format(what, fmt_shape(gs), fmt_shape(want.shape))
  end
  if type(got) ~= 'number' and type(got) ~= 'boolean' and got.dtype ~= want.dtype then
    return ('%s: dtype %s, want %s'):format(what, tostring(got.dtype), want.dtype)
  end
  local g = H.flat(got)
  if #g ~= #want.data then
    return ('%s: %d values, want %d'):format(what, #g, #want.data)
  end
  for i = 1, #g do
    local x, w = g[i], want.data[i]
    local ok
    if w ~= w then ok = x ~= x
    elseif w == math.huge or w == -math.huge then ok = x == w
    else ok = math.abs(x - w) <= atol + rtol * math.abs(w) end
    if not ok then
      return ('%s: element %d is %.9g, want %.9g (atol %g, rtol %g)'):format(
        what, i, x, w, atol, rtol)
    end
  end
end

local function unsupported(msg)
  msg = tostring(msg):lower()
  return msg:find('not implemented', 1, true) or msg:find('unsupported', 1, true) or
         msg:find('not supported', 1, true)
end

local current
for idx, c in ipairs(cases) do
  if c.group ~= current then
    H.group(c.group)
    current = c.group
  end
  local ok, err = pcall(function()
    local ins, bases = {}, {}
    for i, spec in ipairs(c.inputs) do ins[i], bases[i] = make(spec) end
    local res, why = call(c, ins)
    if why == 'missing' then
      if c.optional then return 'skip' end
      error(('ember has no %s %s'):format(c.call == 'function' and 'function em.' or 'method',
                                         c.op))
    end
    local tol = TOL[c.dtype] or {0, 0}
    local atol, rtol = c.atol or tol[1], c.rtol or tol[2]
    if #res < #c.expected then
      return ('%d results, want %d'):format(#res, #c.expected)
    end
    for i, want in ipairs(c.expected) do
      local d = compare(res[i], want, atol, rtol, #c.expected > 1 and ('result ' .. i) or 'result')
      if d then return d end
    end
    if c.expected_base then
      local d = compare(bases[1], c.expected_base, atol, rtol, 'base tensor')
      if d then return d end
    end
  end)
  if not ok and c.optional and unsupported(err) then
    H.skip(c.name .. ': ' .. tostring(err))
  elseif ok and err == 'skip' then
    H.skip(c.name .. ': not in this build')
  elseif not ok then
    H.check(false, ('case %d, %s: error: %s'):format(idx, c.name, tostring(err)))
  else
    H.check(err == nil, ('case %d, %s: %s'):format(idx, c.name, tostring(err)))
  end
end

H.done()
