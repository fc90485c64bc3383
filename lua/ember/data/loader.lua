--[[
ember.data.loader -- ds:loader{...}: the Lua face of core/data/loader.c, plus
what the user sees while it runs: a progress bar per epoch, loader:stats(), and
a one-line warning when the training loop waits for data too long.

  local loader = ds:loader{workers = 2, prefetch = 4, progress = true,
                          device = 'cuda', pin_memory = true, device_prefetch = 1}
  for x, y in loader:epoch([n]) do ... end      -- epoch n (1, 2, ... by default)
  loader:stats() -> {epoch, batches, samples, samples_per_s, wait_s, wait_fraction,
                     elapsed_s, ready, and with a device or pin_memory: copies,
                     copies_done, copy_bytes, copy_s, copies_late, buffer_waits,
                     buffer_wait_s, pinned_buffers, pinned_bytes}
  loader:note('loss 0.31')                       -- text at the end of the bar
  loader:size()                                  -- batches per epoch
  loader:state_dict() / load_state_dict(t)       -- where it is, for em.checkpoint

The bar: redrawn in place at most 10 times a second when stdout is a terminal;
otherwise a plain line every 10 seconds (none for epochs shorter than that), so
logs stay readable; progress = n (seconds) sets that interval, false turns both off.

device and pin_memory (em_loader_to_device; core/data/feed.c): batches come out
on `device`. With pin_memory the workers assemble them in pinned buffers of a
pool the loader keeps, and each batch's copy runs on the device's copy stream
`device_prefetch` batches (default 1) ahead of its step; without it, a batch is
staged and copied when handed out. pin_memory with device 'cpu' gives pinned
CPU batches (their :cuda() is asynchronous). Without a CUDA device pin_memory
falls back to ordinary memory with a warning, as PyTorch's DataLoader does;
device = 'cuda' is an error there.
]]
local ffi = require 'ffi'
local core = require 'ember.ffi'
local C, S, wrap, raise = core.C, core.S, core.wrap, core.raise

ffi.cdef [[ typedef struct em_ldbox { em_loader *_h; } em_ldbox; ]]
-- The box's finalizer frees the loader (stopping its threads): see data.lua, Lifetime.
local free_loader = require('ember.data')._releaser(C.em_loader_free)
local ldbox_t = ffi.metatype('em_ldbox', { __gc = free_loader })
local WAIT_WARN = 0.10

local Loader = {}
Loader.__index = Loader

local function now() return require('ember').clock() end

local function is_tty()
  return core.process.em_host_isatty(1) == 1
end

local function nproc()
  local f = io.open('/proc/cpuinfo', 'r')
  if not f then return nil end
  local n = 0
  for line in f:lines() do if line:match('^processor') then n = n + 1 end end
  f:close()
  return n > 0 and n or nil
end

function Loader.new(ds, o)
  local data = require 'ember.data'
  local h = data._handle('loader', ds)
  local workers = o.workers or 0
  if type(workers) ~= 'number' or workers % 1 ~= 0 or workers < 0 then
    raise('loader: workers must be an integer >= 0, got ' .. tostring(workers))
  end
  local prefetch = o.prefetch or 0
  if type(prefetch) ~= 'number' or prefetch % 1 ~= 0 or prefetch < 0 then
    raise('loader: prefetch must be an integer >= 0, got ' .. tostring(prefetch))
  end
  local device = o.device or 'cpu'
  local dev = core.device_id(device, 'loader')
  if dev == -2 then
    raise("loader: device 'meta' has no data for batches; load on the CPU and move " ..
      "the model's inputs with :to('meta')")
  end
  if dev >= 0 then device = core.device_name(dev) end
  local pin = o.pin_memory and true or false
  local ahead = o.device_prefetch == nil and -1 or o.device_prefetch
  if type(ahead) ~= 'number' or ahead % 1 ~= 0 or ahead < -1 then
    raise('loader: device_prefetch must be an integer >= 0, got ' .. tostring(ahead))
  end
  if pin and dev < 0 and C.em_cuda_device_count(S) == 0 then
    io.stderr:write('ember: loader: pin_memory needs a CUDA device and there is none; '
      .. 'batches stay in ordinary memory\n')
    pin = false
  end
  local cfg = ffi.new('em_loader_config')
  C.em_loader_config_init(cfg)
  cfg.workers, cfg.prefetch = workers, prefetch
  local lout = ffi.new('em_loader*[1]')
  if C.em_loader_new(S, h, cfg, lout) ~= 0 then core.fail() end
  local box = data._track(ldbox_t(lout[0]), free_loader)
  if (dev >= 0 or pin) and C.em_loader_to_device(S, box._h, dev, pin and 1 or 0, ahead) ~= 0 then
    core.fail()
  end
  local self = setmetatable({
    _box = box, _l = box._h,
    ds = ds, workers = workers, device = device, pin_memory = pin,
    -- under a strategy only replica 0 draws progress, unless asked
    progress = o.progress == nil and require('ember.distribute').replica() == 0 or
      (o.progress ~= nil and o.progress ~= false), next_epoch = 1,
    interval = type(o.progress) == 'number' and o.progress or 10, warned = false, _note = '',
    nfields = tonumber(C.em_dataset_nfields(h)),
  }, Loader)
  return self
end

function Loader:size() return tonumber(C.em_dataset_len(self.ds._h)) end
function Loader:note(s) self._note = s and tostring(s) or '' end

local stats_buf = ffi.new('em_loader_stats')
function Loader:stats()
  C.em_loader_stats_get(self._l, stats_buf)
  local s = stats_buf
  local el = tonumber(s.elapsed_s)
  local r = {
    epoch = tonumber(s.epoch), batches = tonumber(s.items), samples = tonumber(s.samples),
    total_batches = tonumber(s.total_items), elapsed_s = el, wait_s = tonumber(s.wait_s),
    samples_per_s = el > 0 and tonumber(s.samples) / el or 0,
    wait_fraction = el > 0 and tonumber(s.wait_s) / el or 0, ready = tonumber(s.ready),
  }
  if self.device ~= 'cpu' or self.pin_memory then   -- since the loader was made
    r.copies, r.copies_done, r.copy_bytes = tonumber(s.copies), tonumber(s.copies_done),
      tonumber(s.copy_bytes)
    r.copy_s, r.copies_late = tonumber(s.copy_s), tonumber(s.copies_late)
    r.buffer_waits, r.buffer_wait_s = tonumber(s.buffer_waits), tonumber(s.buffer_wait_s)
    r.pinned_buffers, r.pinned_bytes = tonumber(s.pinned_buffers), tonumber(s.pinned_bytes)
  end
  return r
end

-- -- Progress ---------------------------------------------------------------------------
local function draw(self, st, final)
  if not self.progress then return end
  local t = now()
  if not final and t - self.last_draw < (self.tty and 0.1 or self.interval) then return end
  st = st or self:stats()
  if self.tty then
    self.last_draw = t
    if final then
      io.stdout:write('\r' .. (' '):rep(self.width or 0) .. '\r'); io.stdout:flush()
      core.stdout_line_open = false
      return
    end
    local w = 24
    local fill = st.total_batches > 0 and math.floor(w * st.batches / st.total_batches) or w
    local line = ('epoch %d [%s%s] %d/%d  %.0f samples/s  wait %2.0f%%  %s'):format(st.epoch,
      ('='):rep(fill), (' '):rep(w - fill), st.batches, st.total_batches, st.samples_per_s,
      100 * st.wait_fraction, self._note)
    self.width = math.max(self.width or 0, #line)
    io.stdout:write('\r' .. line .. (' '):rep(self.width - #line))
    io.stdout:flush()
    -- the bar's line stays open: the ember command ends it before it prints an
    -- error, so that the message starts on a line of its own (lua/host/main.c)
    core.stdout_line_open = true
  elseif not final then
    self.last_draw = t
    print(('epoch %d  %d/%d batches  %.0f samples/s  wait %.0f%%  %s'):format(st.epoch,
      st.batches, st.total_batches, st.samples_per_s, 100 * st.wait_fraction, self._note))
  end
end

local function warn_wait(self, st)
  if self.warned or st.wait_fraction <= WAIT_WARN or st.elapsed_s < 1 then return end
  self.warned = true
  local cores = nproc()
  local hint
  if self.workers == 0 then
    hint = 'start worker threads: ds:loader{workers = ' .. math.max(1, (cores or 2) - 1) .. '}'
  elseif cores and self.workers < cores then
    hint = ('raise workers (now %d, this machine has %d cores) or prefetch'):format(self.workers, cores)
  else
    hint = ('make the per-sample work cheaper (all %d cores already have a worker), or raise '
      .. 'prefetch if the wait comes in bursts'):format(cores or self.workers)
  end
  io.stderr:write(('ember: the loop waited for data %.0f%% of epoch %d (%.1f of %.1f s); %s\n')
    :format(100 * st.wait_fraction, st.epoch, st.wait_s, st.elapsed_s, hint))
end

-- -- Epochs -------------------------------------------------------------------------------
local outs = ffi.new('em_tensor*[4]')
local nout = ffi.new('int[1]')

function Loader:epoch(n)
  local first, r = 0, self.resume
  if n == nil then n = r and r.epoch or self.next_epoch end
  if type(n) ~= 'number' or n % 1 ~= 0 then raise('loader:epoch: n must be an integer epoch number') end
  if r and r.epoch == n then first = r.position end     -- a restored, interrupted epoch
  self.resume = nil
  self.next_epoch = n + 1
  if C.em_loader_start_at(S, self._l, n, first) ~= 0 then core.fail() end
  self.running = true
  self.tty = self.progress and is_tty()
  self.last_draw, self.width = now(), 0
  local l, nf = self._l, self.nfields
  local done = false
  return function()
    if done then return nil end
    if C.em_loader_next(S, l, outs, nout) ~= 0 then
      done, self.running = true, false
      draw(self, nil, true)
      core.fail()
    end
    if nout[0] == 0 then
      done, self.running = true, false
      local st = self:stats()
      draw(self, st, true)
      warn_wait(self, st)
      return nil
    end
    local prof = package.loaded['ember.profile']          -- a step mark (auto_step)
    if prof then prof.hooks.batch_out() end
    local x, y, z, w = wrap(outs[0]), nf > 1 and wrap(outs[1]) or nil,
      nf > 2 and wrap(outs[2]) or nil, nf > 3 and wrap(outs[3]) or nil
    if self.progress then draw(self, nil, false) end
    return x, y, z, w                                   -- on self.device already
  end
end

-- For em.checkpoint: the epoch under way and how many batches of it were taken,
-- or the next epoch. A restored loader's next epoch() goes on from there: the same
-- order (a function of seed and epoch), the batches already seen skipped without
-- being computed.
function Loader:state_dict()
  if self.running then
    local st = self:stats()
    return { next_epoch = self.next_epoch, epoch = st.epoch, position = st.batches }
  end
  return { next_epoch = self.next_epoch }
end

function Loader:load_state_dict(sd)
  if type(sd) ~= 'table' or type(sd.next_epoch) ~= 'number' then
    raise('loader:load_state_dict: expected a table from loader:state_dict()')
  end
  self.next_epoch = sd.next_epoch
  self.resume = sd.position and { epoch = sd.epoch, position = sd.position } or nil
end

-- Stops the workers now (they also stop when the loader is collected) and gives
-- the pinned buffers back once their copies ran; a later epoch() starts afresh.
function Loader:close() C.em_loader_stop(self._l) end

return Loader
