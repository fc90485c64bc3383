"""bench_checkpoint.py -- the PyTorch side of bench_checkpoint.lua: the same deep
MLP with torch.utils.checkpoint (use_reentrant=False). Peak memory: PyTorch keeps
no statistics for CPU tensors, so each configuration runs in a fresh process and
the figure is its peak RSS growth over the steps (ru_maxrss, after a warm-up
step), which follows the tensor memory on glibc (large blocks are mmap'd).
args: steps (default 5)."""
import multiprocessing as mp
import os
import resource
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch  # noqa: E402
from torch.utils.checkpoint import checkpoint  # noqa: E402

from common import result, time_per_iter  # noqa: E402

W, N, L = 128, 8192, 16


def rss_mb():
    with open('/proc/self/statm') as f:
        return int(f.read().split()[1]) * os.sysconf('SC_PAGE_SIZE') / 2 ** 20


def run(ckpt, steps, q):
    torch.manual_seed(0)
    layers = [torch.nn.Sequential(torch.nn.Linear(W, W), torch.nn.ReLU()) for _ in range(L)]
    params = [p for l in layers for p in l.parameters()]
    opt = torch.optim.SGD(params, lr=1e-3)
    x = torch.randn(N, W)

    def step():
        opt.zero_grad()
        h = x
        for i in range(0, L, 2):
            a, b = layers[i], layers[i + 1]

            def f(t, a=a, b=b):
                return b(a(t))
            h = checkpoint(f, h, use_reentrant=False) if ckpt else f(h)
        h.pow(2).mean().backward()
        opt.step()

    step()
    base = rss_mb()
    s = time_per_iter(lambda n: [step() for _ in range(n)], steps, 3)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 - base
    q.put((s, peak))


if __name__ == '__main__':
    steps = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    ctx = mp.get_context('spawn')
    for ckpt in (False, True):
        q = ctx.Queue()
        p = ctx.Process(target=run, args=(ckpt, steps, q))
        p.start()
        s, peak = q.get()
        p.join()
        tag = 'ckpt' if ckpt else 'plain'
        result('mlp16_%s_step_ms' % tag, s * 1e3, 'ms')
        result('mlp16_%s_peak_mb' % tag, peak, 'MiB')
