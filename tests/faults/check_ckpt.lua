--[[
check_ckpt.lua -- is the checkpoint that train.lua's replica 0 left whole?

  ember check_ckpt.lua PATH

Loads PATH into a fresh model and optimizer of train.lua's shapes and checks
that the parameters sum to the `sum` saved beside them (computed before the
save, in float64, so only the same bytes give the same sum). Prints
"ckpt-ok step N" or "ckpt-bad: WHY" and exits non-zero when bad.
]]
local path = assert(arg[1], 'usage: ember check_ckpt.lua PATH')
local nn = em.nn
local model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 8))
local opt = em.optim.SGD(model:parameters(), { lr = 0.01, momentum = 0.9 })
local ok, rest = pcall(em.checkpoint.load, path, { model = model, optimizer = opt })
if not ok then
  print('ckpt-bad: ' .. tostring(rest))
  os.exit(1)
end
local t = 0
for _, p in ipairs(model:parameters()) do t = t + p:double():sum():item() end
local moments = 0
for _ in pairs(opt.state) do moments = moments + 1 end
if type(rest.step) ~= 'number' or rest.step < 1 then
  print('ckpt-bad: no step in the checkpoint')
elseif t ~= rest.sum then
  print(('ckpt-bad: the parameters sum to %.17g, the checkpoint says %.17g'):format(t, rest.sum))
elseif moments ~= 4 then
  print(('ckpt-bad: momentum buffers for %d of 4 parameters'):format(moments))
else
  print('ckpt-ok step ' .. rest.step)
  os.exit(0)
end
os.exit(1)
