--[[
ember -- `local em = require 'ember'`.

Assembles the `em` table from the submodules: ember.ffi (C declarations,
library, state, errors), ember.handles (tensor lifetime), ember.tensor (the
tensor type), ember.create, ember.math, ember.reduce, ember.shape, ember.index,
and ember.format (loaded at the first print).

Loading is lazy, for start-up time: requiring ember returns an empty table
whose first field access loads the core (the cdefs, the em_state, all tensor
functions) -- `ember -e ''`, which preloads `em`, pays none of it. Larger
packages (em.nn, em.optim, em.data, ...) load on first use: em.<name> requires
ember.<name> when such a module exists.

Every tensor method that is not in-place also exists as a function taking the
tensor first (em.exp(t), em.sum(t, 1), em.transpose(t, 1, 2), ...).
]]
local em = {}

-- Names that are methods but make no sense as em.<name>(t, ...) functions.
local not_functions = { item = true, totable = true, tolist = true, size = true, dim = true,
  numel = true, stride = true, data_ptr = true, storage_offset = true, element_size = true,
  ndimension = true, nelement = true, type = true, cpu = true, cuda = true, to = true,
  float = true, double = true, half = true, int = true, long = true, byte = true,
  bool = true, bfloat16 = true, same_storage = true, contiguous = true, where = true }

local function load_core()
  local ffi = require 'ffi'
  local core = require 'ember.ffi'
  local handles = require 'ember.handles'
  local Tensor = require 'ember.tensor'
  local C, S = core.C, core.S

  for _, name in ipairs({ 'create', 'math', 'reduce', 'index', 'ops_more', 'einsum', 'multinomial' }) do
    for k, v in pairs(require('ember.' .. name)) do em[k] = v end
  end
  require 'ember.shape'
  require('ember.amp.policy').install(Tensor, em)   -- autocast's op lists
  require('ember.layout').install(em)
  local autograd = require 'ember.autograd'

  for k, f in pairs(Tensor) do
    if rawget(em, k) == nil and not not_functions[k] and not k:match('_$') then
      em[k] = function(t, ...)
        if not ffi.istype(core.box_t, t) then
          core.raise(('%s: expected a tensor as argument 1, got %s'):format(k, core.kind(t)))
        end
        return f(t, ...)
      end
    end
  end

  -- -- Types and facts ---------------------------------------------------------------
  em.Tensor = Tensor            -- the method table: add methods here
  em.autograd = autograd
  em.no_grad, em.enable_grad = autograd.no_grad, autograd.enable_grad
  em.set_grad_enabled, em.is_grad_enabled = autograd.set_grad_enabled, autograd.is_grad_enabled
  em.float32, em.float64, em.float16, em.bfloat16 = 'float32', 'float64', 'float16', 'bfloat16'
  em.int32, em.int64, em.uint8, em.bool = 'int32', 'int64', 'uint8', 'bool'
  em.float, em.double, em.half, em.long, em.int = 'float32', 'float64', 'float16', 'int64', 'int32'

  function em.is_tensor(x) return ffi.istype(core.box_t, x) end

  em.version = ffi.string(C.em_version())
  em._VERSION = em.version

  function em.build_info() return ffi.string(C.em_build_info()) end
  function em.get_num_threads() return C.em_get_num_threads(S) end
  function em.set_num_threads(n)
    if type(n) ~= 'number' then
      core.raise('set_num_threads: expected a number, got ' .. core.kind(n))
    end
    core.check(C.em_set_num_threads(S, n))
  end

  -- Which CPU kernels serve conv2d and matmul: em.cpu_kernels() reads the mode,
  -- em.cpu_kernels(mode) sets it ('auto', 'ours', 'onednn', 'onednn-blocked') and
  -- returns the one before; em.cpu_kernels_info() says which library serves what.
  function em.cpu_kernels(mode)
    local before = ffi.string(C.em_cpu_kernels_get())
    if mode ~= nil and C.em_cpu_kernels_set(tostring(mode)) ~= 0 then
      core.raise("cpu_kernels: mode must be 'auto', 'ours', 'onednn' or 'onednn-blocked', got "
                 .. tostring(mode))
    end
    return before
  end
  function em.cpu_kernels_info()
    local buf = ffi.new('char[4096]')
    core.check(C.em_cpu_kernels_info(buf, 4096))
    return ffi.string(buf)
  end

  -- Bytes held by tensor storages (live and not yet collected), and the peak.
  function em.memory_allocated() return tonumber(C.em_memory_allocated(S)) end
  function em.memory_peak() return tonumber(C.em_memory_peak(S)) end
  -- The copies run so far on every device (a counter: a region that must not copy
  -- leaves it where it was, however many ops it ran).
  function em.copy_count() return tonumber(C.em_copy_count(S)) end

  -- One device's memory: {allocated, peak, reserved, capacity} in bytes, for
  -- 'cpu' (the default), 'meta' and 'cuda:N'; and a new peak from now on.
  local mstats = ffi.new('em_device_memory_stats')
  function em.memory_stats(device)
    core.check(C.em_device_memory(S, core.device_id(device, 'memory_stats'), mstats))
    return { allocated = tonumber(mstats.allocated), peak = tonumber(mstats.peak),
             reserved = tonumber(mstats.reserved), capacity = tonumber(mstats.capacity) }
  end
  function em.reset_peak_memory_stats(device)
    core.check(C.em_device_reset_peak(S, core.device_id(device, 'reset_peak_memory_stats')))
  end
  -- em.set_memory_limit(bytes | '256M' | nil), and EMBER_MEMORY_LIMIT applied now.
  require('ember.memlimit').install(em)

  -- Wall-clock seconds from a monotonic clock, for timing loops (os.clock counts
  -- CPU time of every thread, which overstates a multi-threaded step).
  local libc = core.process
  local ts = ffi.new('em_host_timespec')
  function em.clock()
    libc.em_host_clock_gettime(libc.EM_HOST_CLOCK_MONOTONIC, ts)
    return tonumber(ts.tv_sec) + tonumber(ts.tv_nsec) * 1e-9
  end

  -- Run a full collection now and hand the memory of dead tensors back to C.
  em.collect = handles.collect

  -- em.compile(fn[, opts]): a step captured once, replayed after (ember.compile).
  function em.compile(fn, opts) return require('ember.compile').compile(fn, opts) end

  -- Saving (ember.save, loaded at first use; em.checkpoint is a submodule).
  function em.save(...) return require('ember.save').save(...) end
  function em.load(...) return require('ember.save').load(...) end

  -- The C state of this Lua state (for C code called through the FFI), the
  -- handle of a tensor (borrowed: valid while t lives), and a tensor made from
  -- a handle the caller owns one reference to.
  function em.state() return S end
  function em.handle(t) return core.H(t, 'handle', 1) end
  function em.from_handle(h)
    if type(h) ~= 'cdata' or h == nil then core.raise('from_handle: expected an em_tensor*') end
    return core.wrap(ffi.cast('em_tensor *', h))
  end
end

-- -- Submodules on demand ------------------------------------------------------------
local internal = { ffi = true, cdefs = true, handles = true, tensor = true, create = true,
  math = true, reduce = true, shape = true, index = true, format = true, init = true,
  autograd = true }

local function submodule(t, k)
  if type(k) ~= 'string' or internal[k] or not k:match('^[%a_][%w_]*$') then return nil end
  local name = 'ember.' .. k
  if package.loaded[name] == nil and not package.searchpath(name, package.path) then
    return nil
  end
  local m = require(name)
  rawset(t, k, m)
  return m
end

local loaded = false
setmetatable(em, {
  __index = function(t, k)
    if not loaded then
      load_core()
      loaded = true
      local v = rawget(t, k)
      if v ~= nil then return v end
    end
    return submodule(t, k)
  end,
})

return em
