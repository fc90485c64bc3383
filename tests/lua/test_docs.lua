--[[
test_docs.lua -- every code block of the docs runs and prints what its page says:
tools/doctest.lua over docs/**/*.md and README.md, one check per page (its
blocks all ran, none failed; the doctest's lines for the page are printed, FAIL
page:line: error for each failure) and one skip per `lua norun` block or block
that cannot run here (mpi=N without mpirun), with its reason.

First the doctest itself, on a planted page: it runs lua blocks in one state
per page (globals carry over), compares output blocks, runs gpu blocks on the
emulated CUDA device, whole scripts with --replicas, under mpirun (or skips
them, saying so) and alone, compiles and runs a `c run` block, counts norun
blocks as skipped with their first comment line, and names page:line on a
failure.
]]
local dir = (arg and arg[0] and arg[0]:match('^(.*/)')) or
            ((os.getenv('EMBER_TESTS') or 'tests') .. '/lua/')
local H = dofile(dir .. 'harness.lua')
local em = require 'ember'

local root = dir:match('^(.*)tests/lua/$') or (dir .. '../../')
if root == '' then root = './' end
local ember = arg[-1] or 'ember'
local doctest = root .. 'tools/doctest.lua'

local function doctest_on(files)
  local q = {}
  for i, f in ipairs(files) do q[i] = ("'%s'"):format(f:gsub("'", "'\\''")) end
  return H.sh(('%s %s %s 2>&1'):format(ember, doctest, table.concat(q, ' ')))
end

H.test('the doctest on a planted page', function()
  local d = H.tmpdir()
  local page = d .. '/planted.md'
  local f = assert(io.open(page, 'w'))
  f:write([[
# Planted
```lua
x = em.tensor({1, 2, 3})
print(x:sum():item())
```
```output
6
```
```lua
print(x[2] + 1)
```
```output
3
```
```lua
print('wrong')
```
```output
right
```
```lua norun
-- a fragment: the reader's own model
model:train()
```
```lua
local t = nil
t.field = 1
```
```lua gpu
print(em.ones(2, {device = 'cuda'}):sum():item(), x)
```
```output
2	nil
```
```lua replicas=2
local s = em.distribute.mirrored()
print(s.world_size)
```
```output
2
[rank 1] 2
```
```lua fresh
error('fresh fails')
```
```lua mpi=2
print(em.distribute.replica())
```
```output
[rank 1] 1
0
```
```c run
#include <stdio.h>
#include "ember.h"
int main(void) { printf("ember %s\n", em_version()); return 0; }
```
```output
ember 0.0.0
```
```sh
this is not run
```
]])
  f:close()
  local out, rc = doctest_on({ page })
  H.eq(rc, 1, 'a failing page fails the run')
  local mpi = H.sh('command -v mpirun') ~= ''
  H.check(out:find(page .. (mpi and ': 9 run, 4 failed, 1 skipped' or ': 8 run, 4 failed, 2 skipped'),
                   1, true), out)
  H.check(out:find('FAIL ' .. page .. ':53: output differs\n--- expected\nember 0.0.0\n--- got\nember '
                   .. em.version, 1, true), 'a c run block compiled, ran and compared: ' .. out)
  if not mpi then H.check(out:find('skip ' .. page .. ':46: mpirun is not installed', 1, true), out) end
  H.check(out:find('FAIL ' .. page .. ':15: output differs', 1, true), 'output compared: ' .. out)
  H.check(out:find('FAIL ' .. page .. ':25: ' .. page .. ':27: attempt to index', 1, true),
          'the error names the page line: ' .. out)
  H.check(out:find('skip ' .. page .. ':21: a fragment: the reader\'s own model', 1, true),
          'norun listed with its reason: ' .. out)
  H.check(out:find('FAIL ' .. page .. ':43:', 1, true) and out:find('fresh fails', 1, true),
          'a fresh script runs alone: ' .. out)
  H.check(not out:find(':[29]: ') and not out:find(':29: ') and not out:find(':35: ')
          and not out:find(':46: '),
          'the globals carried over, gpu, replicas (and mpi) blocks passed: ' .. out)
end)

-- Every page of the docs, and the README.
local files = {}
local p = io.popen(("find '%s' -name '*.md' | sort"):format(root .. 'docs'))
for l in p:lines() do files[#files + 1] = l end
p:close()
files[#files + 1] = root .. 'README.md'

local out = doctest_on(files)
io.stdout:write(out)
local lines_of = {}
for l in out:gmatch('[^\n]+') do
  local page = l:match('^FAIL (.-):%d+: ') or l:match('^skip (.-):%d+: ')
  if page then
    lines_of[page] = lines_of[page] or {}
    table.insert(lines_of[page], l)
  end
end
for _, page in ipairs(files) do
  local name = page:sub(#root + 1)
  H.test(name, function()
    local nrun, nfail, nskip = out:match('\n' .. page:gsub('%p', '%%%0') .. ': (%d+) run, (%d+) failed, (%d+) skipped')
    if not nrun then
      nrun, nfail, nskip = out:match('^' .. page:gsub('%p', '%%%0') .. ': (%d+) run, (%d+) failed, (%d+) skipped')
    end
    H.check(nrun ~= nil, name .. ': the doctest printed no counts')
    H.check(tonumber(nfail) == 0, ('%s: %s of %s blocks failed'):format(name, tostring(nfail), tostring(nrun)))
    for _, l in ipairs(lines_of[page] or {}) do
      if l:match('^skip ') then H.skip(l:sub(6)) end
    end
  end)
end
H.done()
