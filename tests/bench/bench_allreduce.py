"""bench_allreduce.py -- PyTorch side of bench_allreduce.lua: allreduce algorithm
bandwidth of torch.distributed's gloo backend, 2 processes on 127.0.0.1, float32
tensors of 1, 4, 16, 64 MB summed in place; a barrier before each timed
iteration, the slower rank's time, the median over the iterations after warm-up.
Printed under the names of both ember columns (local and mpi), so that run.sh's
ratios are local/gloo and mpi/gloo."""
import os
import statistics
import sys
from time import perf_counter as now

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from dist_common import dist, result, slowest, spawn, torch  # noqa: E402

SIZES = [1, 4, 16, 64]
WARM = 3


def iters(mb):
    return 30 if mb <= 4 else (15 if mb <= 16 else 8)


def worker(rank):
    out = {}
    for mb in SIZES:
        t = torch.ones(mb * 1024 * 1024 // 4)
        for _ in range(WARM):
            dist.all_reduce(t)
        ts = []
        for _ in range(iters(mb)):
            t.fill_(1)
            dist.barrier()
            t0 = now()
            dist.all_reduce(t)
            ts.append(now() - t0)
        assert t[0].item() == 2, 'allreduce gave a wrong sum'
        out[mb] = mb * 1024 * 1024 / statistics.median(slowest(ts)) / 1e9
    return out


if __name__ == '__main__':
    bw = spawn(worker)
    for name in ('local', 'mpi'):
        for mb in SIZES:
            result('allreduce_%s_%dMB' % (name, mb), bw[mb], 'GB/s')
