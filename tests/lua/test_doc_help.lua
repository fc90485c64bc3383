--[[
test_doc_help.lua -- help(x) and `ember --doc NAME` read the reference's entries:
on a planted docs folder (EMBER_DOCS), a value maps back to its entry (em.sum and
t.sum's method to one entry, em.nn.functional to em.nn.F), a name is found whole,
without its em., by its unique last part, with '.' for ':'; a package or class
lists its names with their entries' first sentences; an unknown name gets close
matches; a public name without an entry says so. `ember --doc` exits 0 or 1
accordingly, help() alone prints its usage, the global help exists in
`ember -e` code, and the REPL completes names inside help('...'). Then the docs are found without EMBER_DOCS (beside the Lua files).
]]
local dir = (arg and arg[0] and arg[0]:match('^(.*/)')) or
            ((os.getenv('EMBER_TESTS') or 'tests') .. '/lua/')
local H = dofile(dir .. 'harness.lua')
local ember = arg[-1] or 'ember'

local docs = H.tmpdir()
os.execute(("mkdir -p '%s/reference'"):format(docs))
local f = assert(io.open(docs .. '/reference/README.md', 'w'))
f:write([[
# Planted reference
## Reductions
### `em.sum`, `Tensor:sum` (an op and its method)
`em.sum(t [, dim]) -> Tensor`

Sums the elements of t. More words here.

```lua
print(em.sum(em.ones(2)))
```
### `em.nn.Conv2d`
`em.nn.Conv2d(cin, cout, k [, opts])`

A 2-D convolution layer.

### `em.nn.Module`
`em.nn.Module`

The base class of every layer.

### `Module:parameters`
`m:parameters() -> {Tensor}`

The trainable tensors of m.
## Packages
### `em.nn.F.relu`
`em.nn.F.relu(x)`

Rectified linear unit.

    ### `em.not_a_heading`
]])
f:close()

local function run(cmd)
  return H.sh(("EMBER_DOCS='%s' %s 2>&1"):format(docs, cmd))
end
local function help_of(expr)
  return run(("%s -e \"help(%s)\""):format(ember, expr))
end

H.test('a value or a name finds its entry', function()
  for _, expr in ipairs({ 'em.sum', 'em.Tensor.sum', "'em.sum'", "'sum'", "'Tensor:sum'",
                          "'Tensor.sum'", "'t:sum'" }) do
    local out = help_of(expr)
    H.check(out:find('### `em.sum`, `Tensor:sum`', 1, true) and out:find('Sums the elements', 1, true)
            and out:find('(reference/README.md:3)', 1, true), 'help(' .. expr .. '): ' .. out)
  end
  for _, expr in ipairs({ 'em.nn.Conv2d', "'nn.Conv2d'", "'Conv2d'", "'em.nn.Conv2d'" }) do
    local out = help_of(expr)
    H.check(out:find('A 2-D convolution layer.', 1, true), 'help(' .. expr .. '): ' .. out)
  end
  H.check(help_of('em.nn.functional.relu'):find('Rectified', 1, true))
  H.check(help_of("'em.nn.functional.relu'"):find('Rectified', 1, true))
end)

H.test('a package or class lists what it holds', function()
  local out = help_of('em.nn.Module')
  H.check(out:find('The base class of every layer.', 1, true), out)
  H.check(out:find('Module:parameters%s+The trainable tensors of m%.'), out)
  H.check(out:find('Module:zero_grad%s+%(no entry yet%)'), out)
  out = help_of('em.nn')
  H.check(out:find('packages: em.nn.F, em.nn.init, em.nn.utils', 1, true), out)
  H.check(out:find('em.nn.Conv2d%s+A 2%-D convolution layer%.'), out)
  H.check(not out:find('em.nn.F.relu', 1, true), 'only em.nn\'s own names: ' .. out)
  out = help_of('em.nn.F')
  H.check(out:find('em.nn.F.relu%s+Rectified linear unit%.'), out)
  out = help_of('em.nn.Conv2d(1, 1, 1)')
  H.check(out:find('A 2-D convolution layer.', 1, true), 'a layer: its class: ' .. out)
  out = help_of("em.nn.Module:extend('Net')()")
  H.check(out:find('The base class of every layer.', 1, true), 'a model: Module: ' .. out)
  out = help_of('em.ones(2)')
  H.check(out:find('Tensor:sum%s+Sums the elements of t%.'), 'a tensor: Tensor: ' .. out)
  out = help_of("'Pipeline'")
  H.check(out:find('Pipeline:step', 1, true), out)
end)

H.test('an unknown name, a name without an entry, nil', function()
  local out = help_of("'cnov2d'")
  H.check(out:find("no public name 'cnov2d'; close: em.nn.Conv2d", 1, true), out)
  out = help_of("'em.not_a_heading'")
  H.check(out:find("no public name", 1, true), 'an indented heading is no entry: ' .. out)
  out = help_of("'em.mean'")
  H.check(out:find('em.mean is public, but the reference has no entry for it yet', 1, true), out)
  out = help_of('em.nn.Linear')
  H.check(out:find('^em.nn.Linear is public, but'), out)
  out = help_of('em.no_such_thing')
  H.check(out:find('got nil', 1, true), out)
  out = help_of('')
  H.check(out:find('help(x) prints the reference', 1, true) and out:find('ember --doc NAME', 1, true), out)
end)

H.test('ember --doc', function()
  local out, rc = run(ember .. ' --doc Tensor:sum')
  H.eq(rc, 0)
  H.check(out:find('Sums the elements', 1, true), out)
  out, rc = run(ember .. ' --doc em.nn')
  H.eq(rc, 0)
  out, rc = run(ember .. ' --doc cnov2d')
  H.eq(rc, 1)
  H.check(out:find('close: em.nn.Conv2d', 1, true), out)
  out, rc = run(ember .. ' --doc em.mean')
  H.eq(rc, 1)
  out, rc = run(ember .. ' --doc')
  H.eq(rc, 1)
  H.check(out:find('--doc needs a name', 1, true), out)
  out = H.sh(ember .. ' --help')
  H.check(out:find('--doc NAME', 1, true), out)
end)

H.test("the REPL completes the reference's names inside help('...')", function()
  local repl = require 'ember.repl'
  H.eq(repl.complete('em.nn.Con', "help('em.nn.Con"), { 'em.nn.Conv1d', 'em.nn.Conv2d' })
  H.eq(repl.complete('Tensor:matm', 'help("Tensor:matm'), { 'Tensor:matmul' })
  H.eq(repl.complete('em.zeros_l', 'x = em.zeros_l'), { 'em.zeros_like' })
end)

H.test('the docs are found beside the Lua files', function()
  local doc = require 'ember.doc'
  local saved = os.getenv('EMBER_DOCS')
  H.check(saved == nil or saved == '', 'run without EMBER_DOCS set')
  local d = doc.dir()
  H.check(d ~= nil and H.read(d .. '/reference/README.md') ~= nil, tostring(d))
  local text, found = doc.lookup('help')
  H.check(found and text:find('### `help`', 1, true), text)
end)

H.done()
