--[[
ember.cuda -- the CUDA devices (API.md, "em.cuda"): is_available, device_count,
set_device, current_device, synchronize, memory_stats, empty_cache, emulated,
allow_tf32, why_not.

The devices are the GPUs (the CUDA runtime and cuBLASLt, loaded when first
used) or, with EMBER_CUDA_EMULATE=N[:MB], N emulated devices whose memory,
streams and kernels are the CUDA backend's own code running on the CPU
(kernels/). Tensors move with t:cuda([i]), t:to('cuda:1') and t:cpu(); ops are
queued on the device's stream, and reading a value (item, totable, printing,
cpu) waits for the work that computes it. nn ops run on cuDNN and ember's kernels,
optimizers as fused multi-tensor kernels, and captured steps as CUDA graphs; an op
without a device kernel is an error naming the op and the device.
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

-- 'cuda' alone names the current device, as after torch.cuda.set_device: 0 by
-- default, a replica's own GPU under --devices or mpirun (its strategy sets it).
function M.set_device(i)
  if type(i) == 'string' then
    local id = core.device_id(i, 'cuda.set_device')
    if id < 0 then core.raise(("cuda.set_device: '%s' is not a CUDA device"):format(i)) end
    i = id
  end
  if type(i) ~= 'number' or i % 1 ~= 0 then
    core.raise(('cuda.set_device: device must be a number >= 0 or \'cuda:N\', got %s')
      :format(tostring(i)))
  end
  if C.em_cuda_set_device(S, i) ~= 0 then core.fail() end
end
function M.current_device() return C.em_cuda_current_device(S) end
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

-- graph(fn[, device]): captures the device work of fn -- which runs once, for its
-- Lua side only: nothing it queues runs then -- and returns g, a callable: g()
-- launches all of the captured work with one call and returns what fn returned
-- (the same tensors each time, rewritten by each launch). The tensors fn reads
-- (parameters, static inputs) must stay alive; copy new data into the inputs
-- before g(). Scalars are those of the capture. Reading a value, copies from or
-- to the CPU and between devices can't be captured: fn fails naming them.
-- g:free() lets go of the graph's memory now (else the collector does).
local graph_ct = ffi.typeof('em_cuda_graph*[1]')
-- The graphs not freed yet, by address: whichever comes first -- g:free(), the
-- collector, or the state's close -- frees a graph, and only once (at lua_close
-- the collector may reach a graph before or after the close hook).
local live = {}
local function release(p)
  local a = tonumber(ffi.cast('uintptr_t', p))
  if live[a] and not core.closed then
    live[a] = nil
    C.em_cuda_graph_free(S, p)
  end
end
local Graph = {}
Graph.__index = Graph
function Graph:free()
  if self.g ~= nil then
    release(ffi.gc(self.g, nil))
    self.g = nil
  end
end
function Graph:__call()
  if self.g == nil then core.raise('cuda.graph: this graph was freed') end
  if C.em_cuda_graph_launch(S, self.g) ~= 0 then core.fail() end
  return unpack(self.results, 1, self.n)
end

-- is_capturing(): whether a graph is being captured (its fn is running).
function M.is_capturing() return C.em_cuda_capturing(S) >= 0 end

function M.graph(fn, i)
  if type(fn) ~= 'function' then
    core.raise(('cuda.graph: expected a function to capture, got %s'):format(core.kind(fn)))
  end
  local dev = i == nil and 0 or device_arg('cuda.graph', i)
  if C.em_cuda_graph_begin(S, dev) ~= 0 then core.fail() end
  local res = { pcall(fn) }
  local box = graph_ct()
  local st = C.em_cuda_graph_end(S, box)
  if not res[1] then                     -- fn's own error says most (the op it hit)
    core.raise('cuda.graph: ' .. tostring(res[2]))
  end
  if st ~= 0 then core.fail() end
  live[tonumber(ffi.cast('uintptr_t', box[0]))] = true
  return setmetatable({ g = ffi.gc(box[0], release),
                        results = { unpack(res, 2, table.maxn(res)) },
                        n = table.maxn(res) - 1 }, Graph)
end

table.insert(core.on_close, function()
  for a in pairs(live) do release(ffi.cast('em_cuda_graph*', a)) end
end)

return M
