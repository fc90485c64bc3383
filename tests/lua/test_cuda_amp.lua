--[[
test_cuda_amp.lua -- em.amp on the CUDA backend, on the emulated runtime
(EMBER_CUDA_EMULATE=1:256; the test runs itself again with it otherwise): the
autocast dtype table of every listed op (cuBLASLt and cuDNN in float16/bfloat16
with float32 accumulation), float32 parameter gradients against float32 training,
and the scaler's inf-skip trace with the check on the device.
]]
local dir = (arg and arg[0] and arg[0]:match('^(.*/)')) or
            ((os.getenv('EMBER_TESTS') or 'tests') .. '/lua/')
local H, em = dofile(dir .. 'cuda_emulated.lua')('1:256')

dofile(dir .. 'amp_cases.lua').run(H, em, 'cuda')
H.done()
