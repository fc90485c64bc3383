--[[
test_check_comments.lua -- tools/check_comments.sh, the check that no comment names
an issue number: the checkout passes it (one check: a comment naming an issue
anywhere in the sources fails make test and so CI); on a planted tree it lists each
offending comment in C, CUDA, Lua, shell, Python, a Makefile and .ci/run by
file:line and exits 1, and leaves alone what is not a comment (strings, a shell
here-document, code calling a function named *_issue), a URL of another project's
issue, and build output.
]]
local dir = (arg and arg[0] and arg[0]:match('^(.*/)')) or
            ((os.getenv('EMBER_TESTS') or 'tests') .. '/lua/')
local H = dofile(dir .. 'harness.lua')

local root = dir .. '../../'
local checker = root .. 'tools/check_comments.sh'

-- Runs the checker on a folder: its exit status and its stdout's lines.
local function check(folder)
  local p = io.popen(('sh %q %q 2>/dev/null; echo "#exit $?"'):format(checker, folder))
  local lines, rc = {}, nil
  for l in p:lines() do
    local e = l:match('^#exit (%d+)$')
    if e then rc = tonumber(e) else lines[#lines + 1] = l end
  end
  p:close()
  return rc, lines
end

local function write(path, text)
  os.execute(('mkdir -p %q'):format(path:match('^(.*)/')))
  local f = assert(io.open(path, 'w'))
  f:write(text)
  f:close()
end

H.test('the checkout has no comment that names an issue number', function()
  local rc, lines = check(root)
  for _, l in ipairs(lines) do print('  ' .. l) end
  H.eq(rc, 0, 'check_comments.sh on the checkout (the lines above name an issue)')
end)

local tmp = os.tmpname()
os.remove(tmp)

-- Every offending comment, as file:line.
local want = {
  'a.c:2', 'a.c:4', 'b.h:3', 'k.cu:1', 'm.lua:1', 'm.lua:5', 's.sh:2', 's.sh:10',
  'p.py:2', 'p.py:4', 'Makefile:1', '.ci/run:2', 'sub/deeper/t.lua:1',
}

H.test('a planted tree: each comment that names an issue is listed', function()
  write(tmp .. '/a.c', [==[
#include <stdio.h>
/* the reader (issue 12): a file that lies */
const char *s = "issue 12 /* issue 3 */";
int x = 1; // see Issue #4
/* NCCL issues them as one group */
int f(void) { return emi_nccl_issue(x, 12); }
/* https://github.com/LuaJIT/LuaJIT/issues/1234 */
]==])
  write(tmp .. '/b.h', '/*\n** a header\n** issues 3 and 4 asked for it\n*/\nchar c = \'"\';\n')
  write(tmp .. '/k.cu', '// the kernel, issue no. 7\n__global__ void k(void) {}\n')
  write(tmp .. '/m.lua', [==[
local a = 1 -- fixed in issue 11
local s = 'issue 11' .. "issue 4"
local l = [[ -- issue 4 ]]
--[=[ a long comment
(issue 17) ]=]
-- https://github.com/LuaJIT/LuaJIT/issues/1234
]==])
  write(tmp .. '/s.sh', [==[
#!/bin/sh
echo "# issue 5" # as issue 5 says
n=${#a}x issue 5
cat <<'EOF'
# issue 5 (data)
EOF
cat <<-END
	# issue 6 (data)
	END
# issue #9
]==])
  write(tmp .. '/p.py', '"""\nThe loader (issue 9).\n"""\nx = "# issue 2"  # issue 2\n')
  write(tmp .. '/Makefile', '# deps (issue 8)\nall:\n\techo "issue 8"\n')
  write(tmp .. '/.ci/run', '#!/usr/bin/env bash\n# CI (issue 6)\necho ok\n')
  write(tmp .. '/sub/deeper/t.lua', '-- issue 1\n')
  write(tmp .. '/notes.txt', 'issue 1\n')
  write(tmp .. '/build/x.c', '/* issue 1 */\n')
  write(tmp .. '/build-asan/x.c', '/* issue 1 */\n')
  write(tmp .. '/.git/x.c', '/* issue 1 */\n')

  local rc, lines = check(tmp)
  H.eq(rc, 1, 'exit status')
  local got = {}
  for _, l in ipairs(lines) do got[#got + 1] = l:match('^(.-:%d+):') or l end
  table.sort(got)
  table.sort(want)
  H.eq(got, want, 'listed comments')
end)

H.test('the same tree without those comments passes', function()
  for _, f in ipairs({ 'b.h', 'k.cu', 'p.py', 'Makefile', '.ci/run', 'sub/deeper/t.lua' }) do
    os.remove(tmp .. '/' .. f)
  end
  write(tmp .. '/a.c', 'const char *s = "issue 12";\n/* https://github.com/LuaJIT/LuaJIT/issues/1234 */\n')
  write(tmp .. '/m.lua', "local s = 'issue 11' -- the loader's test data\n")
  write(tmp .. '/s.sh', 'echo "# issue 5"\ncat <<EOF\n# issue 5\nEOF\n')
  local rc, lines = check(tmp)
  H.eq(rc, 0, 'exit status')
  H.eq(lines, {}, 'listed comments')
  H.eq((check(tmp .. '/absent')), 2, 'exit status for a missing folder')
end)

os.execute(('rm -rf %q'):format(tmp))
H.done()
