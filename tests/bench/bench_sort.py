"""bench_sort.py -- PyTorch's side of bench_sort.lua (topk(50) of 32 x 50,257
float32 logits; the sort of 256 lines of 1,024; lines per second; 256 draws with
replacement from each of 32 rows of 50,257 probabilities, rows per second)."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import result, time_per_iter, torch  # noqa: E402

torch.manual_seed(0)
logits = torch.randn(32, 50257)
rows = torch.randn(256, 1024)
probs = logits.softmax(1)


def topk(n):
    v = None
    for _ in range(n):
        v = logits.topk(50)
    return v


def sort(n):
    v = None
    for _ in range(n):
        v = rows.sort(1)
    return v


def sample(n):
    v = None
    for _ in range(n):
        v = torch.multinomial(probs, 256, replacement=True)
    return v


topk(2)
sort(2)
sample(2)
result('topk50_32x50257', 32 / time_per_iter(topk, 5, 5), 'lines/s')
result('sort_256x1024', 256 / time_per_iter(sort, 5, 5), 'lines/s')
result('multinomial256_32x50257', 32 / time_per_iter(sample, 5, 5), 'rows/s')
