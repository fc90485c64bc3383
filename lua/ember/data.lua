--[[
ember.data -- dataset files, for now: IDX (MNIST / Fashion-MNIST) read by the C
core (core/io/idx.c; gzip or raw; truncated or lying files are errors naming the
file). The full input pipeline of API.md's em.data (C worker threads,
transforms, prefetch, shuffle/batch/shard, loader:stats) is its own milestone;
these sources already follow its conventions: images come as uint8 (N, 1, H, W),
labels as int64 shifted to 1-based classes.

  em.data.read_idx(path) -> tensor of the file's shape and type
  em.data.mnist{split = 'train'|'test', root = dir}
  em.data.fashion_mnist{split = 'train'|'test', root = dir}
      -> {images = (N,1,28,28) uint8, labels = (N) int64 in 1..10}; ds:size() and
         ds:get(i) -> image, label. (`#ds` needs the pipeline's userdata datasets:
         LuaJIT, as Lua 5.1, ignores __len on tables.) root defaults to $EMBER_DATA, then the Debian
         package's folder (/usr/share/datasets/<name>).
]]
local core = require 'ember.ffi'
require 'ember.tensor'
local C, S, wrap, raise = core.C, core.S, core.wrap, core.raise
local out = core.out

local M = {}

function M.read_idx(path)
  if type(path) ~= 'string' then raise('read_idx: expected a file path, got ' .. type(path)) end
  if C.em_idx_load(S, path, out) ~= 0 then core.fail() end
  return wrap(out[0])
end

local function exists(path)
  local f = io.open(path, 'rb')
  if f then f:close() return true end
  return false
end

-- The file for base name `name` under root, gzipped or not.
local function find(op, root, name)
  for _, p in ipairs({ root .. '/' .. name .. '.gz', root .. '/' .. name }) do
    if exists(p) then return p end
  end
  raise(('%s: %s(.gz) not found in %s (set root= or EMBER_DATA, or install the '
    .. 'Debian package dataset-fashion-mnist)'):format(op, name, root))
end

local Dataset = {}
Dataset.__index = Dataset
function Dataset:size() return self.labels:size(1) end
function Dataset:get(i) return self.images[i], self.labels[i] end

local function idx_pair(op, opts, folder)
  opts = opts or {}
  local split = opts.split or 'train'
  if split ~= 'train' and split ~= 'test' then
    raise(("%s: split must be 'train' or 'test', got '%s'"):format(op, tostring(split)))
  end
  local root = opts.root or os.getenv('EMBER_DATA') and (os.getenv('EMBER_DATA') .. '/' .. folder)
    or '/usr/share/datasets/' .. folder
  local prefix = split == 'train' and 'train' or 't10k'
  local images = M.read_idx(find(op, root, prefix .. '-images-idx3-ubyte'))
  local labels = M.read_idx(find(op, root, prefix .. '-labels-idx1-ubyte'))
  if images:dim() ~= 3 or labels:dim() ~= 1 or images:size(1) ~= labels:size(1) then
    raise(('%s: images %s and labels %s in %s do not pair up'):format(op,
      table.concat(images.shape, 'x'), table.concat(labels.shape, 'x'), root))
  end
  local n, h, w = images:size(1), images:size(2), images:size(3)
  return setmetatable({
    images = images:view(n, 1, h, w),
    labels = labels:long() + 1,        -- 0-based on disk, 1-based classes in ember
    root = root, split = split,
  }, Dataset)
end

function M.mnist(opts) return idx_pair('mnist', opts, 'mnist') end
function M.fashion_mnist(opts) return idx_pair('fashion_mnist', opts, 'fashion-mnist') end

return M
