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


def set_tf32(matmul=None, conv=None):
    """TF32 for float32 matmuls and/or cuDNN convolutions (None leaves one as it is):
    fp32_precision from PyTorch 2.9 on (mixing it with the older allow_tf32 flags is an
    error there), allow_tf32 before."""
    for on, mod, old in ((matmul, torch.backends.cuda.matmul, 'allow_tf32'),
                         (conv, getattr(torch.backends.cudnn, 'conv', None), None)):
        if on is None:
            continue
        try:
            mod.fp32_precision  # 1.13's module raises AssertionError, not AttributeError
            mod.fp32_precision = 'tf32' if on else 'ieee'
        except Exception:
            if old:
                setattr(mod, old, on)
            else:
                torch.backends.cudnn.allow_tf32 = on

