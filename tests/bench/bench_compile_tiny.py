"""bench_compile_tiny.py -- PyTorch's side of bench_compile_tiny.lua: the small MLP's
whole training step (16-32-32-4, batch 8, cross-entropy, Adam) in microseconds, eager
(compile_tiny_step, the figure ember's compiled step is compared with) and, where it
runs, through torch.compile (compile_tiny_step_torch_compile, reported)."""
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import result, torch  # noqa: E402

F = torch.nn.functional


def make():
    torch.manual_seed(1)
    m = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 32),
                            torch.nn.ReLU(), torch.nn.Linear(32, 4))
    opt = torch.optim.Adam(m.parameters(), lr=1e-3)

    def step(x, y):
        opt.zero_grad()
        loss = F.cross_entropy(m(x), y)
        loss.backward()
        opt.step()
        return loss
    return step


def best_us(f, x, y):
    for _ in range(200):
        f(x, y)
    best = float('inf')
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(2000):
            f(x, y)
        best = min(best, (time.perf_counter() - t0) / 2000 * 1e6)
    return best


x, y = torch.randn(8, 16), torch.randint(0, 4, (8,))
result('compile_tiny_step', best_us(make(), x, y), 'us')
try:
    result('compile_tiny_step_torch_compile', best_us(torch.compile(make()), x, y), 'us')
except Exception as e:  # noqa: BLE001 -- a missing compiler toolchain, say
    print('SKIP compile_tiny_step_torch_compile: torch.compile failed: %s' % str(e).splitlines()[0])
