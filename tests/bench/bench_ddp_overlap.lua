--[[
bench_ddp_overlap.lua -- does gradient averaging overlap backward
(em.distribute)? The data-parallel CNN of bench_ddp_cnn.lua (ddp_common.lua) on
`ember --replicas 2`, 1 thread each, in three bucket plans:

  b25     the default: bucket_mb = 25, the first bucket 1 MB (the CNN's ~1.7 MB of
          gradients make 2 buckets: the last Linear layers, then the convolutions)
  b0.25   bucket_mb = 0.25 (first 0.25 MB): more, smaller buckets
  one     bucket_mb = first_bucket_mb = 1e9: one bucket, started only once the
          last gradient is in, i.e. one allreduce after backward

Each plan's step time (the slower replica), and from dm:comm_stats() the share
of the allreduce time that ran while backward was still computing (overlap) and
the time backward waited at its end. Reported:

  ddp_overlap_b25          % of allreduce time overlapped with backward (default plan)
  ddp_step_b25, ddp_step_b0.25, ddp_step_one     ms per step
  ddp_one_vs_b25           step time of one bucket / of the default plan
                           (above 1: overlapping pays)

  ember tests/bench/bench_ddp_overlap.lua [--steps N]   (default 100, or EMBER_BENCH_DDP_STEPS)

No PyTorch twin: the plans are compared with each other.
]]
local dir = debug.getinfo(1, 'S').source:sub(2):match('(.*/)')
local W = dofile(dir .. 'ddp_common.lua')
local D = W.D

local args = W.start('ddp_overlap')
if not args then return end
local plans = {
  { 'b25', {}, 'bucket_mb 25, first 1 (default)' },
  { 'b0.25', { '--bucket_mb', 0.25 }, 'bucket_mb 0.25' },
  { 'one', { '--bucket_mb', 1e9, '--first_bucket_mb', 1e9 }, 'one bucket, after backward' },
}
local runs, why = {}, {}
for _, p in ipairs(plans) do
  local a = {}
  for _, v in ipairs(args) do a[#a + 1] = v end
  for _, v in ipairs(p[2]) do a[#a + 1] = v end
  runs[p[1]], why[p[1]] = D.launch('local', 2, 1, a)
end

print('2 replicas x 1 thread (ember --replicas 2), Fashion-MNIST CNN, batch 128 per replica; per step:')
print(('%-32s %8s %8s %9s %9s %9s %9s'):format('bucket plan', 'buckets', 'step ms', 'comm ms',
  'overlap', 'wait ms', 'samples/s'))
for _, p in ipairs(plans) do
  local r = runs[p[1]]
  if r then
    print(('%-32s %8d %8.1f %9.2f %8.0f%% %9.2f %9.0f'):format(p[3], r.buckets, r.step_ms,
      r.comm_ms, 100 * r.overlap, r.wait_ms, r.samples_s))
  else
    print(('%-32s n/a (%s)'):format(p[3], why[p[1]]))
  end
end

local d = runs.b25
if d then
  D.B.result('ddp_overlap_b25', 100 * d.overlap, '%', 'higher', '-')
end
for _, p in ipairs(plans) do
  if runs[p[1]] then
    D.B.result('ddp_step_' .. p[1], runs[p[1]].step_ms, 'ms', 'lower', '-')
  else
    D.skip('ddp_step_' .. p[1], why[p[1]])
  end
end
if d and runs.one then
  D.B.result('ddp_one_vs_b25', runs.one.step_ms / d.step_ms, 'x', 'higher', '>= 1 x')
end
