"""bench_cuda.py -- PyTorch's side of bench_cuda.lua, the GPU benchmarks: matmul
(bfloat16, float32 with TF32 off and on), element-wise bandwidth, reductions,
softmax and the launch overhead of a tiny op. bench_cuda.lua runs it with the
sizes it measures itself (so the two sides never drift apart):

  python3 bench_cuda.py --device cuda|cpu --mm N --ew N1,N2 --rows R --cols C
                        --tiny N --launch ITERS --iters ITERS --reps REPS

and reads its lines:

  INFO <text>                     torch version, device name
  RESULT <name> <value> <unit>    as common.py prints them
  NA <name> <reason>              a figure that could not be measured

Timing: warm-up runs first; each repetition is bracketed by
torch.cuda.synchronize(); the figure is the median of the repetitions.
--device cpu is for bench_cuda.lua's smoke run on emulated devices: the figures
then say nothing about GPUs.
"""
import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import result, set_tf32 as common_set_tf32, torch  # noqa: E402

p = argparse.ArgumentParser()
p.add_argument('--device', default='cuda')
p.add_argument('--mm', type=int, default=4096)
p.add_argument('--ew', default='4194304,67108864')
p.add_argument('--rows', type=int, default=8192)
p.add_argument('--cols', type=int, default=4096)
p.add_argument('--tiny', type=int, default=16)
p.add_argument('--launch', type=int, default=500)
p.add_argument('--iters', type=int, default=20)
p.add_argument('--reps', type=int, default=7)
args = p.parse_args()

dev = torch.device(args.device)
cuda = dev.type == 'cuda'
print('INFO torch %s' % torch.__version__, flush=True)
if cuda:
    if not torch.cuda.is_available():
        print('NA * torch %s sees no CUDA device' % torch.__version__, flush=True)
        sys.exit(0)
    print('INFO device %s' % torch.cuda.get_device_name(dev), flush=True)
else:
    print('INFO device cpu (%d threads)' % torch.get_num_threads(), flush=True)


def sync():
    if cuda:
        torch.cuda.synchronize(dev)


def timed(fn, iters=args.iters, reps=args.reps):
    """Median seconds per call of fn over reps repetitions of iters calls, after
    warm-up calls; an op slower than 25 ms gets fewer calls per repetition (as
    bench_cuda.lua does)."""
    fn()
    sync()
    t0 = time.perf_counter()
    fn()
    sync()
    one = time.perf_counter() - t0
    iters = max(1, min(iters, int(0.5 / max(one, 1e-9))))
    if one < 0.05:
        for _ in range(2):
            fn()
    sync()
    ts = []
    for _ in range(reps):
        sync()
        t0 = time.perf_counter()
        for _ in range(iters):
            fn()
        sync()
        ts.append((time.perf_counter() - t0) / iters)
    return statistics.median(ts)


def measure(name, unit, fn):
    try:
        result(name, fn(), unit)
    except Exception as e:  # one failed figure never stops the others
        print('NA %s %s' % (name, str(e).splitlines()[0] if str(e) else type(e).__name__),
              flush=True)
    finally:
        if cuda:
            torch.cuda.empty_cache()


def set_tf32(on):
    """TF32 for float32 matmuls (common.set_tf32), on the GPU only."""
    if cuda:
        common_set_tf32(matmul=on)


def matmul(dtype, tf32):
    def run():
        n = args.mm
        set_tf32(tf32)
        try:
            a = torch.rand(n, n, device=dev, dtype=dtype)
            b = torch.rand(n, n, device=dev, dtype=dtype)
            return 2.0 * n ** 3 / timed(lambda: torch.matmul(a, b)) / 1e12
        finally:
            set_tf32(False)
    return run


measure('matmul_bf16', 'TFLOP/s', matmul(torch.bfloat16, False))
measure('matmul_f32', 'TFLOP/s', matmul(torch.float32, False))
measure('matmul_f32_tf32', 'TFLOP/s', matmul(torch.float32, True))

# Element-wise: effective bandwidth, the inputs read once and the output written
# once (12 bytes per float32 element for both ops), as bench_cuda.lua counts.
for n in (int(x) for x in args.ew.split(',')):
    def add(n=n):
        a, b = torch.rand(n, device=dev), torch.rand(n, device=dev)
        return 12.0 * n / timed(lambda: a + b) / 1e9

    def axpb(n=n):
        a, b = torch.rand(n, device=dev), torch.rand(n, device=dev)
        return 12.0 * n / timed(lambda: a * 2 + b) / 1e9
    measure('add_%d' % n, 'GB/s', add)
    measure('axpb_%d' % n, 'GB/s', axpb)

R, C = args.rows, args.cols


def reduction(kind):
    def run():
        x = torch.rand(R, C, device=dev)
        if kind == 'sum_last':
            return 4.0 * R * C / timed(lambda: x.sum(-1)) / 1e9
        if kind == 'sum_all':
            return 4.0 * R * C / timed(lambda: x.sum()) / 1e9
        return 8.0 * R * C / timed(lambda: torch.softmax(x, -1)) / 1e9  # read + write
    return run


measure('sum_last', 'GB/s', reduction('sum_last'))
measure('sum_all', 'GB/s', reduction('sum_all'))
measure('softmax_last', 'GB/s', reduction('softmax'))


# Launch overhead: host time per tiny op, without and with the final synchronize.
def launch():
    a, b = torch.rand(args.tiny, device=dev), torch.rand(args.tiny, device=dev)
    n = args.launch
    for _ in range(n):
        a + b
    sync()
    nosync, withsync = [], []
    for _ in range(max(args.reps, 11)):
        sync()
        t0 = time.perf_counter()
        for _ in range(n):
            a + b
        t1 = time.perf_counter()
        sync()
        t2 = time.perf_counter()
        nosync.append((t1 - t0) / n)
        withsync.append((t2 - t0) / n)
    return statistics.median(nosync) * 1e6, statistics.median(withsync) * 1e6


try:
    ns, ws = launch()
    result('launch_nosync', ns, 'us/op')
    result('launch_sync', ws, 'us/op')
except Exception as e:
    print('NA launch_nosync %s' % str(e).splitlines()[0], flush=True)
    print('NA launch_sync %s' % str(e).splitlines()[0], flush=True)
