--[[
ember.cuda -- the CUDA devices (API.md, "em.cuda"): is_available, device_count,
synchronize, memory_stats, empty_cache, emulated, allow_tf32, why_not.

The devices are the GPUs (the CUDA runtime and cuBLASLt, loaded when first
used) or, with EMBER_CUDA_EMULATE=N[:MB], N emulated devices whose memory,
streams and kernels are the CUDA backend's own code running on the CPU
(kernels/). Tensors move with t:cuda([i]), t:to('cuda:1') and t:cpu(); ops are
queued on the device's stream, and reading a value (item, totable, printing,
cpu) waits for the work that computes it. The nn ops on cuDNN, the fused
optimizers and CUDA graphs are issue 11: until then they say so, naming the op
and the device.
]]
local ffi = require 'ffi'
local core = require 'ember.ffi'
local C, S = core.C, core.S

local M = {}

local function device_arg(op, i)
  if i == nil then return -1 end
  if type(i) == 'string' then return core.device_id(i, op) end
  if type(i) ~= 'number' or i % 1 ~= 0 or i < 0 then
    core.raise(('%s: device must be a number >= 0 or \'cuda:N\', got %s'):format(op, tostring(i)))
  end
  return i
end

function M.device_count() return C.em_cuda_device_count(S) end
function M.is_available() return C.em_cuda_device_count(S) > 0 end
function M.emulated() return C.em_cuda_emulated(S) ~= 0 end
-- Why there is no device (nil when there is one).
function M.why_not()
  if C.em_cuda_device_count(S) > 0 then return nil end
  return ffi.string(C.em_errmsg(S))
end

function M.synchronize(i)
  if C.em_cuda_synchronize(S, device_arg('cuda.synchronize', i)) ~= 0 then core.fail() end
end

function M.memory_stats(i)
  local m = ffi.new('em_cuda_memory')
  local dev = i == nil and 0 or device_arg('cuda.memory_stats', i)
  if C.em_cuda_memory_stats(S, dev, m) ~= 0 then core.fail() end
  return { allocated = tonumber(m.allocated), reserved = tonumber(m.reserved),
           peak = tonumber(m.peak_allocated), capacity = tonumber(m.capacity),
           allocations = tonumber(m.num_allocs), frees = tonumber(m.num_frees),
           cache_hits = tonumber(m.cache_hits), oom_retries = tonumber(m.oom_retries) }
end

-- get_device_properties(i): {name, major, minor, multi_processor_count,
-- total_memory, emulated}, as torch.cuda.get_device_properties.
function M.get_device_properties(i)
  local p = ffi.new('em_cuda_props')
  local dev = i == nil and 0 or device_arg('cuda.get_device_properties', i)
  if C.em_cuda_device_props(S, dev, p) ~= 0 then core.fail() end
  return { name = ffi.string(p.name), major = p.major, minor = p.minor,
           multi_processor_count = p.multiprocessors,
           total_memory = tonumber(p.total_memory), emulated = p.emulated ~= 0 }
end

-- Releases the tensors Lua no longer reaches, then gives the device's unused
-- cached memory back.
function M.empty_cache(i)
  require('ember.handles').collect()
  if C.em_cuda_empty_cache(S, device_arg('cuda.empty_cache', i)) ~= 0 then core.fail() end
end

-- allow_tf32([on]): whether float32 matmuls may use TF32 tensor cores (off by
-- default, as PyTorch's torch.backends.cuda.matmul.allow_tf32). With an
-- argument, sets it; returns the setting in force before the call.
function M.allow_tf32(on)
  local was = C.em_cuda_allow_tf32(S) ~= 0
  if on ~= nil then
    if type(on) ~= 'boolean' then
      core.raise(('cuda.allow_tf32: expected true or false, got %s'):format(tostring(on)))
    end
    C.em_cuda_set_allow_tf32(S, on and 1 or 0)
  end
  return was
end

function M.graph()
  core.raise('cuda.graph: CUDA graphs are not built yet (issue 11)')
end

return M
