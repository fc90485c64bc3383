--[[
test_cuda_bn_mixed.lua -- batch norm on float16/bfloat16 inputs with float32
parameters on the CUDA backend, on the emulated runtime (EMBER_CUDA_EMULATE=1:256;
the test runs itself again with it otherwise): training through the runtime's
batch norm (cuDNN's on a GPU, with a half data and a float parameter descriptor),
evaluation through k_dnn.cu's _f16/_bf16 kernels. The cases are
bn_mixed_cases.lua's, shared with test_bn_mixed.lua.
]]
local dir = (arg and arg[0] and arg[0]:match('^(.*/)')) or
            ((os.getenv('EMBER_TESTS') or 'tests') .. '/lua/')
local H, em = dofile(dir .. 'cuda_emulated.lua')('1:256')

dofile(dir .. 'bn_mixed_cases.lua').run(H, em, 'cuda')
H.done()
