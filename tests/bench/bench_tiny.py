"""bench_tiny.py -- PyTorch's side of bench_tiny.lua: `c = a + b` and `a.add_(b)` on
16-float tensors, from Python."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import result, time_per_iter, torch  # noqa: E402

a, b = torch.rand(16), torch.rand(16)


def add(n):
    c = None
    for _ in range(n):
        c = a + b
    return c


def add_(n):
    for _ in range(n):
        a.add_(b)


add(100000)
add_(100000)
result('tiny_add', time_per_iter(add, 500000) * 1e6, 'us/op')
a.zero_()
result('tiny_add_', time_per_iter(add_, 500000) * 1e6, 'us/op')
