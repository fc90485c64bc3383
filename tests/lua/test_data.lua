--[[
test_data.lua -- the input pipeline's own logic (core/data/ dataset.c, sources.c,
stages.c, loader.c and lua/ember/data*.lua); file sources, transforms and
ds:map(fn) have their own test files.

  - in-memory and synthetic sources: values of ds[i], #ds, labels;
  - shuffle: a permutation per epoch, fixed by seed and epoch, different across
    epochs; batch (short last batch, drop_last), take, shard (disjoint and
    covering, padding by wrap-around or dropping the remainder);
  - the loader: identical batches for 0, 1 and 4 workers and any prefetch;
    zero-copy batches of consecutive rows; stats; breaking out of an epoch and
    starting another; an error in a worker raised in the consumer (every epoch
    after it still works); a loader collected mid-epoch stops its threads;
  - bad arguments name the op.
]]
local dir = (arg and arg[0] and arg[0]:match('^(.*/)')) or
            ((os.getenv('EMBER_TESTS') or 'tests') .. '/lua/')
local H = dofile(dir .. 'harness.lua')
local em = require 'ember'
local T = em.data.T

-- The labels of every batch of an epoch, as one flat list, plus the batch sizes.
local function epoch_labels(loader, n)
  local all, sizes = {}, {}
  for a, b in loader:epoch(n) do
    local y = b or a
    sizes[#sizes + 1] = y:size(1)
    for _, v in ipairs(y:totable()) do all[#all + 1] = v end
  end
  return all, sizes
end

local function sorted(t)
  local c = {}
  for i, v in ipairs(t) do c[i] = v end
  table.sort(c)
  return c
end

local function range(a, b)
  local r = {}
  for i = a, b do r[#r + 1] = i end
  return r
end

H.test('tensors source: samples are rows, #ds, ds[i], ds:get', function()
  local x = em.arange(0, 30, { dtype = 'float32' }):view(10, 3)
  local y = em.arange(1, 11)
  local ds = em.data.tensors(x, y)
  H.eq(#ds, 10)
  local s = ds[4]
  H.eq(s[1]:totable(), { 9, 10, 11 })
  H.eq(s[2]:item(), 4)
  local a, b = ds:get(10)
  H.eq(a:totable(), { 27, 28, 29 })
  H.eq(b:item(), 10)
  H.eq(tostring(ds):match('^dataset%(tensors, 10'), 'dataset(tensors, 10')
  -- strided fields: a transposed tensor's rows
  local xt = em.arange(0, 12, { dtype = 'float32' }):view(3, 4):t()   -- (4, 3), strided
  local d2 = em.data.tensors(xt)
  H.eq(#d2, 4)
  H.eq(d2[2][1]:totable(), { 1, 5, 9 })
  H.eq(d2:batch(2):loader{ workers = 1 }:epoch()():totable(), { { 0, 4, 8 }, { 1, 5, 9 } })
  H.raises(function() return ds[11] end, 'out of range', '1 .. 10')
  H.raises(function() return ds[0] end, 'out of range')
  H.raises(function() em.data.tensors(x, em.zeros(9)) end, 'tensors', 'first dimension')
  H.raises(function() em.data.tensors(em.tensor(3)) end, 'tensors', '0-d')
  H.raises(function() em.data.tensors() end, 'tensors')
end)

H.test('synthetic source: deterministic by seed and index, labels in range', function()
  local a = em.data.synthetic{ shape = { 3, 4, 4 }, dtype = 'uint8', classes = 5, size = 50, seed = 7 }
  local b = em.data.synthetic{ shape = { 3, 4, 4 }, dtype = 'uint8', classes = 5, size = 50, seed = 7 }
  local c = em.data.synthetic{ shape = { 3, 4, 4 }, dtype = 'uint8', classes = 5, size = 50, seed = 8 }
  H.eq(#a, 50)
  H.eq(a[3][1].shape, { 3, 4, 4 })
  H.eq(a[3][1].dtype, 'uint8')
  H.eq(a[3][1]:totable(), b[3][1]:totable())
  H.check(not a[3][1]:eq(c[3][1]):all():item(), 'another seed gives other data')
  H.check(not a[3][1]:eq(a[4][1]):all():item(), 'samples differ')
  local seen = {}
  for i = 1, 50 do
    local l = a[i][2]:item()
    H.check(l >= 1 and l <= 5, 'label in 1..5')
    seen[l] = true
  end
  H.eq(#sorted((function() local k = {} for l in pairs(seen) do k[#k + 1] = l end return k end)()), 5)
  local f = em.data.synthetic{ shape = { 100 }, size = 4, seed = 1 }[1][1]
  H.eq(f.dtype, 'float32')
  H.check(f:min():item() >= 0 and f:max():item() < 1, 'floats in [0, 1)')
  H.close(f:mean():item(), 0.5, 0.15)
  -- batches from the fast path equal the samples
  local bx, by = a:batch(4):loader{}:epoch()()
  H.eq(bx[2]:totable(), a[2][1]:totable())
  H.eq(by:totable(), { a[1][2]:item(), a[2][2]:item(), a[3][2]:item(), a[4][2]:item() })
  H.raises(function() em.data.synthetic{ classes = 0 } end, 'synthetic', 'classes')
end)

H.test('shuffle: a permutation per epoch, fixed by seed and epoch', function()
  local ds = em.data.tensors(em.arange(1, 101))
  local sh = ds:shuffle{ seed = 3 }
  local l = sh:batch(7):loader{}
  local e1, sizes = epoch_labels(l, 1)
  H.eq(sorted(e1), range(1, 100), 'epoch 1 is a permutation')
  H.eq(sizes[#sizes], 2, 'short last batch kept')
  H.eq(#sizes, 15)
  local e2 = epoch_labels(l, 2)
  H.eq(sorted(e2), range(1, 100))
  H.check(table.concat(e1, ',') ~= table.concat(e2, ','), 'each epoch reshuffles')
  H.eq(epoch_labels(l, 1), e1, 'epoch 1 again gives the same order')
  local l2 = ds:shuffle{ seed = 3 }:batch(7):loader{ workers = 2 }
  H.eq(epoch_labels(l2, 2), e2, 'same seed, same epochs')
  local l3 = ds:shuffle{ seed = 4 }:batch(7):loader{}
  H.check(table.concat(epoch_labels(l3, 1), ',') ~= table.concat(e1, ','), 'another seed')
  -- ds[i] shows epoch 1
  H.eq(sh[1][1]:item(), e1[1])
  -- default seeds come from em's generator
  em.manual_seed(11)
  local d1 = epoch_labels(ds:shuffle():batch(10):loader{}, 1)
  em.manual_seed(11)
  local d2 = epoch_labels(ds:shuffle():batch(10):loader{}, 1)
  H.eq(d1, d2, 'manual_seed makes default seeds reproducible')
  -- epochs count on by themselves
  local l4 = ds:shuffle{ seed = 3 }:batch(7):loader{}
  H.eq(epoch_labels(l4), e1)
  H.eq(epoch_labels(l4), e2)
end)

H.test('identical batches for 0, 1 and 4 workers and any prefetch', function()
  local x = em.randn(203, 2, 3)
  local ds = em.data.tensors(x, em.arange(1, 204)):shuffle{ seed = 9 }
    :map(T.compose{ T.hflip(0.5), T.random_crop(3, { padding = 1 }) }, { seed = 5 }):batch(16)
  local ref
  for _, cfg in ipairs{ { workers = 0 }, { workers = 1 }, { workers = 4 },
                        { workers = 4, prefetch = 1 }, { workers = 2, prefetch = 16 } } do
    local l = ds:loader(cfg)
    local xs, ys = {}, {}
    for e = 1, 2 do
      for bx, by in l:epoch(e) do xs[#xs + 1] = bx:clone(); ys[#ys + 1] = by:totable() end
    end
    if not ref then ref = { xs = xs, ys = ys }
    else
      local same = #xs == #ref.xs
      for i = 1, #xs do same = same and xs[i]:eq(ref.xs[i]):all():item() end
      H.check(same, ('images with workers=%d prefetch=%s equal workers=0'):format(cfg.workers,
        tostring(cfg.prefetch)))
      H.eq(ys, ref.ys, 'labels, workers=' .. cfg.workers)
    end
  end
  H.eq(#ref.xs, 26)
  H.eq(ref.xs[13].shape, { 11, 3, 3 })   -- (2, 3) images as (H, W), padded, cropped 3x3
end)

H.test('batch, take, shard', function()
  local ds = em.data.tensors(em.arange(1, 11))
  H.eq(#ds:batch(3), 4)
  H.eq(#ds:batch(3, { drop_last = true }), 3)
  local _, sizes = epoch_labels(ds:batch(3, { drop_last = true }):loader{})
  H.eq(sizes, { 3, 3, 3 })
  H.eq(#ds:take(4), 4)
  H.eq(#ds:take(40), 10)
  H.eq(epoch_labels(ds:take(4):batch(10):loader{}), { 1, 2, 3, 4 })
  -- shards: equal lengths, disjoint, together covering (padding wraps around)
  local seen, lens = {}, {}
  for r = 0, 3 do
    local s = ds:shard(r, 4)
    lens[#lens + 1] = #s
    for _, v in ipairs(epoch_labels(s:batch(5):loader{})) do seen[#seen + 1] = v end
  end
  H.eq(lens, { 3, 3, 3, 3 })
  H.eq(sorted(seen), { 1, 1, 2, 2, 3, 4, 5, 6, 7, 8, 9, 10 }, 'covering, 2 padded by wrapping')
  H.eq(epoch_labels(ds:shard(1, 4):batch(5):loader{}), { 2, 6, 10 })
  H.eq(epoch_labels(ds:shard(3, 4):batch(5):loader{}), { 4, 8, 2 })
  seen, lens = {}, {}
  for r = 0, 3 do
    local s = ds:shard(r, 4, { drop_remainder = true })
    lens[#lens + 1] = #s
    for _, v in ipairs(epoch_labels(s:batch(5):loader{})) do seen[#seen + 1] = v end
  end
  H.eq(lens, { 2, 2, 2, 2 })
  H.eq(sorted(seen), range(1, 8), 'disjoint, the tail of 2 left out')
  -- shard after shuffle: every replica sees the same permutation, so shards stay disjoint
  local all = {}
  for r = 0, 2 do
    for _, v in ipairs(epoch_labels(ds:shuffle{ seed = 1 }:shard(r, 2 + 1):batch(4):loader{}, 5)) do
      all[#all + 1] = v
    end
  end
  H.eq(#all, 12)
  local uniq = {}
  for _, v in ipairs(all) do uniq[v] = true end
  local n = 0
  for _ in pairs(uniq) do n = n + 1 end
  H.eq(n, 10, 'shuffled shards cover every sample')
  H.raises(function() ds:shard(4, 4) end, 'shard', 'rank 4', '0-based')
  H.raises(function() ds:batch(0) end, 'batch', 'batch size')
  H.raises(function() ds:take(-1) end, 'take')
  H.raises(function() ds:map(42) end, 'map', 'transform')
end)

H.test('zero-copy batches of consecutive rows; gathered copies otherwise', function()
  local x = em.arange(0, 40, { dtype = 'float32' }):view(20, 2)
  local ds = em.data.tensors(x)
  local b = ds:batch(5):loader{}:epoch()()
  H.eq(b.shape, { 5, 2 })
  x:narrow(1, 1, 1):fill_(100)
  H.eq(b[1]:totable(), { 100, 100 }, 'a batch of consecutive rows is a view of the source')
  local g = ds:shuffle{ seed = 1 }:batch(5):loader{}:epoch()()
  local before = g:clone()
  x:fill_(-1)
  H.check(g:eq(before):all():item(), 'a shuffled batch is a copy')
end)

H.test('stats: batches, samples, wait time', function()
  local ds = em.data.synthetic{ shape = { 8 }, size = 100, seed = 1 }:batch(10)
  local l = ds:loader{ workers = 2 }
  H.eq(l:size(), 10)
  local n = 0
  for x in l:epoch() do n = n + 1 end
  local s = l:stats()
  H.eq({ s.epoch, s.batches, s.samples, s.total_batches }, { 1, 10, 100, 10 })
  H.check(s.elapsed_s > 0 and s.wait_s >= 0 and s.wait_s <= s.elapsed_s, 'times are sane')
  H.check(s.wait_fraction >= 0 and s.wait_fraction <= 1, 'wait fraction in [0, 1]')
  H.close(s.samples_per_s, 100 / s.elapsed_s, 1e-6 * s.samples_per_s + 1e-9)
  -- unbatched datasets count one sample per item
  local u = em.data.tensors(em.zeros(7, 2)):loader{}
  for _ in u:epoch() do end
  H.eq(u:stats().samples, 7)
end)

H.test('break mid-epoch, then another epoch; collected loaders stop their threads', function()
  local ds = em.data.tensors(em.arange(1, 1001)):shuffle{ seed = 2 }:batch(10)
  local l = ds:loader{ workers = 3, prefetch = 4 }
  local first
  for y in l:epoch(1) do first = y:totable(); break end
  local again = epoch_labels(l, 1)
  H.eq({ unpack(again, 1, 10) }, first, 'restarting epoch 1 starts from its first batch')
  H.eq(#again, 1000)
  for _ = 1, 20 do          -- many loaders dropped mid-epoch: no hang, no crash
    local l2 = ds:loader{ workers = 2 }
    local it = l2:epoch()
    it()
  end
  collectgarbage(); collectgarbage()
  l:close()
  H.eq(#epoch_labels(l, 3), 1000, 'a closed loader can run another epoch')
end)

H.test('an error in a worker reaches the consumer; the next epoch runs again', function()
  -- a crop larger than the samples: the worker's message names the transform
  local imgs = em.zeros(12, 1, 6, 6)
  local ds = em.data.tensors(imgs, em.arange(1, 13)):map(T.random_crop(8)):batch(4)
  for _, w in ipairs{ 0, 2 } do
    local l = ds:loader{ workers = w }
    H.raises(function() for _ in l:epoch() do end end, 'random_crop', '8x8')
    H.raises(function() for _ in l:epoch() do end end, 'random_crop')
  end
  -- mixed sample shapes cannot be stacked: the message says which sample
  local big = em.data.tensors(em.zeros(4, 1, 8, 8))
  local mixed = em.data.tensors(em.zeros(4, 1, 8, 8)):map(T.random_crop(5))
  H.eq(#big, 4)
  local l = mixed:batch(2):loader{ workers = 1 }
  local n = 0
  for x in l:epoch() do n = n + 1; H.eq(x.shape, { 2, 1, 5, 5 }) end
  H.eq(n, 2)
  H.raises(function() em.data.tensors(em.zeros(2)):loader{ workers = -1 } end, 'loader', 'workers')
  H.raises(function() em.data.tensors(em.zeros(2)):loader{ prefetch = 'x' } end, 'loader', 'prefetch')
end)

H.test('a script that ends mid-epoch exits cleanly (threads stopped before the state closes)', function()
  local ember = arg and arg[-1]
  if not ember then return H.skip('no ember binary in arg[-1]') end
  local code = "l = em.data.synthetic{shape = {3, 32, 32}, size = 5000, seed = 1}" ..
    ":map(em.data.T.hflip(0.5)):batch(16):loader{workers = 3}; local it = l:epoch(); it(); it(); " ..
    "g = em.data.tensors(em.zeros(4, 2)):shuffle(); io.write('done')"
  for _ = 1, 3 do
    local p = io.popen(ember .. ' -e "' .. code .. '"; echo " rc=$?"')
    local out = p:read('*a')
    p:close()
    H.eq(out, 'done rc=0\n')
  end
end)

H.test('fashion_mnist / mnist: files found under root, gzip or raw, split names', function()
  local base = os.tmpname()
  os.remove(base)
  local root = base .. '-fmnist'
  os.execute('mkdir -p ' .. root)
  local function be32(n)
    return string.char(math.floor(n / 16777216) % 256, math.floor(n / 65536) % 256,
      math.floor(n / 256) % 256, n % 256)
  end
  local function write(name, bytes)
    local f = assert(io.open(root .. '/' .. name, 'wb')); f:write(bytes); f:close()
  end
  local px = {}
  for i = 0, 2 * 28 * 28 - 1 do px[#px + 1] = string.char(i % 251) end
  write('t10k-images-idx3-ubyte', '\0\0\8\3' .. be32(2) .. be32(28) .. be32(28) .. table.concat(px))
  write('t10k-labels-idx1-ubyte', '\0\0\8\1' .. be32(2) .. '\9\0')
  local ds = em.data.fashion_mnist{ split = 'test', root = root }
  H.eq(#ds, 2)
  H.eq(ds[1][1].shape, { 1, 28, 28 })
  H.eq(ds[1][1].dtype, 'uint8')
  H.eq({ ds[1][2]:item(), ds[2][2]:item() }, { 10, 1 }, 'labels shifted to 1-based')
  H.eq(ds[2][1]:view(-1)[1], 784 % 251)
  H.eq(ds.images.shape, { 2, 1, 28, 28 })
  H.eq(#em.data.mnist{ split = 'test', root = root }, 2)
  if os.execute('gzip -q ' .. root .. '/t10k-images-idx3-ubyte') == 0 or
     os.execute('test -f ' .. root .. '/t10k-images-idx3-ubyte.gz') then
    H.eq(em.data.fashion_mnist{ split = 'test', root = root }[2][1]:sum():item(),
      ds[2][1]:sum():item(), 'the gzipped file reads the same')
  end
  H.raises(function() em.data.fashion_mnist{ split = 'train', root = root } end,
    'fashion_mnist', 'train-images-idx3-ubyte', root)
  H.raises(function() em.data.fashion_mnist{ split = 'validation', root = root } end,
    'fashion_mnist', 'split')
  os.execute('rm -rf ' .. root)
end)

H.test('load_image / save_image: PNG exact, JPEG close, errors name the file', function()
  local base = os.tmpname()
  local img = em.arange(0, 3 * 5 * 7):remainder(256):to('uint8'):view(3, 5, 7)
  em.data.save_image(img, base .. '.png')
  local back = em.data.load_image(base .. '.png')
  H.eq(back.shape, { 3, 5, 7 })
  H.check(back:eq(img):all():item(), 'PNG round trip is exact')
  local smooth = (em.arange(0, 64):view(1, 8, 8):expand(3, 8, 8) * 2):to('uint8')
  em.data.save_image(smooth, base .. '.jpg', { quality = 95 })
  local j = em.data.load_image(base .. '.jpg')
  H.check((j:float() - smooth:float()):abs():mean():item() < 3, 'JPEG close to the original')
  H.raises(function() em.data.load_image(base .. '.missing.png') end, base .. '.missing.png')
  H.raises(function() em.data.save_image(img, base .. '.bmp') end, '.bmp', '.png, .jpg or .jpeg')
  os.remove(base .. '.png'); os.remove(base .. '.jpg'); os.remove(base)
end)

H.test('telling the user: plain progress lines off a terminal, the >10% wait warning', function()
  local ember = arg and arg[-1]
  if not ember then return H.skip('no ember binary in arg[-1]') end
  -- every sample busy-waits 10 ms on the consumer's thread (workers = 0): the loop
  -- waits for data nearly all of the 1.2 s epoch
  local code = "local ds = em.data.tensors(em.zeros(120, 2)):map(function(x) " ..
    "local t = os.clock() while os.clock() - t < 0.01 do end return x end):batch(10); " ..
    "local l = ds:loader{workers = 0, progress = 0.3}; for x in l:epoch() do end; " ..
    "io.stdout:write(('frac %.2f'):format(l:stats().wait_fraction))"
  local p = io.popen(ember .. ' -e "' .. code .. '" 2>&1 | cat')
  local out = p:read('*a')
  p:close()
  H.check(out:find('epoch 1  %d+/12 batches'), 'a plain progress line: ' .. out)
  H.check(out:find('waited for data %d+%% of epoch 1'), 'the warning: ' .. out)
  H.check(out:find('ds:loader{workers = ', 1, true), 'it says what to raise: ' .. out)
  local frac = tonumber(out:match('frac ([%d.]+)'))
  H.check(frac and frac > 0.9, 'wait fraction near 1: ' .. tostring(frac))
end)

H.test('image_folder: images in folders nested inside a class folder belong to it', function()
  local base = os.tmpname()
  os.remove(base)
  local root = base .. '-nested'
  os.execute(('mkdir -p %s/a/sub/deeper %s/b/.hidden'):format(root, root))
  local function img(v) return em.full({ 3, 2, 2 }, v, { dtype = 'uint8' }) end
  em.data.save_image(img(10), root .. '/a/x.png')
  em.data.save_image(img(20), root .. '/a/sub/y.png')
  em.data.save_image(img(30), root .. '/a/sub/deeper/z.png')
  em.data.save_image(img(40), root .. '/b/w.png')
  em.data.save_image(img(50), root .. '/b/.hidden/v.png')
  local ds = em.data.image_folder(root)
  H.eq(#ds, 4, 'hidden folders skipped')
  local got = {}
  for i = 1, #ds do got[i] = { ds[i][1][1][1][1], ds[i][2]:item() } end
  H.eq(got, { { 30, 1 }, { 20, 1 }, { 10, 1 }, { 40, 2 } }, 'sorted by path within a class')
  os.execute('rm -rf ' .. root)
end)

H.test('loader state_dict: a resumed loader continues with the next epoch', function()
  local ds = em.data.tensors(em.arange(1, 21)):shuffle{ seed = 5 }:batch(20)
  local a = ds:loader{}
  epoch_labels(a)
  local sd = a:state_dict()
  local want = epoch_labels(a)
  local b = ds:loader{}
  b:load_state_dict(sd)
  H.eq(epoch_labels(b), want)
  H.raises(function() b:load_state_dict(3) end, 'load_state_dict')
  -- interrupted mid-epoch: the restored loader goes on with the same order
  local ds2 = em.data.tensors(em.arange(1, 31)):shuffle{ seed = 6 }:batch(4)
  local c = ds2:loader{ workers = 2 }
  epoch_labels(c)
  local whole = epoch_labels(ds2:loader{}, 2)
  local seen, k = {}, 0
  for y in c:epoch() do
    k = k + 1
    for _, v in ipairs(y:totable()) do seen[#seen + 1] = v end
    if k == 3 then break end
  end
  local sd2 = c:state_dict()
  H.eq({ sd2.epoch, sd2.position, sd2.next_epoch }, { 2, 3, 3 })
  local d = ds2:loader{ workers = 2 }
  d:load_state_dict(sd2)
  for _, v in ipairs(epoch_labels(d)) do seen[#seen + 1] = v end
  H.eq(seen, whole, 'the first 3 batches, then the rest of epoch 2')
  H.eq(d:stats().batches, 8)
  H.eq(#epoch_labels(d), 30, 'then epoch 3 whole')
  H.eq(d:stats().epoch, 3)
  -- through a checkpoint file
  local path = os.tmpname()
  em.checkpoint.save(path, { loader = c })
  local e = ds2:loader{}
  em.checkpoint.load(path, { loader = e })
  H.eq(e:state_dict().next_epoch, 3)
  os.remove(path)
end)

H.test('to_float and normalize also work on whole batches (map after batch)', function()
  local x = em.randint(0, 256, { 12, 3, 4, 5 }, { dtype = 'uint8' })
  local ds = em.data.tensors(x)
  local norm = em.data.T.compose{ em.data.T.to_float(), em.data.T.normalize({ 0.4, 0.5, 0.6 }, { 0.2, 0.25, 0.3 }) }
  local per_sample, per_batch = {}, {}
  for b in ds:map(norm):batch(4):loader{}:epoch() do per_sample[#per_sample + 1] = b end
  for b in ds:batch(4):map(norm):loader{ workers = 2 }:epoch() do per_batch[#per_batch + 1] = b end
  H.eq(#per_batch, 3)
  for i = 1, 3 do
    H.eq(per_batch[i].shape, { 4, 3, 4, 5 })
    H.close((per_batch[i] - per_sample[i]):abs():max():item(), 0, 1e-6)
  end
  -- a strided batch (channels last in memory) gives the same values
  local cl = x:permute(1, 3, 4, 2):contiguous():permute(1, 4, 2, 3)
  local s = em.data.tensors(cl):batch(12):map(norm):loader{}:epoch()()
  H.close((s - em.cat(per_sample, 1)):abs():max():item(), 0, 1e-6)
  H.raises(function() em.data.T.normalize(0, 1)(em.zeros(2, 2, 2, 2, 2)) end, 'normalize', '(B, C, H, W)')
end)

H.test('ds:map runs per sample; T objects apply to one tensor', function()
  local x = em.tensor({ { { 0, 51 }, { 102, 255 } } }, { dtype = 'uint8' })   -- (1, 2, 2)
  local ds = em.data.tensors(x:view(1, 1, 2, 2)):map(T.to_float())
  H.close(H.flat(ds[1][1]), { 0, 0.2, 0.4, 1 }, 1e-6)
  H.close(H.flat(T.to_float()(x)), { 0, 0.2, 0.4, 1 }, 1e-6)
  H.eq(T.hflip(1)(x):totable(), { { { 51, 0 }, { 255, 102 } } })
end)

H.done()
