--[[
bench_jpeg_scale.lua -- reduced JPEG decode in image_folder: 40 photo-like
1024x768 JPEGs (quality 90, made here once with ember and reused), each read by
image_folder{size = N} on this one thread, for N = 64 and 224:
  - full: full_decode = true, the whole image decoded, then the bilinear resize;
  - reduced: the default, decoded at the smallest DCT scale n/8 that still covers
    N x N (1/8 -> 128x96 for 64, 3/8 -> 384x288 for 224), then the same resize.
Prints images/s of both and the speed-up (reduced / full) per size; the PyTorch
twin (bench_jpeg_scale.py) times PIL the same way: open, convert('RGB'), resize
bilinear to N x N, as a uint8 tensor -- without draft() for the full names, with
draft('RGB', (N, N)) (PIL's own DCT scaling) for the reduced ones.

  ember tests/bench/bench_jpeg_scale.lua      (or make bench)
]]
local dir = debug.getinfo(1, 'S').source:sub(2):match('(.*/)')
local B = dofile(dir .. 'common.lua')
local em = B.em

local COUNT, W, H = 40, 1024, 768
local root = os.getenv('EMBER_BENCH_JPEGS_LARGE')
if not root or root == '' then
  local tmp = os.getenv('TMPDIR')
  root = (tmp and tmp ~= '' and tmp or '/tmp') .. '/ember-bench-jpegs-1024'
end
local marker = ('%d %dx%d'):format(COUNT, W, H)

local function complete()
  local f = io.open(root .. '/.complete', 'r')
  if not f then return false end
  local s = f:read('*a')
  f:close()
  return s:match('^' .. marker) ~= nil
end

-- Smooth gradients and soft blobs per channel plus a little noise: compresses
-- and decodes like a photo (a pure gradient would be unrealistically cheap).
local function photo(seed)
  em.manual_seed(seed)
  local yy = em.arange(0, H):double():div(H):view(H, 1):expand(H, W)
  local xx = em.arange(0, W):double():div(W):view(1, W):expand(H, W)
  local planes = {}
  for c = 1, 3 do
    local r = em.rand(3, { dtype = 'float64' }):totable()
    local p = (xx - 0.5) * (r[1] * 240 - 120) + (yy - 0.5) * (r[2] * 240 - 120) + (40 + r[3] * 175)
    planes[c] = p
  end
  for _ = 1, 5 do
    local r = em.rand(6, { dtype = 'float64' }):totable()
    local rad = 0.05 + r[3] * 0.25
    local blob = (((xx - r[1]) ^ 2 + (yy - r[2]) ^ 2) / (-2 * rad * rad)):exp()
    for c = 1, 3 do planes[c] = planes[c] + blob * (r[3 + c] * 180 - 90) end
  end
  local img = em.stack(planes, 1) + em.randn({ 3, H, W }, { dtype = 'float64' }) * 6
  return img:clamp(0, 255):byte()
end

if not complete() then
  os.execute(("rm -rf '%s' && mkdir -p '%s/a'"):format(root, root))
  for i = 1, COUNT do
    em.data.save_image(photo(i), ('%s/a/%03d.jpg'):format(root, i), { quality = 90 })
  end
  local f = assert(io.open(root .. '/.complete', 'w'))
  f:write(marker, '\n')
  f:close()
end

-- images/s reading every image of ds on this thread (median of 3 passes, after one
-- pass that warms the page cache)
local function rate(ds)
  local n = #ds
  local function pass() for i = 1, n do local _ = ds[i] end end
  pass()
  local s = B.time(function() pass() end, 1, 3)
  return n / s
end

for _, N in ipairs({ 64, 224 }) do
  local full = rate(em.data.image_folder(root, { size = N, full_decode = true }))
  local reduced = rate(em.data.image_folder(root, { size = N }))
  B.result(('jpeg_full_%d'):format(N), full, 'images/s', 'higher', '1024x768 full decode + resize')
  B.result(('jpeg_reduced_%d'):format(N), reduced, 'images/s', 'higher', 'reduced DCT decode + resize')
  B.result(('jpeg_speedup_%d'):format(N), reduced / full, 'x', 'higher', 'reduced / full')
  collectgarbage()
end
