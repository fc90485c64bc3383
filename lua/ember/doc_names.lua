--[[
ember.doc_names -- every public name of ember, as the reference spells it
(docs/reference/README.md gives the rules): what the coverage test checks the
reference against and what help() maps values back through.

  local N = require 'ember.doc_names'
  N.names()        -> sorted list of canonical names ('em.sum', 'em.nn.F.relu',
                      'Tensor:matmul', 'Tensor.shape', 'Module:parameters',
                      'em_version', 'help', ...)
  N.values()       -> map from a function or table to the list of names it has
  N.PACKAGES, N.CLASSES   the packages and classes whose names are public
  N.canonical(name) -> a heading's spelling made canonical
  N.also_allowed(name) -> whether a heading may name it though it is no public
                      name (a package as a whole; a type or constant of ember.h)

A name is public when it does not start with '_'. The packages are read at run
time (their tables, so a function added to em.nn is listed without a change
here); so are the classes whose tables users can reach (em.Tensor, em.nn.Module,
...). The classes whose tables stay local to their modules (what a public call
returns: a loader, a pipeline, a plan, ...) are read from their source files:
each `function Class:name` or `Class.name = ` there. Each em.nn layer adds the
methods it has beyond Module's (Sequential:add) and its own class fields
(Checkpoint.transparent). The C functions are the
`em_...(` declarations of ember.h, read from the build's cdefs.lua (ember.h
without its preprocessor lines) or from the header in a source tree.
]]
local M = {}

local function em() return require 'ember' end
local here = (debug.getinfo(1, 'S').source:match('^@(.*)/[^/]*$') or '.')

local function public(k) return type(k) == 'string' and k:match('^[%a][%w_]*$') ~= nil end

-- The packages: canonical prefix and how to reach the table. em.nn.functional is
-- em.nn.F (one table); em.data.T loads its table on first use, so it is required.
M.PACKAGES = {
  { 'em.nn', function() return em().nn end, skip = { F = true, functional = true, init = true, utils = true } },
  { 'em.nn.F', function() return em().nn.F end },
  { 'em.nn.init', function() return em().nn.init end },
  { 'em.nn.utils', function() return em().nn.utils end },
  { 'em.optim', function() return em().optim end },
  { 'em.data', function() return em().data end, skip = { T = true } },
  { 'em.data.T', function() return require 'ember.data.transforms' end },
  { 'em.distribute', function() return em().distribute end },
  { 'em.profile', function() return em().profile end },
  { 'em.cuda', function() return em().cuda end },
  { 'em.amp', function() return em().amp end },
  { 'em.checkpoint', function() return em().checkpoint end },
  { 'em.autograd', function() return em().autograd end },
}

-- The classes users hold, by the name the docs use.
--   get:    the method table, where users can reach it;
--   fields: computed fields (t.shape), named Class.field;
--   files, tbl: where the class is local to its module: the source files (under
--           lua/ember/) and the table's name there;
--   data:   plain fields users read (named Class.field).
M.CLASSES = {
  { 'Tensor', get = function() return em().Tensor end,
    fields = function() local _ = em().version; return require('ember.ffi').getters end },
  -- m.training (train/eval set it) and a subclass's Class.super
  { 'Module', get = function() return em().nn.Module end, data = { 'training', 'super' } },
  -- opt.lr (the first group's rate), opt.param_groups, opt.state, opt.defaults
  { 'Optimizer', get = function() return em().optim.Optimizer end,
    data = { 'lr', 'param_groups', 'state', 'defaults' } },
  { 'Dataset', get = function() return em().data.Dataset end },
  { 'Strategy', get = function() return em().distribute.Strategy end },
  -- what ds:loader() returns
  { 'Loader', files = { 'data/loader.lua' }, tbl = 'Loader' },
  -- what an async collective (s:allreduce(t, {async = true}), ...) returns
  { 'Work', files = { 'distribute/comm.lua' }, tbl = 'Work' },
  -- s:pipeline(model, opts)
  { 'Pipeline', files = { 'distribute/pipeline.lua', 'distribute/pipeline/run.lua',
      'distribute/pipeline/state.lua' }, tbl = 'Pipeline' },
  -- em.distribute.plan(model, opts)
  { 'Plan', files = { 'distribute/plan.lua' }, tbl = 'Plan' },
  -- s:wrap(model): the replicated model; s:shard(model, opts): the sharded one
  { 'DistributedModel', files = { 'distribute/wrap.lua' }, tbl = 'DistributedModel' },
  { 'ShardedModel', files = { 'distribute/shard.lua' }, tbl = 'Sharded' },
  -- em.amp.GradScaler(opts)
  { 'GradScaler', files = { 'amp/scaler.lua' }, tbl = 'Scaler' },
  -- em.compile(fn): the compiled step
  { 'Compiled', files = { 'compile.lua' }, tbl = 'Compiled' },
  -- em.cuda.graph(fn)
  { 'Graph', files = { 'cuda.lua' }, tbl = 'Graph' },
  -- em.profile.stop() / em.profile.last()
  { 'Report', files = { 'profile/report.lua' }, tbl = 'Report', data = { 'diagnosis' } },
  -- every em.optim learning-rate schedule (StepLR, OneCycleLR, ...); each
  -- schedule class defines get_lr and closed_form_lr for itself
  { 'Scheduler', files = { 'optim/lr_scheduler.lua' }, tbl = 'Scheduler',
    methods = { 'get_lr', 'closed_form_lr' } },
  { 'ReduceLROnPlateau', methods = { 'is_better' } },
  -- an em.data.T transform (its method table is built in data/transforms.lua)
  { 'Transform', methods = { 'name' } },
}

-- Names that are no field of em: the REPL's and `ember -e`'s globals.
M.GLOBALS = { 'help' }

local function read(path)
  local f = io.open(path, 'rb')
  if not f then return nil end
  local s = f:read('*a')
  f:close()
  return s
end

-- `function T:name(`, `function T.name(` and `T.name = ` in a source file: methods
-- (Class:name), and constants in capitals (Class.NAME).
local function source_methods(path, tbl, out)
  local text = read(here .. '/' .. path)
  if not text then error('ember.doc: cannot read ' .. here .. '/' .. path, 0) end
  for line in text:gmatch('[^\n]+') do
    local k = line:match('^function ' .. tbl .. '[:.](%l[%w_]*)%s*%(')
           or line:match('^' .. tbl .. '%.(%l[%w_]*)%s*=')
    if k then out[k] = ':' end
    k = line:match('^' .. tbl .. '%.(%u[%u%d_]*)%s*=')
    if k then out[k] = '.' end
  end
end

-- The C functions of ember.h: declarations `type em_name(`, comments and
-- preprocessor lines left out (a function-pointer type `(*em_x)(` is no function:
-- a `)` follows its name).
local function c_functions(out)
  local text = read(here .. '/cdefs.lua') or read(here .. '/../../core/include/ember.h')
  if not text then
    local p = package.searchpath('ember.cdefs', package.path)
    text = p and read(p)
  end
  if not text then error('ember.doc: found neither cdefs.lua nor ember.h beside ' .. here, 0) end
  text = text:gsub('/%*.-%*/', ' '):gsub('//[^\n]*', ' ')
  text = text:gsub('\n#[^\n]*', '\n')
  for name in text:gmatch('[^%w_]%s*(em_[%w_]+)%s*%(') do out[name] = true end
  out.luaopen_ember = true
end

local cached_names, cached_values, cached_c_extra

local function add_value(values, v, name)
  if type(v) ~= 'function' and type(v) ~= 'table' then return end
  local l = values[v]
  if not l then l = {}; values[v] = l end
  for _, n in ipairs(l) do if n == name then return end end
  l[#l + 1] = name
end

local function build()
  local E = em()
  local _ = E.version                     -- em loads lazily: its core fields exist now
  local set, values = {}, {}
  local function add(name, v) set[name] = true; add_value(values, v, name) end
  local modules = {}
  for _, p in ipairs(M.PACKAGES) do
    local t = p[2]()
    modules[t] = true
    for k, v in pairs(t) do
      if public(k) and not (p.skip and p.skip[k]) then add(p[1] .. '.' .. k, v) end
    end
    add_value(values, t, p[1])
  end
  -- em's own fields (after the packages loaded: one of them may add some), less
  -- the subpackages (any table that is a loaded ember.* module) and em.Tensor
  for k, v in pairs(E) do
    if public(k) and k ~= 'Tensor' and not modules[v]
       and not (type(v) == 'table' and package.loaded['ember.' .. k] == v) then
      add('em.' .. k, v)
    end
  end
  add_value(values, E, 'em')
  for _, c in ipairs(M.CLASSES) do
    local cls = c[1]
    if c.get then
      local t = c.get()
      add_value(values, t, cls)
      for k, v in pairs(t) do
        if public(k) and type(v) == 'function' then add(cls .. ':' .. k, v) end
      end
      if c.fields then
        for k in pairs(c.fields()) do if public(k) then set[cls .. '.' .. k] = true end end
      end
    elseif c.files then
      local found = {}
      for _, f in ipairs(c.files) do source_methods(f, c.tbl, found) end
      for k, sep in pairs(found) do
        if public(k) then set[cls .. sep .. k] = true end
      end
    end
    for _, k in ipairs(c.data or {}) do set[cls .. '.' .. k] = true end
    for _, k in ipairs(c.methods or {}) do set[cls .. ':' .. k] = true end
  end
  -- em.nn's layers: the methods a layer adds to Module's (Sequential:add, ...)
  -- and its own class fields (Checkpoint.transparent; super is Module.super)
  local Module = E.nn.Module
  local hooks = { forward = true, init = true, extra_repr = true }   -- Module's, overridden
  for k, cls in pairs(E.nn) do
    if public(k) and type(cls) == 'table' and cls ~= Module and rawget(cls, '__name') then
      for name, v in pairs(cls) do
        if public(name) and type(v) == 'function' and v ~= Module[name] and not hooks[name] then
          add(k .. ':' .. name, v)
        elseif public(name) and type(v) ~= 'function' and name ~= 'super' then
          set[k .. '.' .. name] = true
        end
      end
    end
  end
  local cfuncs = {}
  c_functions(cfuncs)
  for k in pairs(cfuncs) do set[k] = true end
  for _, g in ipairs(M.GLOBALS) do set[g] = true end
  local list = {}
  for k in pairs(set) do list[#list + 1] = k end
  table.sort(list)
  return list, values
end

function M.names()
  if not cached_names then cached_names, cached_values = build() end
  return cached_names
end

function M.values()
  M.names()
  return cached_values
end

-- The canonical spelling of a name as a heading may write it: em.nn.functional.x
-- is em.nn.F.x, and Class.f is Class:f for a method called without self
-- (Module.is_module(x)).
function M.canonical(name)
  local set = M.set()
  name = name:gsub('^em%.nn%.functional%.', 'em.nn.F.'):gsub('^em%.nn%.functional$', 'em.nn.F')
  if not set[name] then
    local colon = name:gsub('^(%u[%w_]*)%.', '%1:')
    if set[colon] then return colon end
  end
  return name
end

local cached_set
function M.set()
  if not cached_set then
    cached_set = {}
    for _, n in ipairs(M.names()) do cached_set[n] = true end
  end
  return cached_set
end

-- What a heading may name besides the public names: a package or class as a whole
-- (em.nn.F, em.Tensor), and the types and constants of ember.h (em_state, EM_CPU).
function M.also_allowed(name)
  if name == 'em' or name == 'em.Tensor' or M.container(name) then return true end
  if not cached_c_extra then
    cached_c_extra = {}
    local text = read(here .. '/../../core/include/ember.h') or read(here .. '/cdefs.lua') or ''
    text = text:gsub('/%*.-%*/', ' '):gsub('//[^\n]*', ' ')
    for w in text:gmatch('[%w_]+') do
      if w:match('^em_') or w:match('^EM_') then cached_c_extra[w] = true end
    end
  end
  return cached_c_extra[name] == true
end

-- Whether name is a package ('em.nn') or a class ('Module'), and its members'
-- prefix ('em.nn.' or 'Module').
function M.container(name)
  if name == 'em' then return 'em.' end
  for _, p in ipairs(M.PACKAGES) do if p[1] == name then return name .. '.' end end
  for _, c in ipairs(M.CLASSES) do if c[1] == name then return name end end
  return nil
end

return M
