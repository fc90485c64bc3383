"""train_common.py -- PyTorch's side of the training benchmarks: the same recipe
(Adam 1e-3, batch 128, cross-entropy) on the same first Fashion-MNIST samples,
timed over whole steps after a warm-up, and peak RSS (VmHWM) at the end."""
import gzip
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import result, torch  # noqa: E402
from time import perf_counter as now  # noqa: E402

ROOT = os.environ.get('EMBER_DATA', '/usr/share/datasets') + '/fashion-mnist'
nn, F = torch.nn, torch.nn.functional


def idx(path, offset):
    with gzip.open(path, 'rb') as f:
        return np.frombuffer(f.read(), dtype=np.uint8, offset=offset)


def model(kind):
    if kind == 'mlp':
        return nn.Sequential(nn.Flatten(), nn.Linear(784, 512), nn.ReLU(), nn.Linear(512, 256),
                             nn.ReLU(), nn.Linear(256, 10))
    return nn.Sequential(
        nn.Conv2d(1, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(3136, 128), nn.ReLU(), nn.Linear(128, 10))


def peak_rss_mb():
    with open('/proc/self/status') as f:
        for line in f:
            if line.startswith('VmHWM:'):
                return int(line.split()[1]) / 1024


def setup(kind):
    """The model, its data and one training step: step(i) trains on batch i (of 40)."""
    torch.manual_seed(0)
    batch, n = 128, 128 * 40
    images = idx(ROOT + '/train-images-idx3-ubyte.gz', 16).reshape(-1, 1, 28, 28)[:n]
    labels = idx(ROOT + '/train-labels-idx1-ubyte.gz', 8)[:n]
    x = (torch.from_numpy(images.copy()).float() / 255 - 0.2860) / 0.3530
    y = torch.from_numpy(labels.astype(np.int64))
    m = model(kind)
    opt = torch.optim.Adam(m.parameters(), lr=1e-3)

    def step(i):
        s = (i % 40) * batch
        loss = F.cross_entropy(m(x[s:s + batch]), y[s:s + batch])
        opt.zero_grad()
        loss.backward()
        opt.step()

    return step, batch


def run(kind, steps):
    step, batch = setup(kind)
    for i in range(5):
        step(i)
    t0 = now()
    for i in range(steps):
        step(i)
    result('train_' + kind, steps * batch / (now() - t0), 'samples/s')
    result('rss_' + kind, peak_rss_mb(), 'MB')
