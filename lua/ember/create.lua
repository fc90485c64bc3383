--[[
ember.create -- making tensors: em.tensor from numbers and nested tables, the
filled creators (zeros, ones, full, empty, eye, arange), random ones (rand,
randn, randint) and the *_like forms, plus the RNG seed.

Shapes come as varargs or one table, an options table {dtype=, device=} may
follow (a bare dtype name is accepted too). dtype inference follows torch:
em.tensor and em.full give int64 for integers, float32 for any non-integer,
bool for booleans; em.arange gives int64 when start, stop and step are all
integers.
]]
local ffi = require 'ffi'
local core = require 'ember.ffi'
require 'ember.tensor'
local C, S, wrap, fail, raise, kind = core.C, core.S, core.wrap, core.fail, core.raise, core.kind
local FLOAT32, INT64, BOOL = C.EM_FLOAT32, C.EM_INT64, C.EM_BOOL
local box_t, istype = core.box_t, ffi.istype
local out = core.out
local parse_shape, parse_opts = core.parse_shape, core.parse_opts

local M = {}

-- -- Helpers ---------------------------------------------------------------------
-- The C ops the creators call name themselves in their messages; the user called
-- op, so the message names op (em.zeros(2, {device = 'cuda:1'}) blames zeros).
local internal = { full = true, empty = true, to = true, uniform_ = true, normal_ = true,
  randint_ = true, eye = true, arange = true, from_data = true, clone = true }
local function fail_as(op)
  local msg = core.errmsg()
  pcall(fail)   -- what fail does besides raising (a collection under memory pressure)
  local head, rest = msg:match('^([%w_]+): (.*)$')
  if head and head ~= op and internal[head] then msg = op .. ': ' .. rest end
  local n = msg:match('no device cuda:%d+ %(this state has (%d+)%)$')
  if n then
    msg = msg .. (n == '0' and '; create it on the cpu'
      or ("; pass device = 'cuda' (the current device) or 'cuda:0'" ..
        (n ~= '1' and (" .. 'cuda:%d'"):format(n - 1) or '')))
  end
  raise(msg)
end

local function empty(op, n, shape, dt, dev)
  if C.em_empty(S, shape, n, dt, dev, out) ~= 0 then
    fail_as(op)
  end
  return wrap(out[0])
end

local function filled(op, value, ...)
  local n, opts, shape = parse_shape(op, false, ...)
  local dt, dev = parse_opts(op, opts, FLOAT32)
  if C.em_full(S, shape, n, value, dt, dev, out) ~= 0 then
    fail_as(op)
  end
  return wrap(out[0])
end

function M.zeros(...) return filled('zeros', 0, ...) end
function M.ones(...) return filled('ones', 1, ...) end

function M.empty(...)
  local n, opts, shape = parse_shape('empty', false, ...)
  local dt, dev = parse_opts('empty', opts, FLOAT32)
  return empty('empty', n, shape, dt, dev)
end

local function infer_scalar_dtype(v)
  if type(v) == 'boolean' then return BOOL end
  if v % 1 == 0 then return INT64 end
  return FLOAT32
end

function M.full(shape, value, opts)
  if type(shape) ~= 'number' and (type(shape) ~= 'table' or istype(box_t, shape)) then
    raise('full: expected a shape (table or number) as argument 1, got ' .. kind(shape))
  end
  local n, _, shp = parse_shape('full', false, shape)
  local v = core.number_of(value)
  if v == nil then raise('full: expected a number or boolean fill value, got ' .. kind(value)) end
  local dt, dev = parse_opts('full', opts, infer_scalar_dtype(value))
  if C.em_full(S, shp, n, v, dt, dev, out) ~= 0 then
    fail_as('full')
  end
  return wrap(out[0])
end

-- -- em.tensor -------------------------------------------------------------------------
-- Walk a nested table: check it is rectangular, count leaves, infer the dtype.
local function tensor_from_table(data, opts)
  local shape = {}
  local x = data
  while type(x) == 'table' and not istype(box_t, x) do
    shape[#shape + 1] = #x
    if #shape > core.MAXD then raise('tensor: more than 8 nested levels') end
    x = x[1]
    if x == nil then break end
  end
  local ndim = #shape
  local numel = 1
  for i = 1, ndim do numel = numel * shape[i] end
  local buf = ffi.new('double[?]', numel > 0 and numel or 1)
  local k, has_float, has_num, has_bool = 0, false, false, false
  local function walk(t, d, path)
    if #t ~= shape[d] then
      raise(('tensor: nested tables are not rectangular: %s has %d elements, expected %d')
        :format(path, #t, shape[d]))
    end
    for i = 1, shape[d] do
      local v = t[i]
      if d < ndim then
        if type(v) ~= 'table' or istype(box_t, v) then
          raise(('tensor: expected a table at %s[%d], got %s'):format(path, i, kind(v)))
        end
        walk(v, d + 1, path .. '[' .. i .. ']')
      else
        if type(v) == 'number' then
          has_num = true
          if v % 1 ~= 0 then has_float = true end
        elseif type(v) == 'boolean' then
          has_bool = true
          v = v and 1 or 0
        elseif istype(box_t, v) and tonumber(C.em_tensor_numel(v._h)) == 1 then
          local dt = core.dtype_of(v._h)
          if core.is_float[dt] then has_float = true end
          if dt == BOOL then has_bool = true else has_num = true end
          v = v:item()
          if type(v) == 'boolean' then v = v and 1 or 0 end
        elseif type(v) == 'cdata' and tonumber(v) then
          has_num = true
          v = tonumber(v)
        else
          raise(('tensor: expected a number or boolean at %s[%d], got %s'):format(path, i,
            kind(v)))
        end
        buf[k] = v
        k = k + 1
      end
    end
  end
  if ndim > 0 and numel > 0 then walk(data, 1, 'data') end
  local def = has_float and FLOAT32 or (has_num and INT64 or (has_bool and BOOL or FLOAT32))
  local dt, dev = parse_opts('tensor', opts, def)
  local shp = core.shape_buf2
  for i = 1, ndim do shp[i - 1] = shape[i] end
  if C.em_from_data(S, shp, ndim, dt, buf, C.EM_FLOAT64, out) ~= 0 then
    fail_as('tensor')
  end
  local t = wrap(out[0])
  if dev ~= -1 then
    -- Made on the device, then filled: a device that does not exist is named as such.
    if C.em_empty(S, shp, ndim, dt, dev, out) ~= 0 then fail_as('tensor') end
    local d = wrap(out[0])
    if C.em_copy_(S, d._h, t._h) ~= 0 then fail_as('tensor') end
    return d
  end
  return t
end

function M.tensor(data, opts)
  if istype(box_t, data) then
    local dt, dev = parse_opts('tensor', opts, core.dtype_of(data._h),
      C.em_tensor_device(data._h))
    if C.em_to(S, data._h, dt, dev, out) ~= 0 then fail_as('tensor') end
    local h = out[0]
    if h == data._h then  -- same dtype and device: em.tensor copies
      local st = C.em_clone(S, h, out)
      C.em_tensor_release(h)
      if st ~= 0 then fail_as('tensor') end
      h = out[0]
    end
    return wrap(h)
  end
  local v = core.number_of(data)
  if v ~= nil then
    local dt, dev = parse_opts('tensor', opts, infer_scalar_dtype(data))
    if C.em_full(S, nil, 0, v, dt, dev, out) ~= 0 then
      fail_as('tensor')
    end
    return wrap(out[0])
  end
  if type(data) ~= 'table' then
    raise('tensor: expected a number, a boolean, a nested table or a tensor, got ' .. kind(data))
  end
  return tensor_from_table(data, opts)
end

-- -- Ranges and eye --------------------------------------------------------------------
function M.arange(a, b, c, d)
  local args, opts = { a, b, c, d }, nil
  local nums = {}
  for i = 1, 4 do
    local v = args[i]
    if type(v) == 'number' then
      if opts then raise('arange: the options table must come last') end
      nums[#nums + 1] = v
    elseif type(v) == 'table' or type(v) == 'string' then
      opts = v
    elseif v ~= nil then
      raise(('arange: expected numbers, got %s as argument %d'):format(kind(v), i))
    end
  end
  local start, stop, step
  if #nums == 1 then start, stop, step = 0, nums[1], 1
  elseif #nums == 2 then start, stop, step = nums[1], nums[2], 1
  elseif #nums == 3 then start, stop, step = nums[1], nums[2], nums[3]
  else raise('arange: expected (stop), (start, stop) or (start, stop, step)') end
  local integral = start % 1 == 0 and stop % 1 == 0 and step % 1 == 0
  local dt, dev = parse_opts('arange', opts, integral and INT64 or FLOAT32)
  if C.em_arange(S, start, stop, step, dt, dev, out) ~= 0 then
    fail()
  end
  return wrap(out[0])
end

function M.eye(n, m, opts)
  if type(m) ~= 'number' then m, opts = nil, m end
  if type(n) ~= 'number' then raise('eye: expected a size, got ' .. kind(n)) end
  local dt, dev = parse_opts('eye', opts, FLOAT32)
  if C.em_eye(S, n, m or n, dt, dev, out) ~= 0 then
    fail()
  end
  return wrap(out[0])
end

-- -- Random ------------------------------------------------------------------------------
function M.rand(...)
  local n, opts, shape = parse_shape('rand', false, ...)
  local dt, dev = parse_opts('rand', opts, FLOAT32)
  local t = empty('rand', n, shape, dt, dev)
  if C.em_uniform_(S, t._h, 0, 1) ~= 0 then fail_as('rand') end
  return t
end

function M.randn(...)
  local n, opts, shape = parse_shape('randn', false, ...)
  local dt, dev = parse_opts('randn', opts, FLOAT32)
  local t = empty('randn', n, shape, dt, dev)
  if C.em_normal_(S, t._h, 0, 1) ~= 0 then fail_as('randn') end
  return t
end

-- randint(lo, hi, shape[, opts]) or randint(hi, shape[, opts]); hi exclusive.
function M.randint(lo, hi, shape, opts)
  if type(hi) == 'table' then lo, hi, shape, opts = 0, lo, hi, shape end
  if type(lo) ~= 'number' or type(hi) ~= 'number' then
    raise(('randint: expected (lo, hi, shape), got %s, %s, %s'):format(kind(lo), kind(hi),
      kind(shape)))
  end
  if type(shape) ~= 'table' and type(shape) ~= 'number' then
    raise('randint: expected a shape (table or number) after the bounds, got ' .. kind(shape))
  end
  local n, _, shp = parse_shape('randint', false, shape)
  local dt, dev = parse_opts('randint', opts, INT64)
  local t = empty('randint', n, shp, dt, dev)
  if C.em_randint_(S, t._h, lo, hi) ~= 0 then fail_as('randint') end
  return t
end

function M.manual_seed(n)
  if type(n) ~= 'number' and type(n) ~= 'cdata' then
    raise('manual_seed: expected a number, got ' .. kind(n))
  end
  C.em_manual_seed(S, n)
end

-- The RNG position, for checkpoints: {seed, offset}.
function M.get_rng_state()
  local a, b = ffi.new('uint64_t[1]'), ffi.new('uint64_t[1]')
  C.em_rng_get_state(S, a, b)
  return { seed = a[0], offset = b[0] }
end

function M.set_rng_state(st)
  if type(st) ~= 'table' then raise('set_rng_state: expected a table from get_rng_state') end
  C.em_rng_set_state(S, st.seed, st.offset)
end

-- -- *_like ------------------------------------------------------------------------------
local function like(op, t, opts)
  local h = core.H(t, op, 1)
  local dt, dev = parse_opts(op, opts, core.dtype_of(h), C.em_tensor_device(h))
  return C.em_tensor_ndim(h), C.em_tensor_sizes(h), dt, dev
end

-- A *_like result of a channels-last t is channels last too (torch's
-- preserve_format): r holds one value or iid draws, so the same storage seen
-- with NHWC strides is the answer, without a copy.
local function keep_format(t, r)
  local h = t._h
  if C.em_tensor_ndim(h) ~= 4 or C.em_tensor_is_channels_last(h) == 0 or
      C.em_tensor_is_contiguous(h) ~= 0 then
    return r
  end
  local sz = C.em_tensor_sizes(h)
  local st = ffi.new('int64_t[4]')
  st[1], st[3] = 1, sz[1]
  st[2] = sz[3] * sz[1]
  st[0] = sz[2] * st[2]
  if C.em_as_strided(S, r._h, sz, st, 4, 0, out) ~= 0 then fail() end
  return wrap(out[0])
end

function M.zeros_like(t, opts)
  local n, shape, dt, dev = like('zeros_like', t, opts)
  if C.em_full(S, shape, n, 0, dt, dev, out) ~= 0 then
    fail_as('zeros_like')
  end
  return keep_format(t, wrap(out[0]))
end

function M.ones_like(t, opts)
  local n, shape, dt, dev = like('ones_like', t, opts)
  if C.em_full(S, shape, n, 1, dt, dev, out) ~= 0 then
    fail_as('ones_like')
  end
  return keep_format(t, wrap(out[0]))
end

function M.full_like(t, value, opts)
  local n, shape, dt, dev = like('full_like', t, opts)
  local v = core.number_of(value)
  if v == nil then raise('full_like: expected a number fill value, got ' .. kind(value)) end
  if C.em_full(S, shape, n, v, dt, dev, out) ~= 0 then
    fail_as('full_like')
  end
  return keep_format(t, wrap(out[0]))
end

function M.empty_like(t, opts)
  local n, shape, dt, dev = like('empty_like', t, opts)
  return keep_format(t, empty('empty_like', n, shape, dt, dev))
end

function M.rand_like(t, opts)
  local n, shape, dt, dev = like('rand_like', t, opts)
  local r = empty('rand_like', n, shape, dt, dev)
  if C.em_uniform_(S, r._h, 0, 1) ~= 0 then fail_as('rand_like') end
  return keep_format(t, r)
end

function M.randn_like(t, opts)
  local n, shape, dt, dev = like('randn_like', t, opts)
  local r = empty('randn_like', n, shape, dt, dev)
  if C.em_normal_(S, r._h, 0, 1) ~= 0 then fail_as('randn_like') end
  return keep_format(t, r)
end

return M
