"""bench_infer.py -- PyTorch's side of bench_infer.lua: the 32-64-4 MLP (Linear,
ReLU, Linear), batch 1, forward under torch.no_grad(), from Python. The same
figure is printed under both of ember's names (from Lua and from C), so the table
compares each with it."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import result, time_per_iter, torch  # noqa: E402

torch.manual_seed(1)
model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
x = torch.randn(1, 32)


def fwd(n):
    y = None
    with torch.no_grad():
        for _ in range(n):
            y = model(x)
    return y


fwd(20000)
t = time_per_iter(fwd, 100000, 7) * 1e6
result('infer_mlp_lua', t, 'us/op')
result('infer_mlp_c', t, 'us/op')
