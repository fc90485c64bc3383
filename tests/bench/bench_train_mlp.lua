-- bench_train_mlp.lua -- training samples/s and peak RSS of the Fashion-MNIST MLP (see train_common.lua).
local dir = debug.getinfo(1, 'S').source:sub(2):match('(.*/)')
dofile(dir .. 'train_common.lua').run('mlp', 100)
