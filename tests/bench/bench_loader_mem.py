"""bench_loader_mem.py -- PyTorch side of bench_loader_mem.lua: a TensorDataset of
the same uint8 Fashion-MNIST tensors through DataLoader(batch_size=128,
shuffle=True, num_workers=2, persistent_workers=True), samples/s over 2 epochs
after a warm-up epoch (which also starts the persistent workers)."""
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import result, torch  # noqa: E402
from time import perf_counter as now  # noqa: E402
from train_common import ROOT, idx  # noqa: E402

if not os.path.exists(ROOT + '/train-images-idx3-ubyte.gz'):
    print('SKIP loader_mem: %s not found (dataset-fashion-mnist)' % ROOT)
    sys.exit(0)
torch.manual_seed(0)
x = torch.from_numpy(idx(ROOT + '/train-images-idx3-ubyte.gz', 16).reshape(-1, 1, 28, 28).copy())
y = torch.from_numpy(idx(ROOT + '/train-labels-idx1-ubyte.gz', 8).astype(np.int64))
ds = torch.utils.data.TensorDataset(x, y)
loader = torch.utils.data.DataLoader(ds, batch_size=128, shuffle=True, num_workers=2,
                                     persistent_workers=True, pin_memory=False)


def epoch():
    n = 0
    for xb, _ in loader:
        n += xb.shape[0]
    return n


epoch()
t0, n = now(), 0
for _ in range(2):
    n += epoch()
result('loader_mem', n / (now() - t0), 'samples/s')
