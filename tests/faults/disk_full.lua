--[[
disk_full.lua -- a checkpoint that does not fit on the disk: a clear error, and
the previous checkpoint still loads, whole.

  ember disk_full.lua DIR                       a plain checkpoint (one file)
  ember --replicas 2 disk_full.lua DIR sharded  a sharded one (s:wrap(m, {shard =
                                                'gradients'})): every replica
                                                writes its share of the folder

DIR is a small filesystem (tests/faults/run.sh mounts a 4 MiB tmpfs there).
disk_full(name, save, load) is the case, written for any kind of checkpoint:
save(state) writes a checkpoint of state = {model = m, step = n}, load(objects)
reads it back into {model = m}. The steps:
  1. a first checkpoint (a model of about 0.5 MiB) is saved;
  2. a second one (a model of about 6 MiB) does not fit: save raises an error
     that names the file and says the disk is full (the core passes on
     strerror(ENOSPC): "No space left on device");
  3. nothing is left behind that keeps the disk full (the folder holds what it
     held after step 1), and the first checkpoint loads with its values;
  4. a checkpoint that fits saves again (the failed one did not wedge anything).
Checks go through tests/lua/harness.lua, so the output ends in `#counts P F`.
]]
local dir = assert(arg[1], 'usage: ember disk_full.lua DIR [sharded]')
local variant = arg[2] or 'plain'
local tests = os.getenv('EMBER_TESTS') or 'tests'
local H = dofile(tests .. '/lua/harness.lua')
local nn = em.nn

-- The folder's entries, sorted, as one string ("a b/c" for files in subfolders).
local function listing(d)
  local p = io.popen('cd ' .. d .. ' && find . -mindepth 1 | sort')
  local s = p:read('*a')
  p:close()
  return (s:gsub('%./', ''):gsub('\n', ' '))
end

local function model_of(width)
  em.manual_seed(width)
  return nn.Sequential(nn.Linear(width, width), nn.Linear(width, 4))
end

local function same_params(a, b)
  local pa, pb = a:parameters(), b:parameters()
  if #pa ~= #pb then return false end
  for i = 1, #pa do
    if (pa[i] - pb[i]):abs():max():item() ~= 0 then return false end
  end
  return true
end

-- name: what is saved (for messages); save(state), load(objects): see the top;
-- where: the path that errors must name.
local function disk_full(name, save, load, where)
  H.test(name .. ': a checkpoint that does not fit the disk', function()
    local small, big = model_of(350), model_of(1250)          -- ~0.5 MiB, ~6 MiB
    save({ model = small, step = 1 })
    local after_first = listing(dir)
    local ok, err = pcall(save, { model = big, step = 2 })
    H.check(not ok, 'the second save raised an error')
    err = tostring(err)
    H.check(err:find(where, 1, true), 'the error names the file: ' .. err)
    H.check(err:find('No space left on device', 1, true), 'the error says why: ' .. err)
    H.eq(listing(dir), after_first, 'the failed save left nothing behind')
    local back = model_of(350)
    for _, p in ipairs(back:parameters()) do em.no_grad(function() p:zero_() end) end
    local rest = load({ model = back })
    H.eq(rest.step, 1, 'the first checkpoint is the one on disk')
    H.check(same_params(back, small), 'and it holds the first model\'s values')
    save({ model = small, step = 3 })
    H.eq(load({ model = back }).step, 3, 'a checkpoint that fits saves again')
  end)
end

if variant == 'plain' then       -- one file
  local path = dir .. '/plain.ckpt'
  disk_full('em.checkpoint.save', function(state) em.checkpoint.save(path, state) end,
    function(objects) return em.checkpoint.load(path, objects) end, path)
else                             -- a folder, every replica writing its share
  local s = em.distribute.mirrored{ timeout = 60 }
  local path = dir .. '/sharded'
  disk_full('a sharded em.checkpoint.save', function(state)
    local dm = s:wrap(state.model, { shard = 'gradients' })
    em.checkpoint.save(path, { model = dm, step = state.step })
  end, function(objects) return em.checkpoint.load(path, objects) end, path)
end

H.done()
