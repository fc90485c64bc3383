--[[
test_doc_coverage.lua -- the reference covers ember's public names, and only them.

Every name of ember.doc_names.names() (em's fields and packages, the methods and
fields of the classes users hold, the C functions of ember.h, the help global)
must appear in some `### ` heading of docs/reference/*.md, and every name in
such a heading must be public (or a package as a whole, or a type or constant
of ember.h) (a heading naming something since renamed or
removed is stale). Each failing check lists all its names, page by page for the
stale ones. The index, reference/README.md, links every page (help reads the
pages it links). First, the parts they rest on: the heading parser (several names,
headings inside code blocks ignored) and the spellings a heading may use
(em.nn.functional.x, Class.f for a method called without self).
]]
local dir = (arg and arg[0] and arg[0]:match('^(.*/)')) or
            ((os.getenv('EMBER_TESTS') or 'tests') .. '/lua/')
local H = dofile(dir .. 'harness.lua')
local em = require 'ember'
local N = require 'ember.doc_names'
local parse = require 'ember.doc_parse'

local root = dir:match('^(.*)tests/lua/$') or (dir .. '../../')
if root == '' then root = './' end

H.test('headings and names', function()
  local es = parse.entries(table.concat({
    '# Page', '## Group',
    '### `em.sum`, `Tensor:sum` (and more words)', '`em.sum(t)`', '', 'Sums.',
    '```lua', '### `not.a.heading`', '```',
    '### Not an entry', 'text',
    '### `em.nn.functional.relu`, `Module.is_module`', 'x',
  }, '\n'), 'p.md')
  H.eq(#es, 2)
  H.eq(es[1].names, { 'em.sum', 'Tensor:sum' })
  H.eq(es[1].line, 3)
  H.check(es[1].text:find('Sums.', 1, true) and not es[1].text:find('Not an entry', 1, true))
  H.eq(parse.first_sentence(es[1].text), 'Sums.')
  H.eq(N.canonical(es[2].names[1]), 'em.nn.F.relu')
  H.eq(N.canonical(es[2].names[2]), 'Module:is_module')
  H.eq(N.canonical('Tensor.shape'), 'Tensor.shape')
end)

H.test('the public names', function()
  local set = N.set()
  for _, n in ipairs({ 'em.sum', 'em.float32', 'em.nn.Linear', 'em.nn.F.relu', 'em.nn.init.zeros_',
                       'em.optim.SGD', 'em.data.T.normalize', 'em.distribute.mirrored',
                       'em.compile', 'Tensor:matmul', 'Tensor.shape', 'Tensor.grad',
                       'Module:parameters', 'Sequential:add', 'Optimizer:step', 'Dataset:loader',
                       'Loader:epoch', 'Strategy:allreduce', 'Pipeline:step', 'Plan:apply',
                       'GradScaler:scale', 'em_version', 'luaopen_ember', 'help' }) do
    H.check(set[n], n .. ' is a public name')
  end
  for _, n in ipairs({ 'em.Tensor', 'em.nn', 'em.nn.F', 'em.nn.functional', 'em.nn.functional.relu',
                       'em.autograd', 'em.data.T', 'Tensor:__index' }) do
    H.check(not set[n], n .. ' is no name of its own')
  end
  local private = {}
  for n in pairs(set) do
    if n:match('[%.:]_') or n:match('^_') then private[#private + 1] = n end
  end
  H.check(#private == 0, 'names starting with _: ' .. table.concat(private, ', '))
  H.check(N.values()[em.sum][1] == 'em.sum')
end)

-- The headings of the reference: name -> {page, ...} (EMBER_DOCS: another docs folder).
local docs = (os.getenv('EMBER_DOCS') or root .. 'docs') .. '/reference'
local headings = {}
for _, file in ipairs(parse.list_md(docs)) do
  local text = H.read(docs .. '/' .. file)
  for _, e in ipairs(parse.entries(text, file)) do
    for _, n in ipairs(e.names) do
      local c = N.canonical(n)
      headings[c] = headings[c] or {}
      table.insert(headings[c], ('%s:%d'):format(file, e.line))
    end
  end
end

H.test('the index links every page of the reference', function()
  local index = H.read(docs .. '/README.md') or ''
  local linked = {}
  for _, f in ipairs(parse.index_pages(index)) do
    linked[f] = true
    H.check(H.read(docs .. '/' .. f) ~= nil, 'the index links ' .. f .. ', which is missing')
  end
  for _, f in ipairs(parse.list_md(docs)) do
    H.check(f == 'README.md' or linked[f],
            f .. ' is not linked from reference/README.md (help reads only the linked pages)')
  end
end)

H.test('every public name has an entry', function()
  local missing = {}
  for _, n in ipairs(N.names()) do
    if not headings[n] then missing[#missing + 1] = n end
  end
  H.check(#missing == 0, ('%d of %d public names have no heading in docs/reference:\n    %s')
    :format(#missing, #N.names(), table.concat(missing, '\n    ')))
end)

H.test('every heading names a public name', function()
  local set, stale = N.set(), {}
  for n, where in pairs(headings) do
    if not set[n] and not N.also_allowed(n) then stale[#stale + 1] = ('%s (%s)'):format(n, table.concat(where, ', ')) end
  end
  table.sort(stale)
  H.check(#stale == 0, ('%d heading names are not public names:\n    %s')
    :format(#stale, table.concat(stale, '\n    ')))
end)

H.done()
