"""bench_profile.py -- PyTorch side of bench_profile.lua: the same CNN steps
(train_common.py) with torch.profiler (CPU activities) off and on, alternating
rounds, best of each; the slowdown in percent."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import result, torch  # noqa: E402
from time import perf_counter as now  # noqa: E402
from train_common import setup  # noqa: E402

STEPS, ROUNDS = 20, int(os.environ.get('EMBER_BENCH_ROUNDS', '4'))
step, batch = setup('cnn')
for i in range(5):
    step(i)
best_off = best_on = float('inf')
for _ in range(ROUNDS):
    t0 = now()
    for i in range(STEPS):
        step(i)
    best_off = min(best_off, (now() - t0) / STEPS)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        t0 = now()
        for i in range(STEPS):
            step(i)
            prof.step()
        best_on = min(best_on, (now() - t0) / STEPS)
result('profile_off_cnn', batch / best_off, 'samples/s')
result('profile_on_cnn', batch / best_on, 'samples/s')
result('profile_overhead_cnn', (best_on / best_off - 1) * 100, '%')
