"""bench_profile.py -- PyTorch side of bench_profile.lua: the same CNN steps
(train_common.py) with torch.profiler (CPU activities) off and on, alternating
rounds, best of each; the slowdown in percent."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import result, torch  # noqa: E402
from time import perf_counter as now  # noqa: E402
from train_common import setup  # noqa: E402

STEPS, ROUNDS = 20, int(os.environ.get('EMBER_BENCH_ROUNDS', '6'))
step, batch = setup('cnn')
for i in range(5):
    step(i)
best_off = best_on = float('inf')


def round_off():
    t0 = now()
    for i in range(STEPS):
        step(i)
    return (now() - t0) / STEPS


def round_on():
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        t0 = now()
        for i in range(STEPS):
            step(i)
            prof.step()
        return (now() - t0) / STEPS


for r in range(ROUNDS):  # the order alternates too: neither side always goes first
    if r % 2 == 0:
        best_off = min(best_off, round_off())
        best_on = min(best_on, round_on())
    else:
        best_on = min(best_on, round_on())
        best_off = min(best_off, round_off())
result('profile_off_cnn', batch / best_off, 'samples/s')
result('profile_on_cnn', batch / best_on, 'samples/s')
result('profile_overhead_cnn', (best_on / best_off - 1) * 100, '%')

a, b = torch.ones(16), torch.ones(16)
N = 200000


def tiny():
    t0 = now()
    for _ in range(N):
        a + b
    return (now() - t0) / N


off = on = float('inf')
for _ in range(ROUNDS):
    off = min(off, tiny())
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]):
        on = min(on, tiny())
result('profile_tiny_add_off', off * 1e9, 'ns')
result('profile_cost_per_op', (on - off) * 1e9, 'ns')
