--[[
test_progress_line.lua -- an error printed while the data loader's progress bar
is drawn starts on a line of its own. The bar draws only on a terminal, so the
ember command runs under script(1), which gives it a pseudo-terminal (the pty
turns each "\n" into "\r\n").
]]
local dir = (arg and arg[0] and arg[0]:match('^(.*/)')) or
            ((os.getenv('EMBER_TESTS') or 'tests') .. '/lua/')
local H = dofile(dir .. 'harness.lua')
local ember = arg[-1] or 'ember'

local have_script = os.execute('command -v script >/dev/null 2>&1') == 0

-- Runs the ember command on a terminal; returns everything it wrote.
local function on_tty(text)
  local path = os.tmpname()
  local f = assert(io.open(path, 'w'))
  f:write(text)
  f:close()
  local p = io.popen(('script -qec %q /dev/null 2>&1'):format(ember .. ' ' .. path))
  local out = p:read('*a')
  p:close()
  os.remove(path)
  return out
end

local epoch = [[
local ds = em.data.synthetic{ shape = { 2 }, size = 40 }
local loader = ds:loader{ batch_size = 4 }
local n = 0
for x in loader:epoch() do
  n = n + 1
  os.execute('sleep 0.05')
  if n == %d then error('broken batch ' .. n) end
end
%s
]]

H.test('an error mid-epoch starts on a line of its own', function()
  if not have_script then H.skip('script(1) not found (util-linux)') return end
  local out = on_tty(epoch:format(6, ''))
  local bar, msg = out:match('([^\n]*)\n(ember: [^\r\n]*broken batch 6)')
  H.check(msg ~= nil, 'the message: ' .. out)
  H.check(bar and bar:find('epoch 1 %[=+ *%] %d+/%d+'), 'the bar is on the line above: ' .. out)
  H.check(not out:find('[^\n]ember: '), 'the message is at the start of its line: ' .. out)
end)

H.test('after a finished epoch no blank line is added', function()
  if not have_script then H.skip('script(1) not found (util-linux)') return end
  local out = on_tty(epoch:format(999, "error('later')"))
  -- the bar cleared its line ("\r   \r"): the message starts there
  H.check(out:find('\r +\rember: [^\r\n]*later'), out)
  H.check(not out:find('\n\r?\nember'), 'no empty line before the message: ' .. out)
end)

H.done()
