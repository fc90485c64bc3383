"""bench_elementwise.py -- PyTorch's side of bench_elementwise.lua (4M float32 add
and sum, GB/s of data touched; exp, tanh, sigmoid and gelu, elements per second)."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import result, time_per_iter, torch  # noqa: E402

N = 4 * 1024 * 1024
a, b = torch.rand(N), torch.rand(N)


def add(n):
    c = None
    for _ in range(n):
        c = a + b
    return c


def sum_(n):
    s = None
    for _ in range(n):
        s = a.sum()
    return s


add(5)
sum_(5)
result('add_4M', 3 * N * 4 / time_per_iter(add, 20, 7) / 1e9, 'GB/s')
result('sum_4M', N * 4 / time_per_iter(sum_, 40, 7) / 1e9, 'GB/s')
for op in ('exp', 'tanh', 'sigmoid', 'gelu'):
    x = torch.randn(N)
    f = torch.nn.functional.gelu if op == 'gelu' else getattr(torch, op)

    def run(n, f=f, x=x):
        y = None
        for _ in range(n):
            y = f(x)
        return y
    run(3)
    result(op + '_4M', N / time_per_iter(run, 10, 5) / 1e9, 'G/s')
