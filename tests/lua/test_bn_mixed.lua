--[[
test_bn_mixed.lua -- batch norm on float16/bfloat16 inputs with float32 parameters
and running statistics on the CPU (core/cpu/bn_half.c): the cases of
bn_mixed_cases.lua, shared with test_cuda_bn_mixed.lua.
]]
local dir = (arg and arg[0] and arg[0]:match('^(.*/)')) or
            ((os.getenv('EMBER_TESTS') or 'tests') .. '/lua/')
local H = dofile(dir .. 'harness.lua')
local em = require 'ember'

dofile(dir .. 'bn_mixed_cases.lua').run(H, em, 'cpu')
H.done()
