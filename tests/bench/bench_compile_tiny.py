"""bench_compile_tiny.py -- PyTorch's side of bench_compile_tiny.lua: the small MLP's
whole training step (16-32-32-4, batch 8, cross-entropy, Adam) in microseconds, eager
(compile_tiny_step, the figure ember's compiled step is compared with) and, where it
runs, through torch.compile (compile_tiny_step_torch_compile, reported). Then the
element-wise chain (a tanh-approximated GELU plus a bias over 256 x 4096 floats):
compile_chain eager, and compile_chain_torch_compile where it runs."""
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


def best_us(f, args, warm, n):
    """Microseconds per call of f(*args): the best of 5 rounds of n calls, after warm."""
    for _ in range(warm):
        f(*args)
    best = float('inf')
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(n):
            f(*args)
        best = min(best, (time.perf_counter() - t0) / n * 1e6)
    return best


x, y = torch.randn(8, 16), torch.randint(0, 4, (8,))
result('compile_tiny_step', best_us(make(), (x, y), 200, 2000), 'us')
try:
    result('compile_tiny_step_torch_compile', best_us(torch.compile(make()), (x, y), 200, 2000), 'us')
except Exception as e:  # noqa: BLE001 -- a missing compiler toolchain, say
    print('SKIP compile_tiny_step_torch_compile: torch.compile failed: %s' % str(e).splitlines()[0])


def gelu_bias(x, b):
    return 0.5 * x * (1 + torch.tanh((x + 0.044715 * x * x * x) * 0.7978845608)) + b


cx, cb = torch.randn(256, 4096), torch.randn(4096)
with torch.no_grad():
    result('compile_chain', best_us(gelu_bias, (cx, cb), 3, 20), 'us')
    try:
        result('compile_chain_torch_compile', best_us(torch.compile(gelu_bias), (cx, cb), 3, 20),
               'us')
    except Exception as e:  # noqa: BLE001 -- a missing compiler toolchain, say
        print('SKIP compile_chain_torch_compile: torch.compile failed: %s' % str(e).splitlines()[0])
