--[[
ember.data.transforms -- em.data.T: constructors of the C transforms
(core/data/transforms*.c). A transform is a cdata box holding one reference to
its C object; ds:map(T) hands it to the pipeline, where it runs in the loader's
worker threads on field 1 of each sample (the image). A transform may also be
called on a tensor directly, T.hflip(1)(x), which is what tests and the REPL
use; random ones then take an optional {seed, index}.
]]
local ffi = require 'ffi'
local core = require 'ember.ffi'
require 'ember.tensor'
local C, S, wrap, raise = core.C, core.S, core.wrap, core.raise

local T = {}
ffi.cdef [[ typedef struct em_tbox { em_transform *_h; } em_tbox; ]]
local tout = ffi.new('em_transform*[1]')
local fields = ffi.new('em_tensor*[4]')
local box_t

local release = require('ember.data')._releaser(C.em_transform_release)

local function new()
  local b = box_t(tout[0])
  tout[0] = nil
  return require('ember.data')._track(b, release)
end

local function check(st) if st ~= 0 then core.fail() end return new() end

local function int(op, name, v, lo)
  if type(v) ~= 'number' or v % 1 ~= 0 or v < (lo or 0) then
    raise(('%s: %s must be an integer >= %d, got %s'):format(op, name, lo or 0, tostring(v)))
  end
  return v
end

-- size or {h, w} -> h, w
local function hw(op, a, b)
  if type(a) == 'table' then a, b = a[1], a[2] end
  if b == nil then b = a end
  return int(op, 'height', a, 1), int(op, 'width', b, 1)
end

-- The C handle of a transform argument.
function T.handle(op, t)
  if ffi.istype(box_t, t) and t._h ~= nil then return t._h end
  raise(('%s: expected a transform (em.data.T.*) or a Lua function, got %s'):format(op,
    core.kind(t)))
end

function T.to_float() return check(C.em_transform_to_float(S, tout)) end

local function numbers(op, name, v)
  if type(v) == 'number' then return { v } end
  if type(v) ~= 'table' or #v == 0 then raise(('%s: %s must be a number or a table of numbers'):format(op, name)) end
  for i = 1, #v do
    if type(v[i]) ~= 'number' then raise(('%s: %s[%d] is not a number'):format(op, name, i)) end
  end
  return v
end

function T.normalize(mean, std)
  mean, std = numbers('normalize', 'mean', mean), numbers('normalize', 'std', std)
  if #mean ~= #std then
    raise(('normalize: %d means but %d stds'):format(#mean, #std))
  end
  local m, s = ffi.new('double[?]', #mean, mean), ffi.new('double[?]', #std, std)
  return check(C.em_transform_normalize(S, m, s, #mean, tout))
end

function T.random_crop(size, o)
  local h, w = hw('random_crop', size)
  local padding = o and o.padding or 0
  return check(C.em_transform_random_crop(S, h, w, int('random_crop', 'padding', padding), tout))
end

function T.center_crop(size)
  local h, w = hw('center_crop', size)
  return check(C.em_transform_center_crop(S, h, w, tout))
end

function T.resize(h, w)
  h, w = hw('resize', h, w)
  return check(C.em_transform_resize(S, h, w, tout))
end

function T.hflip(p)
  p = p == nil and 0.5 or p
  if type(p) ~= 'number' or p < 0 or p > 1 then raise('hflip: p must be a probability in [0, 1]') end
  return check(C.em_transform_hflip(S, p, tout))
end

function T.cutout(size)
  return check(C.em_transform_cutout(S, int('cutout', 'size', size, 1), tout))
end

function T.compose(list)
  if type(list) ~= 'table' then raise('compose: expected a table of transforms') end
  local hs = ffi.new('em_transform*[?]', math.max(#list, 1))
  for i = 1, #list do hs[i - 1] = T.handle('compose', list[i]) end
  return check(C.em_transform_compose(S, hs, #list, tout))
end

box_t = ffi.metatype('em_tbox', {
  __index = {
    name = function(self) return ffi.string(C.em_transform_name(self._h)) end,
  },
  -- t(x[, {seed, index}]) applies the transform to one tensor now.
  __call = function(self, x, o)
    fields[0] = core.H(x, 'transform', 1)
    C.em_tensor_retain(fields[0])
    local st = C.em_transform_apply(S, self._h, fields, 1, o and o.seed or 0, o and o.index or 0)
    local h = fields[0]
    fields[0] = nil
    if st ~= 0 then
      if h ~= nil then C.em_tensor_release(h) end
      core.fail()
    end
    return wrap(h)
  end,
  __gc = release,
  __tostring = function(self) return 'transform(' .. ffi.string(C.em_transform_name(self._h)) .. ')' end,
})

return T
