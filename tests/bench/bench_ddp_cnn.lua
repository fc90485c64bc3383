--[[
bench_ddp_cnn.lua -- data-parallel training of the Fashion-MNIST CNN
(em.distribute): global samples/s, all replicas together, of

  ddp_cnn_local   ember --replicas 2, 1 intra-op thread each
  ddp_cnn_mpi     mpirun -np 2 ember, 1 intra-op thread each
  ddp_cnn_1x2     ember, 1 replica x 2 intra-op threads (the same script)
  ddp_cnn_local_compiled   ember --replicas 2 with the step through em.compile
                  (its bucket allreduces replayed)

each with batch 128 per replica on its shard of the shuffled train set, Adam
1e-3, a loader with workers = 0 (ddp_common.lua). The PyTorch twin,
bench_ddp_cnn.py, runs DDP over gloo, 2 processes x torch.set_num_threads(1),
DistributedSampler over the same data, and prints its figure under the names
ddp_cnn_local and ddp_cnn_mpi: run.sh's ratios are ember/DDP (the target:
>= 1.5 x). The TensorFlow twin, bench_ddp_cnn_tf.py, trains the same CNN in Keras
under MirroredStrategy (2 logical CPU devices) and MultiWorkerMirroredStrategy (2
workers on localhost) and prints the faster under the same names. Standalone, this
driver runs both twins itself and ends with ddp_cnn_vs_torch2 and ddp_cnn_vs_tf
(ember --replicas 2 over each peer, same run) and ddp_cnn_compiled_vs_tf; under
run.sh, which runs the twins, run.sh prints those. ddp_cnn_2x1_vs_1x2 is 2 replicas x 1 thread against 1 replica
x 2 threads.

  ember tests/bench/bench_ddp_cnn.lua [--steps N]    N steps per replica after 10
                                                      (default 100, or EMBER_BENCH_DDP_STEPS)
  ember tests/bench/bench_ddp_cnn.lua --epochs 5      whole epochs, and the test
                  accuracy after them, on replica 0 (the target: >= 90.5 %)
]]
local dir = debug.getinfo(1, 'S').source:sub(2):match('(.*/)')
local W = dofile(dir .. 'ddp_common.lua')
local D = W.D

local args = W.start('ddp_cnn')
if not args then return end
local epochs
for i = 1, #args, 2 do if args[i] == '--epochs' then epochs = args[i + 1] end end
local configs = {
  { 'local', 'local', 2, 1, '2 replicas x 1 thread (ember --replicas 2)' },
  { 'mpi', 'mpi', 2, 1, '2 processes x 1 thread (mpirun -np 2 ember)' },
  { '1x2', 'single', 1, 2, '1 replica x 2 threads (ember)' },
  { 'local_compiled', 'local', 2, 1, '2 replicas x 1 thread, em.compile', true },
}
local runs, why = {}, {}
for _, c in ipairs(configs) do
  local a = args
  if c[6] then a = { unpack(args) }; a[#a + 1], a[#a + 2] = '--compile', 1 end
  runs[c[1]], why[c[1]] = D.launch(c[2], c[3], c[4], a)
end
local peer, peer_why = D.peer(dir .. 'bench_ddp_cnn.py', args)
local ddp = peer and peer.ddp_cnn_local
local tfp, tf_why = D.peer(dir .. 'bench_ddp_cnn_tf.py', args, 'tensorflow')
local tfm = tfp and tfp.ddp_cnn_local      -- the faster of its two strategies

print(('Fashion-MNIST CNN, batch 128 per replica, %s; global samples/s'):format(
  epochs and epochs .. ' epochs' or (args[2] or W.STEPS) .. ' steps per replica after ' .. W.WARM))
print(('%-46s %10s %9s %10s %9s %9s'):format('', 'samples/s', 'step ms', 'vs DDP', 'overlap',
  epochs and 'accuracy' or ''))
for _, c in ipairs(configs) do
  local r = runs[c[1]]
  if r then
    print(('%-46s %10.0f %9.1f %10s %8.0f%% %9s'):format(c[5], r.samples_s, r.step_ms,
      D.fmt(ddp and r.samples_s / ddp, '%.2f x'), 100 * r.overlap,
      r.accuracy and ('%.2f%%'):format(r.accuracy) or ''))
  else
    print(('%-46s n/a (%s)'):format(c[5], why[c[1]]))
  end
end
if peer then
  print(('%-46s %10.0f %9s %10s %9s %9s'):format('PyTorch DDP gloo, 2 processes x 1 thread', ddp,
    '', '', '', peer.ddp_cnn_accuracy_local and ('%.2f%%'):format(peer.ddp_cnn_accuracy_local) or ''))
else
  print(('%-46s n/a (%s)'):format('PyTorch DDP gloo, 2 processes x 1 thread', peer_why))
end
if tfm then
  print(('%-46s %10.0f'):format('TensorFlow, the faster of Mirrored(2 CPUs) and MultiWorker(2)', tfm))
else
  print(('%-46s n/a (%s)'):format('TensorFlow MirroredStrategy / MultiWorker', tf_why))
end
if runs['local'] and runs['1x2'] then
  print(('2 replicas x 1 thread vs 1 replica x 2 threads: %.2f x'):format(
    runs['local'].samples_s / runs['1x2'].samples_s))
end

for _, c in ipairs(configs) do
  local r = runs[c[1]]
  if r then
    D.B.result('ddp_cnn_' .. c[1], r.samples_s, 'samples/s', 'higher',
               c[1] == '1x2' and '-' or 'ratio >= 1.5')
  else
    D.skip('ddp_cnn_' .. c[1], why[c[1]])
  end
end
-- Against the peers, same run (run.sh prints these itself when it runs the twins).
if runs['local'] and ddp then
  D.B.result('ddp_cnn_vs_torch2', runs['local'].samples_s / ddp, 'x', 'higher', '>= 1.5 x')
end
if runs['local'] and tfm then
  D.B.result('ddp_cnn_vs_tf', runs['local'].samples_s / tfm, 'x', 'higher', '-')
end
if runs['local_compiled'] and tfm then
  D.B.result('ddp_cnn_compiled_vs_tf', runs['local_compiled'].samples_s / tfm, 'x', 'higher',
             '>= 1 x')
end
if runs['local'] and runs['1x2'] then
  D.B.result('ddp_cnn_2x1_vs_1x2', runs['local'].samples_s / runs['1x2'].samples_s, 'x',
             'higher', '> 1 x')
end
if epochs then
  for _, c in ipairs(configs) do
    local r = runs[c[1]]
    if r and r.accuracy then
      D.B.result('ddp_cnn_accuracy_' .. c[1], r.accuracy, '%', 'higher', '>= 90.5 %')
    end
  end
end
