--[[
bench_loader_jpeg.lua -- the loader on a folder of JPEGs: 5,000 256x256
RGB JPEGs in 10 class folders (made once by make_jpegs.py, then reused), read by
em.data.image_folder, shuffled, random_crop(224), hflip(0.5), to_float,
normalize(ImageNet mean/std), batches of 64, 2 loader workers; images/s over one
whole epoch after a warm-up of a few batches. The PyTorch twin
(bench_loader_jpeg.py) does the same with torchvision's ImageFolder and
transforms. With no folder and no Python to make one it prints a skip line.
]]
local dir = debug.getinfo(1, 'S').source:sub(2):match('(.*/)')
local B = dofile(dir .. 'common.lua')
local T = em.data.T

local root = os.getenv('EMBER_BENCH_JPEGS')
if not root or root == '' then
  local tmp = os.getenv('TMPDIR')
  root = (tmp and tmp ~= '' and tmp or '/tmp') .. '/ember-bench-jpegs'
end
local function complete()
  local f = io.open(root .. '/.complete', 'r')
  if not f then return false end
  local s = f:read('*a')
  f:close()
  return s:match('^5000 256') ~= nil
end
if not complete() then
  os.execute(("/usr/bin/python3 '%smake_jpegs.py' '%s' >/dev/null"):format(dir, root))
  if not complete() then
    print('SKIP loader_jpeg: no JPEG folder at ' .. root .. ' (make_jpegs.py needs python3, numpy, PIL)')
    return
  end
end

em.manual_seed(0)
local ds = em.data.image_folder(root)
local loader = ds:shuffle():map(T.compose{
  T.random_crop(224), T.hflip(0.5), T.to_float(),
  T.normalize({ 0.485, 0.456, 0.406 }, { 0.229, 0.224, 0.225 }),
}):batch(64):loader{ workers = 2, progress = false }

local i = 0
for _ in loader:epoch() do                   -- warm-up: threads, page cache, allocator
  i = i + 1
  if i == 5 then break end
end
local t0, n = em.clock(), 0
for x in loader:epoch() do n = n + x:size(1) end
B.result('loader_jpeg', n / (em.clock() - t0), 'images/s', 'higher', 'ratio >= 1.5')
