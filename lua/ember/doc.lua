--[[
ember.doc -- help(x) and `ember --doc NAME`: the reference's entry for a name,
read at run time from docs/reference/README.md and the pages it links to.

  local doc = require 'ember.doc'
  doc.help(em.sum)              prints the entry of em.sum (and Tensor:sum)
  doc.help('Conv2d')            a name, whole ('em.nn.Conv2d', 'Tensor:matmul'),
                                without its em. ('nn.Conv2d') or, if unique, its
                                last part ('Conv2d')
  doc.help(em.distribute)       a package or class: what it holds, each with the
                                first sentence of its entry
  doc.help(model), doc.help(t)  an instance: its class (a layer's entry and methods;
                                a user's Module subclass: Module's), a tensor: Tensor's
  doc.lookup(x)                 -> text, true when found (else a message, false)
  doc.names()                   every public name (ember.doc_names)
  doc.entries()                 -> {name -> entry}, entry = {names, text, page, line}
  doc.dir()                     where the docs are, or nil and the places looked

The docs are found at EMBER_DOCS if set, else relative to this file: beside it
(ember/docs/, the luarocks install), the checkout's docs/ from lua/ember/ or
build/lua/ember/, or <prefix>/share/doc/ember from an install's
<prefix>/share/lua/5.1/ember/. The entry format is docs/reference/README.md's:
`### ` and one or more names in backticks, separated by ", "; an entry runs
to the next heading of level 1 to 3.
]]
local N = require 'ember.doc_names'
local parse = require 'ember.doc_parse'
local M = {}

M.names = N.names
M.parse = parse.entries

local here = (debug.getinfo(1, 'S').source:match('^@(.*)/[^/]*$') or '.')

local function exists(path)
  local f = io.open(path, 'rb')
  if f then f:close() return true end
  return false
end

-- -- Where the docs are ------------------------------------------------------------------
-- a/b/../c -> a/c, for the paths help shows
local function clean(p)
  local n
  repeat p, n = p:gsub('/([^/]+)/%.%./', function(d) return d == '..' and nil or '/' end) until n == 0
  return p
end

function M.dir()
  local tried = {}
  local env = os.getenv('EMBER_DOCS')
  if env and env ~= '' then
    if exists(env .. '/reference/README.md') then return env end
    return nil, { env .. ' (EMBER_DOCS)' }
  end
  for _, d in ipairs({ here .. '/docs', here .. '/../../docs', here .. '/../../../docs',
                       here .. '/../../../doc/ember' }) do
    d = clean(d)
    if exists(d .. '/reference/README.md') then return d end
    tried[#tried + 1] = d
  end
  return nil, tried
end

-- -- The entries ----------------------------------------------------------------------------
local cache

-- {name -> entry} of the reference: its index page and the pages that links to;
-- nil and a message when there are no docs.
function M.entries()
  if cache then return cache end
  local dir, tried = M.dir()
  if not dir then
    return nil, 'the reference was not found (looked in ' .. table.concat(tried, ', ') ..
      '); set EMBER_DOCS to the docs folder'
  end
  local index = {}
  local f = io.open(dir .. '/reference/README.md', 'rb')
  local pages = parse.index_pages(f and f:read('*a') or '')
  if f then f:close() end
  table.insert(pages, 1, 'README.md')
  for _, file in ipairs(pages) do
    local f = io.open(dir .. '/reference/' .. file, 'rb')
    if f then
      local text = f:read('*a')
      f:close()
      for _, e in ipairs(parse.entries(text, 'reference/' .. file)) do
        for _, n in ipairs(e.names) do
          n = N.canonical(n)
          if not index[n] then index[n] = e end
        end
      end
    end
  end
  cache = index
  return cache
end

-- -- Resolving what the user asked for ------------------------------------------------

local function last_part(n) return n:match('[%.:]([^%.:]+)$') or n end

-- The canonical names a string means; the second result is a container
-- ('em.nn.' or 'Module') when it names a package or class.
local function resolve(s)
  s = s:gsub('^%s+', ''):gsub('%s+$', ''):gsub('%(%)$', '')
  s = s:gsub('^em%.nn%.functional%.', 'em.nn.F.'):gsub('^nn%.functional%.', 'nn.F.')
  local set = N.set()
  for _, cand in ipairs({ s, 'em.' .. s }) do
    if N.container(cand) then return {}, cand end
  end
  if s == 'nn.functional' or s == 'em.nn.functional' then return {}, 'em.nn.F' end
  for _, cand in ipairs({ s, 'em.' .. s, (s:gsub('^Tensor%.', 'Tensor:')),
                          (s:gsub('^[%w_]+:', 'Tensor:')) }) do
    if set[cand] then return { cand } end
  end
  -- the last part alone: 'Conv2d', 'matmul', ':matmul'
  local tail = s:match('^:?([%w_]+)$') or s:match('^[%w_]+:([%w_]+)$')
  local out = {}
  if tail then
    for n in pairs(set) do if last_part(n) == tail then out[#out + 1] = n end end
    table.sort(out)
  end
  return out
end

-- Edit distance, for the close matches of an unknown name.
local function distance(a, b)
  local prev, cur = {}, {}
  for j = 0, #b do prev[j] = j end
  for i = 1, #a do
    cur[0] = i
    for j = 1, #b do
      local cost = a:byte(i) == b:byte(j) and 0 or 1
      cur[j] = math.min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + cost)
    end
    prev, cur = cur, prev
  end
  return prev[#b]
end

-- Up to n names close to s: by edit distance of the whole name or of its last part,
-- or holding s.
function M.close_matches(s, n)
  s = s:lower()
  local tail = last_part(s)
  local scored = {}
  for _, name in ipairs(N.names()) do
    local low = name:lower()
    local d = math.min(distance(s, low), distance(tail, last_part(low)))
    if #tail >= 3 and low:find(tail, 1, true) then d = math.min(d, 1) end
    if d <= math.max(2, math.floor(#tail / 3)) then scored[#scored + 1] = { name, d } end
  end
  table.sort(scored, function(x, y)
    if x[2] ~= y[2] then return x[2] < y[2] end
    return x[1] < y[1]
  end)
  local out = {}
  for i = 1, math.min(n or 8, #scored) do out[i] = scored[i][1] end
  return out
end

-- The names and the container a value stands for.
local function of_value(x)
  local values = N.values()
  local all = values[x]
  if not all and type(x) == 'table' then
    -- an instance (a model, a layer): its class, or the nearest ember class above
    -- a class of the user's own (Net = em.nn.Module:extend('Net'))
    local cls = getmetatable(x)
    for _ = 1, 16 do
      if type(cls) ~= 'table' then break end
      if values[cls] then return of_value(cls) end
      cls = rawget(cls, 'super')
    end
  end
  if not all then return nil end
  local names, container = {}, nil
  for _, n in ipairs(all) do
    if N.container(n) then container = container or n else names[#names + 1] = n end
  end
  if container or type(x) ~= 'table' or #names == 0 then return names, container end
  -- an em.nn layer (em.nn.Sequential): its entry and the methods it adds
  local cls = last_part(names[1])
  for _, n in ipairs(N.names()) do
    if n:sub(1, #cls + 1) == cls .. ':' then return names, cls end
  end
  return names
end

-- -- What help prints ---------------------------------------------------------------------
local function listing(container, entries)
  local prefix = N.container(container) or container
  local sep = prefix:sub(-1) == '.' and '' or '[:.]'
  local rows, width = {}, 0
  for _, n in ipairs(N.names()) do
    local rest = n:sub(#prefix + 1)
    if n:sub(1, #prefix) == prefix and rest ~= '' and
       (sep == '' and not rest:find('[%.:]') or
        sep ~= '' and rest:match('^[:.][%w_]+$')) then
      rows[#rows + 1] = n
      width = math.max(width, #n)
    end
  end
  local out = {}
  local subs = {}
  for _, p in ipairs(N.PACKAGES) do
    if p[1]:sub(1, #container + 1) == container .. '.' and
       not p[1]:sub(#container + 2):find('.', 1, true) then
      subs[#subs + 1] = p[1]
    end
  end
  if #subs > 0 then out[#out + 1] = 'packages: ' .. table.concat(subs, ', ') end
  out[#out + 1] = ('%s holds %d names:'):format(container, #rows)
  for _, n in ipairs(rows) do
    local e = entries and entries[n]
    local first = e and parse.first_sentence(e.text) or '(no entry yet)'
    out[#out + 1] = ('  %-' .. width .. 's  %s'):format(n, first)
  end
  return table.concat(out, '\n')
end

-- The text help prints for x, and whether x was found.
function M.lookup(x)
  local names, container
  local what
  if type(x) == 'string' then
    what = x
    names, container = resolve(x)
  elseif type(x) == 'cdata' and require('ember').is_tensor(x) then
    what, names, container = 'Tensor', {}, 'Tensor'
  elseif type(x) == 'function' or type(x) == 'table' then
    names, container = of_value(x)
    if not names then
      return ('%s is no public ember value (give its name as a string: help(\'em.sum\'))')
               :format(tostring(x)), false
    end
    what = container or names[1]
  elseif x == nil then
    return "got nil -- a misspelt name is nil; give the name as a string: help('em.sum')", false
  else
    return ('help(x): expected a function, table or name, got a %s'):format(type(x)), false
  end
  local entries, err = M.entries()
  if not entries and #names > 0 then return err, false end
  local parts, seen = {}, {}
  for _, n in ipairs(names) do
    local e = entries[n]
    if e and not seen[e] then
      seen[e] = true
      parts[#parts + 1] = e
    end
  end
  if container then
    local text = listing(container, entries)
    if #parts > 0 then text = parts[1].text .. '\n\n' .. text end
    return text, true
  end
  if #parts == 1 then
    return parts[1].text .. ('\n(%s:%d)'):format(parts[1].page, parts[1].line), true
  end
  if #parts > 1 then
    local out = { ("'%s' names %d entries:"):format(what, #parts) }
    for _, e in ipairs(parts) do
      out[#out + 1] = ('  %s  %s'):format(table.concat(e.names, ', '), parse.first_sentence(e.text))
    end
    return table.concat(out, '\n'), true
  end
  if #names > 0 then
    return ('%s is public, but the reference has no entry for it yet'):format(
      table.concat(names, ', ')), false
  end
  local close = M.close_matches(what)
  if #close == 0 then return ("no public name '%s'"):format(what), false end
  return ("no public name '%s'; close: %s"):format(what, table.concat(close, ', ')), false
end

local USAGE = [[
help(x) prints the reference's entry for x:
  help(em.sum)          a function or table of ember
  help('Tensor:matmul') a name: whole, without its em. ('nn.Conv2d'), or its
                        last part when that is unique ('Conv2d')
  help(em.nn)           a package or class (em.distribute, 'Module', 'Pipeline'):
                        what it holds, with each entry's first sentence
  help(em)              every package and top-level name
  help(model), help(t)  a layer's or model's class, a tensor's methods
From the shell: ember --doc NAME. The reference: docs/reference/README.md.]]

function M.help(...)
  if select('#', ...) == 0 then
    io.write(USAGE, '\n')
    return
  end
  local text = M.lookup((...))
  io.write(text, '\n')
end

-- `ember --doc NAME`: the entry on stdout and 0, or the message on stderr and 1.
function M.cli(name)
  local text, found = M.lookup(name)
  if found then
    io.write(text, '\n')
    return 0
  end
  io.stderr:write(text, '\n')
  return 1
end

return M
