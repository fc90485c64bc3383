"""bench_loader_cnn.py -- PyTorch side of bench_loader_cnn.lua: the same CNN (Adam
1e-3, batch 128) fed by DataLoader(num_workers=2, shuffle=True) over the uint8
Fashion-MNIST tensors with a collate that stacks, converts to float and
normalizes (in the workers, as ember's map does), timed over the same steps; then
the same over random uint8 tensors of the same shape. The wait is the time spent
in next() on the loader's iterator, as a % of the timed steps."""
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import result, torch  # noqa: E402
from time import perf_counter as now  # noqa: E402
from train_common import ROOT, idx, model  # noqa: E402

WARM, STEPS, BATCH = 10, 150, 128
F = torch.nn.functional

if not os.path.exists(ROOT + '/train-images-idx3-ubyte.gz'):
    print('SKIP loader_cnn: %s not found (dataset-fashion-mnist)' % ROOT)
    sys.exit(0)


def collate(items):
    x = torch.stack([it[0] for it in items]).float().div_(255).sub_(0.2860).div_(0.3530)
    return x, torch.stack([it[1] for it in items])


def run(x, y):
    torch.manual_seed(0)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=BATCH,
                                         shuffle=True, num_workers=2, collate_fn=collate,
                                         pin_memory=False)
    m = model('cnn')
    opt = torch.optim.Adam(m.parameters(), lr=1e-3)
    it = iter(loader)
    wait = 0.0
    for i in range(WARM + STEPS):
        if i == WARM:
            t0, wait = now(), 0.0
        tw = now()
        xb, yb = next(it)
        wait += now() - tw
        loss = F.cross_entropy(m(xb), yb)
        opt.zero_grad()
        loss.backward()
        opt.step()
    t = now() - t0
    del it
    return STEPS * BATCH / t, wait / t


images = torch.from_numpy(idx(ROOT + '/train-images-idx3-ubyte.gz', 16).reshape(-1, 1, 28, 28).copy())
labels = torch.from_numpy(idx(ROOT + '/train-labels-idx1-ubyte.gz', 8).astype(np.int64))
g = torch.Generator().manual_seed(1)
fake_x = torch.randint(0, 256, images.shape, dtype=torch.uint8, generator=g)
fake_y = torch.randint(0, 10, labels.shape, generator=g)
rate, wait, synth = 0, 1, 0
for _ in range(2):   # real and synthetic alternate, best of 2 each (as the ember side)
    r, w = run(images, labels)
    if r > rate:
        rate, wait = r, w
    synth = max(synth, run(fake_x, fake_y)[0])
result('loader_cnn_wait', 100 * wait, '%')
result('loader_cnn_real', rate, 'samples/s')
result('loader_cnn_synthetic', synth, 'samples/s')
result('loader_cnn_real_vs_synth', rate / synth, 'x')
