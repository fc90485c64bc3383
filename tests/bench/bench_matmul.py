"""bench_matmul.py -- PyTorch's side of bench_matmul.lua (1024^3 float32 matmul)."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import result, time_per_iter, torch  # noqa: E402

n = 1024
a, b = torch.rand(n, n), torch.rand(n, n)


def mm(k):
    c = None
    for _ in range(k):
        c = torch.matmul(a, b)
    return c


mm(2)
result('matmul_1024', 2 * n ** 3 / time_per_iter(mm, 5, 5) / 1e9, 'GFLOP/s')
