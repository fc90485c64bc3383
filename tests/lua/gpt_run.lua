--[[
gpt_run.lua -- what the tests of examples/gpt.lua share (test_gpt_example.lua,
test_gpt_plan.lua): running the example under the ember command, reading the
losses it prints, and a small text to train on.

  local G = dofile(dir .. 'gpt_run.lua')(dir, ember)
  local out, rc = G.run('--replicas 2', '--file ' .. G.small .. ' --steps 3')
  G.losses(out)      -- the printed losses, in order
  G.cleanup()        -- removes the small text
]]
return function(dir, ember)
  local G = {}
  local example = dir .. '../../examples/gpt.lua'

  -- The example's output (stderr included) and exit status.
  function G.run(prefix, args, env)
    local cmd = ('%s %s %s %s %s 2>&1; echo "exit=$?"'):format(env or '', ember, prefix,
      example, args)
    local p = io.popen(cmd)
    local out = p:read('*a')
    p:close()
    return out, tonumber(out:match('exit=(%d+)%s*$'))
  end

  function G.losses(out)
    local l = {}
    for v in out:gmatch('step %d+/%d+%s+loss (%d+%.%d+)') do l[#l + 1] = tonumber(v) end
    return l
  end

  -- 3 kB of the GPL (63 distinct bytes): a text that trains in seconds
  G.small = os.tmpname()
  local f = assert(io.open('/usr/share/common-licenses/GPL-3', 'rb'))
  local s = f:read(3000)
  f:close()
  f = assert(io.open(G.small, 'wb'))
  f:write(s)
  f:close()

  function G.cleanup() os.remove(G.small) end
  return G
end
