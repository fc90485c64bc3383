"""train_common.py -- PyTorch's side of the training benchmarks: the same recipe
(Adam 1e-3, batch 128, cross-entropy) on the same first Fashion-MNIST samples,
timed over whole steps after a warm-up, and peak RSS (VmHWM) after the float32 run;
the CNN also in CPU autocast bfloat16 with channels_last (train_cnn_bf16) and through
torch.compile (train_cnn_torch_compile: the model compiled by inductor, its compile
time in the warm-up; a SKIP line where it can't run)."""
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


def setup(kind, low=False, compiled=False):
    """The model, its data and one training step: step(i) trains on batch i (of 40).
    low: bfloat16 autocast and channels_last (the model once, each batch at its entry);
    compiled: forward and backward through torch.compile, the update eager."""
    torch.manual_seed(0)
    batch, n = 128, 128 * 40
    images = idx(ROOT + '/train-images-idx3-ubyte.gz', 16).reshape(-1, 1, 28, 28)[:n]
    labels = idx(ROOT + '/train-labels-idx1-ubyte.gz', 8)[:n]
    x = (torch.from_numpy(images.copy()).float() / 255 - 0.2860) / 0.3530
    y = torch.from_numpy(labels.astype(np.int64))
    m = model(kind)
    if low:
        m = m.to(memory_format=torch.channels_last)
    opt = torch.optim.Adam(m.parameters(), lr=1e-3)
    if compiled:
        m = torch.compile(m)

    def step(i):
        s = (i % 40) * batch
        xb, yb = x[s:s + batch], y[s:s + batch]
        if low:
            xb = xb.contiguous(memory_format=torch.channels_last)
            with torch.autocast('cpu', dtype=torch.bfloat16):
                loss = F.cross_entropy(m(xb), yb)
        else:
            loss = F.cross_entropy(m(xb), yb)
        opt.zero_grad()
        loss.backward()
        opt.step()

    return step, batch


def rate(step, batch, steps):
    """samples/s of `steps` steps after 5 warm-up steps."""
    for i in range(5):
        step(i)
    t0 = now()
    for i in range(steps):
        step(i)
    return steps * batch / (now() - t0)


def run(kind, steps):
    step, batch = setup(kind)
    result('train_' + kind, rate(step, batch, steps), 'samples/s')
    result('rss_' + kind, peak_rss_mb(), 'MB')
    if kind == 'cnn':
        step, batch = setup(kind, low=True)
        result('train_cnn_bf16', rate(step, batch, steps), 'samples/s')
        try:
            step, batch = setup(kind, compiled=True)
            result('train_cnn_torch_compile', rate(step, batch, steps), 'samples/s')
        except Exception as e:  # noqa: BLE001 -- a missing compiler toolchain, say
            print('SKIP train_cnn_torch_compile: torch.compile failed: %s' % str(e).splitlines()[0])
