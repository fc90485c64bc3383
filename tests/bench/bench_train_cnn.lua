-- bench_train_cnn.lua -- training samples/s and peak RSS of the Fashion-MNIST CNN (see train_common.lua).
local dir = debug.getinfo(1, 'S').source:sub(2):match('(.*/)')
dofile(dir .. 'train_common.lua').run('cnn', 30)
