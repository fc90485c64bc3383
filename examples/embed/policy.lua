--[[
policy.lua -- the policy of examples/embed/game.c: a small MLP that picks the
agent's move, trained online while the game runs.

The host loads this file into its own LuaJIT state (ember is already loaded:
luaopen_ember put it in package.loaded and the global em) and calls the chunk
with {obs, actions, seed, fail_at, fail_in, fail_mode}. The chunk returns
  act(obs)        obs: light userdata, `obs` floats; returns the action 0..actions-1
  learn(teacher)  the teacher's action for what act() last saw
  info()          sum of |parameters| (a checksum) and the last training loss

Learning is imitation in the DAgger way: the agent walks with its own policy,
so it visits the states its own mistakes lead to, and each of them is labelled
with the teacher's move. Those pairs go into a ring buffer; every EVERY frames
one Adam step on a random batch of it. Cheap enough to run inside a frame.

Speed. act() is the part the game waits for: the observation is copied into a
tensor made once (no Lua tables, no new tensor for the input), the forward
runs under no_grad (nothing recorded for backward), and the argmax reads the
four logits in place.

fail_at/fail_in/fail_mode inject a script error (the host's --fail-at): from
frame fail_at on, in act or in learn (there after backward, before the
optimizer step, so the policy's parameters stay as they were), once or at
every call.
]]
local ffi = require 'ffi'
local em = require 'ember'

local cfg = ...
local OBS, NACT, HID = cfg.obs, cfg.actions, 64
local CAP, BATCH, EVERY = 4096, 64, 4

em.manual_seed(cfg.seed)
local net = em.nn.Sequential(em.nn.Linear(OBS, HID), em.nn.ReLU(), em.nn.Linear(HID, NACT))
local opt = em.optim.Adam(net:parameters(), {lr = 1e-3})
local loss_fn = em.nn.CrossEntropyLoss()

-- The replay buffer (labels 1-based, as cross_entropy wants them) and the input.
local X = em.zeros(CAP, OBS)
local Y = em.zeros({CAP}, {dtype = 'int64'})
local xbuf = ffi.cast('float *', X:data_ptr())
local ybuf = ffi.cast('int64_t *', Y:data_ptr())
local x = em.zeros(1, OBS)
local xin = ffi.cast('float *', x:data_ptr())
local OBS_BYTES = OBS * ffi.sizeof('float')

local frame, n, head, last_loss = 0, 0, 0, 0 / 0

-- The injected error (the host's --fail-at): once, at the first chance from
-- frame fail_at on, or at every call from then on.
local fired = false
local function inject(where)
  local at = cfg.fail_at or 0
  if at <= 0 or where ~= cfg.fail_in or frame < at then return end
  if cfg.fail_mode ~= 'always' then
    if fired then return end
    fired = true
  end
  error(('injected error in %s() at frame %d'):format(where, frame), 2)
end

local function forward(input) return net(input) end

local M = {}

function M.act(obs)
  frame = frame + 1
  ffi.copy(xin, obs, OBS_BYTES)
  inject('act')
  local logits = em.no_grad(forward, x)
  local p = ffi.cast('float *', logits:data_ptr())
  local best = 0
  for a = 1, NACT - 1 do
    if p[a] > p[best] then best = a end
  end
  return best
end

function M.learn(teacher)
  ffi.copy(xbuf + head * OBS, xin, OBS_BYTES)
  ybuf[head] = teacher + 1
  head = (head + 1) % CAP
  if n < CAP then n = n + 1 end
  if frame % EVERY ~= 0 or n < BATCH then
    if cfg.fail_mode == 'always' then inject('learn') end
    return
  end
  local idx = em.randint(1, n + 1, {BATCH})
  local xb, yb = X:index_select(1, idx), Y:index_select(1, idx)
  opt:zero_grad()
  local loss = loss_fn(net(xb), yb)
  loss:backward()
  inject('learn')          -- after backward, before the step: the policy stays as it was
  opt:step()
  last_loss = loss:item()
end

function M.info()
  local s = 0
  for _, p in ipairs(net:parameters()) do s = s + p:abs():sum():item() end
  return s, last_loss
end

return M
