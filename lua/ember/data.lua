--[[
ember.data -- datasets and the input pipeline (API.md, em.data). The work is in
C (core/data/, core/io/): datasets are immutable C nodes, composed here into a
pipeline, read by a loader whose worker threads compute batches ahead of the
training step (lua/ember/data/loader.lua). Transforms are C objects too
(lua/ember/data/transforms.lua, em.data.T); ds:map(fn) with a Lua function runs
fn in the workers' own LuaJIT states (lua/ember/data/luamap.lua).

A dataset is a cdata box (so that #ds works: LuaJIT ignores __len on tables)
holding one reference to its C node, released by the box's finalizer.

  #ds                       number of samples (of batches after ds:batch)
  ds[i]                     sample i as a table {x, y}; ds:get(i) returns x, y
  ds:shuffle{seed}          ds:map(T or fn)        ds:batch(n, {drop_last})
  ds:shard(rank, world_size, {drop_remainder})      ds:take(n)
  ds:loader{workers, prefetch, pin_memory, device, progress}
  em.data.load_image(path, {channels, max_pixels}) / save_image(t, path, {quality})
  em.data.max_pixels([n | false])   the pixel limit for images (false: none)

Seeds. A stage given no seed draws one from em's generator when it is built, so
em.manual_seed(n) before building the pipeline makes every epoch reproducible.
Epochs are numbered from 1; ds[i] shows epoch 1.
]]
local ffi = require 'ffi'
local core = require 'ember.ffi'
require 'ember.tensor'
local C, S, wrap, raise = core.C, core.S, core.wrap, core.raise
local out = core.out

local M = {}

ffi.cdef [[ typedef struct em_dsbox { em_dataset *_h; } em_dsbox; ]]
local fields = ffi.new('em_tensor*[4]')
local dsout = ffi.new('em_dataset*[1]')

-- -- Lifetime ---------------------------------------------------------------------------
-- Every live C object of this package (dataset, transform, loader) is released
-- before the state closes: at lua_close LuaJIT runs the state's closer (a userdata
-- finalizer) and the boxes' cdata finalizers in an order of its own, and a dataset
-- released after em_close, or a loader whose threads outlive it, would touch freed
-- memory. So each object lives in a cdata box whose finalizer releases it and nils
-- the handle, and the boxes register here so that the closer releases those still
-- alive first; whichever comes first, the other finds nil and does nothing.
local live = setmetatable({}, { __mode = 'k' })
function M._track(obj, release) live[obj] = release; return obj end
core.on_close[#core.on_close + 1] = function()
  for obj, release in pairs(live) do release(obj) end
end

M._releaser = core.releaser
local release_ds = M._releaser(C.em_dataset_release)

-- -- Helpers ----------------------------------------------------------------------------
local function kindof(x)
  return core.kind(x) == 'cdata' and ffi.istype('em_dsbox', x) and 'dataset' or core.kind(x)
end
M._kindof = kindof

local function check_int(op, name, v, lo)
  if type(v) ~= 'number' or v % 1 ~= 0 or v < (lo or 0) then
    raise(('%s: %s must be an integer >= %d, got %s'):format(op, name, lo or 0,
      type(v) == 'number' and tostring(v) or kindof(v)))
  end
  return v
end

-- A stage's seed: the one given, else a draw from em's generator.
local function seed_of(op, s)
  if s == nil then return require('ember').randint(0, 2 ^ 52, { 1 }, { dtype = 'float64' }):item() end
  check_int(op, 'seed', s)
  return s
end
M._seed_of = seed_of

local function opts_table(op, o)
  if o ~= nil and type(o) ~= 'table' then raise(op .. ': expected an options table, got ' .. kindof(o)) end
  return o or {}
end

-- -- The dataset type ----------------------------------------------------------------------
local Dataset = {}
local box_t
-- Wraps the new reference in dsout[0].
local function wrap_ds()
  local b = box_t(dsout[0])
  dsout[0] = nil
  return M._track(b, release_ds)
end

local function handle(op, ds)
  if not ffi.istype(box_t, ds) then raise(('%s: expected a dataset, got %s'):format(op, kindof(ds))) end
  if ds._h == nil then raise(op .. ': the dataset was released (the state is closing)') end
  return ds._h
end
M._handle = handle

-- Sample i (1-based) as tensors x, y, ...
function Dataset:get(i)
  local h = handle('dataset get', self)
  local n = tonumber(C.em_dataset_len(h))
  if type(i) ~= 'number' or i % 1 ~= 0 or i < 1 or i > n then
    raise(('dataset: index %s out of range (1 .. %d)'):format(tostring(i), n))
  end
  if C.em_dataset_get(S, h, i - 1, 1, fields) ~= 0 then core.fail() end
  local nf = C.em_dataset_nfields(h)
  local r = {}
  for k = 1, nf do r[k] = wrap(fields[k - 1]); fields[k - 1] = nil end
  return unpack(r, 1, nf)
end

function Dataset:size() return tonumber(C.em_dataset_len(self._h)) end
function Dataset:kind() return ffi.string(C.em_dataset_kind(self._h)) end

-- Whole tensors of an in-memory source (field k, 1-based).
function Dataset:tensor(k)
  if C.em_dataset_tensor(S, handle('dataset tensor', self), (k or 1) - 1, out) ~= 0 then core.fail() end
  return wrap(out[0])
end

function Dataset:shuffle(o)
  o = opts_table('shuffle', o)
  if C.em_data_shuffle(S, handle('shuffle', self), seed_of('shuffle', o.seed), dsout) ~= 0 then core.fail() end
  return wrap_ds()
end

function Dataset:map(t, o)
  o = opts_table('map', o)
  local h = handle('map', self)
  local seed = seed_of('map', o.seed)
  local T = require 'ember.data.transforms'
  local th, own
  if type(t) == 'function' then
    th, own = require('ember.data.luamap').transform(t), true
  else
    th = T.handle('map', t)
  end
  local st = C.em_data_map(S, h, th, seed, dsout)
  if own then C.em_transform_release(th) end
  if st ~= 0 then core.fail() end
  return wrap_ds()
end

function Dataset:batch(n, o)
  check_int('batch', 'the batch size', n, 1)
  o = opts_table('batch', o)
  if C.em_data_batch(S, handle('batch', self), n, o.drop_last and 1 or 0, dsout) ~= 0 then core.fail() end
  return wrap_ds()
end

function Dataset:shard(rank, world_size, o)
  check_int('shard', 'world_size', world_size, 1)
  check_int('shard', 'rank', rank, 0)
  o = opts_table('shard', o)
  if C.em_data_shard(S, handle('shard', self), rank, world_size, o.drop_remainder and 1 or 0,
    dsout) ~= 0 then core.fail() end
  return wrap_ds()
end

function Dataset:take(n)
  check_int('take', 'n', n)
  if C.em_data_take(S, handle('take', self), n, dsout) ~= 0 then core.fail() end
  return wrap_ds()
end

function Dataset:loader(o)
  return require('ember.data.loader').new(self, opts_table('loader', o))
end

local named = { images = 1, labels = 2 }   -- ds.images, ds.labels: an image source's fields
box_t = ffi.metatype('em_dsbox', {
  __index = function(self, k)
    if type(k) == 'number' then return { self:get(k) } end
    local m = Dataset[k]
    if m then return m end
    if named[k] then return self:tensor(named[k]) end
    return nil
  end,
  __len = function(self) return tonumber(C.em_dataset_len(self._h)) end,
  __gc = release_ds,
  __tostring = function(self)
    return ('dataset(%s, %d %s)'):format(self:kind(), #self,
      C.em_dataset_nfields(self._h) == 1 and 'samples of 1 field' or 'samples')
  end,
})
M.Dataset = Dataset

-- -- Sources ---------------------------------------------------------------------------------
function M.read_idx(path)
  if type(path) ~= 'string' then raise('read_idx: expected a file path, got ' .. kindof(path)) end
  if C.em_idx_load(S, path, out) ~= 0 then core.fail() end
  return wrap(out[0])
end

local function exists(path)
  local f = io.open(path, 'rb')
  if f then f:close() return true end
  return false
end

local function data_root(opts, folder)
  if opts.root then return opts.root end
  local env = os.getenv('EMBER_DATA')
  if env and env ~= '' then return env .. '/' .. folder end
  return '/usr/share/datasets/' .. folder
end

-- Image options (core/io/image.c): max_pixels = n (> 0) or false (no limit); nil
-- takes the state's setting (em.data.max_pixels, by default PIL's 89,478,485).
local image_opts = ffi.new('em_image_opts')
local function fill_image_opts(op, o)
  local m = o.max_pixels
  if m == false then m = -1
  elseif m == nil then m = 0
  else check_int(op, 'max_pixels', m, 1) end
  image_opts.max_pixels = m
  image_opts.full_decode = o.full_decode and 1 or 0
  return image_opts
end

-- Reads (no argument) or sets the pixel limit for image loads that give none; a
-- decoder refuses a bigger image from its header, before allocating. Returns the
-- limit in force (false for none).
function M.max_pixels(n)
  if n ~= nil then
    if n == false then C.em_image_set_max_pixels(S, -1)
    else C.em_image_set_max_pixels(S, check_int('max_pixels', 'the limit', n, 1)) end
  end
  local m = tonumber(C.em_image_max_pixels(S))
  return m >= 0 and m or false
end

-- Images one at a time (core/io/image.c): uint8 (C, H, W).
function M.load_image(path, o)
  if type(path) ~= 'string' then raise('load_image: expected a file path, got ' .. kindof(path)) end
  o = opts_table('load_image', o)
  local ch = o.channels or 3
  if ch ~= 0 and ch ~= 3 then raise('load_image: channels must be 3 (RGB) or 0 (as stored)') end
  if C.em_image_load_opts(S, path, ch, fill_image_opts('load_image', o), out) ~= 0 then
    core.fail()
  end
  return wrap(out[0])
end

function M.save_image(t, path, o)
  if type(path) ~= 'string' then raise('save_image: expected a file path, got ' .. kindof(path)) end
  o = opts_table('save_image', o)
  if C.em_image_save(S, path, core.H(t, 'save_image', 1), o.quality or 0) ~= 0 then core.fail() end
end

function M.idx(images, labels)
  if type(images) ~= 'string' or type(labels) ~= 'string' then
    raise('idx: expected the paths of an images file and a labels file')
  end
  if C.em_data_idx(S, images, labels, 1, dsout) ~= 0 then core.fail() end
  return wrap_ds()
end

local function idx_pair(op, opts, folder, package)
  opts = opts_table(op, opts)
  local split = opts.split or 'train'
  if split ~= 'train' and split ~= 'test' then
    raise(("%s: split must be 'train' or 'test', got '%s'"):format(op, tostring(split)))
  end
  local root = data_root(opts, folder)
  local prefix = split == 'train' and 'train' or 't10k'
  local function find(name)
    for _, p in ipairs({ root .. '/' .. name .. '.gz', root .. '/' .. name }) do
      if exists(p) then return p end
    end
    raise(('%s: %s(.gz) not found in %s (set root= or EMBER_DATA%s)'):format(op, name, root,
      package and ', or install the Debian package ' .. package or ''))
  end
  return M.idx(find(prefix .. '-images-idx3-ubyte'), find(prefix .. '-labels-idx1-ubyte'))
end

function M.mnist(opts) return idx_pair('mnist', opts, 'mnist') end
function M.fashion_mnist(opts)
  return idx_pair('fashion_mnist', opts, 'fashion-mnist', 'dataset-fashion-mnist')
end

function M.cifar10(opts)
  opts = opts_table('cifar10', opts)
  local root = data_root(opts, 'cifar-10-batches-bin')
  local split = opts.split or 'train'
  local names
  if split == 'train' then
    names = { 'data_batch_1.bin', 'data_batch_2.bin', 'data_batch_3.bin', 'data_batch_4.bin',
      'data_batch_5.bin' }
  elseif split == 'test' then
    names = { 'test_batch.bin' }
  else
    raise(("cifar10: split must be 'train' or 'test', got '%s'"):format(tostring(split)))
  end
  local paths = ffi.new('const char*[?]', #names)
  local keep = {}
  for i, n in ipairs(names) do keep[i] = root .. '/' .. n; paths[i - 1] = keep[i] end
  if C.em_data_cifar10(S, paths, #names, 1, dsout) ~= 0 then core.fail() end
  return wrap_ds()
end

function M.image_folder(root, opts)
  if type(root) ~= 'string' then raise('image_folder: expected a folder path, got ' .. kindof(root)) end
  opts = opts_table('image_folder', opts)
  local h, w = 0, 0
  local size = opts.size
  if type(size) == 'number' then h, w = size, size
  elseif type(size) == 'table' then h, w = size[1], size[2]
  elseif size ~= nil then raise('image_folder: size must be a number or {height, width}') end
  check_int('image_folder', 'size', h); check_int('image_folder', 'size', w)
  -- max_pixels as load_image; with a size, JPEGs are decoded at a reduced DCT scale
  -- that still covers it unless full_decode = true (PIL's exact pixels)
  if C.em_data_image_folder_opts(S, root, h, w, 1, fill_image_opts('image_folder', opts),
                                 dsout) ~= 0 then
    core.fail()
  end
  return wrap_ds()
end

-- header = nil: a first line with a field that is not a number is a header.
function M.csv(path, opts)
  if type(path) ~= 'string' then raise('csv: expected a file path, got ' .. kindof(path)) end
  opts = opts_table('csv', opts)
  local header = opts.header
  if header == nil then
    local f = io.open(path, 'rb')
    local line = f and f:read('*l')
    if f then f:close() end
    header = false
    for field in ((line or '') .. ','):gmatch('([^,]*),') do
      if not tonumber(field) then header = true end
    end
  end
  local label, name, col = opts.label, nil, -1
  if type(label) == 'string' then name = label
  elseif type(label) == 'number' then col = check_int('csv', 'label', label, 1) - 1
  elseif label ~= nil then raise('csv: label must be a column name or a 1-based column number') end
  if C.em_data_csv(S, path, header and 1 or 0, name, col, dsout) ~= 0 then core.fail() end
  return wrap_ds()
end

function M.tensors(...)
  local n = select('#', ...)
  if n < 1 or n > 4 then raise(('tensors: expected 1 to 4 tensors, got %d'):format(n)) end
  local hs = ffi.new('em_tensor*[4]')
  for i = 1, n do hs[i - 1] = core.H(select(i, ...), 'tensors', i) end
  if C.em_data_tensors(S, hs, n, dsout) ~= 0 then core.fail() end
  return wrap_ds()
end

function M.synthetic(o)
  o = opts_table('synthetic', o)
  local shape = o.shape or { 1, 28, 28 }
  if type(shape) ~= 'table' then raise('synthetic: shape must be a table of sizes') end
  local sh = ffi.new('int64_t[8]')
  for i, v in ipairs(shape) do sh[i - 1] = check_int('synthetic', 'a size', v) end
  local dt = core.dtype_id(o.dtype or 'float32', 'synthetic')
  if C.em_data_synthetic(S, sh, #shape, dt, check_int('synthetic', 'classes', o.classes or 10, 1),
    check_int('synthetic', 'size', o.size or 60000), seed_of('synthetic', o.seed), 1, dsout) ~= 0 then
    core.fail()
  end
  return wrap_ds()
end

M.T = setmetatable({}, { __index = function(t, k)
  local T = require 'ember.data.transforms'
  setmetatable(t, { __index = T })
  return T[k]
end })

return M
