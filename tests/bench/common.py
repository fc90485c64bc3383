"""common.py -- shared by the PyTorch side of the benchmarks: the same RESULT line
as common.lua, medians, and 2 threads (as ember)."""
import os
import statistics
import time

import torch

torch.set_num_threads(int(os.environ.get('EMBER_NUM_THREADS', '2')))


def time_per_iter(fn, n, reps=5):
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn(n)
        ts.append((time.perf_counter() - t0) / n)
    return statistics.median(ts)


def result(name, value, unit):
    print('RESULT %s %.6g %s' % (name, value, unit), flush=True)
