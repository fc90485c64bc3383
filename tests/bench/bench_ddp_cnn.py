"""bench_ddp_cnn.py -- PyTorch side of bench_ddp_cnn.lua: the same CNN (Adam 1e-3,
batch 128 per process) under DistributedDataParallel over gloo, 2 processes x
torch.set_num_threads(1), each on its DistributedSampler share of the shuffled
Fashion-MNIST train set, fed by a DataLoader with num_workers=0 (stacking,
converting to float and normalizing in the training process, as ember's loader
with workers = 0 does; on 2 cores this is DDP's fastest setting).
Global samples/s over the same steps after the same warm-up (or whole epochs and
rank 0's test accuracy with --epochs N), printed under the names of both ember
data-parallel columns (local and mpi) so that run.sh's ratios are ember/DDP."""
import argparse
import os
import sys
from time import perf_counter as now

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from dist_common import dist, result, slowest, spawn, torch  # noqa: E402
from train_common import ROOT, idx, model  # noqa: E402

BATCH, WARM = 128, 10
F = torch.nn.functional


def collate(items):
    x = torch.stack([it[0] for it in items]).float().div_(255).sub_(0.2860).div_(0.3530)
    return x, torch.stack([it[1] for it in items])


def load(split):
    images = idx('%s/%s-images-idx3-ubyte.gz' % (ROOT, split), 16).reshape(-1, 1, 28, 28)
    labels = idx('%s/%s-labels-idx1-ubyte.gz' % (ROOT, split), 8)
    return torch.utils.data.TensorDataset(torch.from_numpy(images.copy()),
                                          torch.from_numpy(labels.astype(np.int64)))


def evaluate(m):
    loader = torch.utils.data.DataLoader(load('t10k'), batch_size=1000, collate_fn=collate)
    m.eval()
    correct = total = 0
    with torch.no_grad():
        for x, y in loader:
            correct += (m(x).argmax(1) == y).sum().item()
            total += y.numel()
    return 100.0 * correct / total


def worker(rank, steps, epochs):
    torch.manual_seed(1)
    train = load('train')
    sampler = torch.utils.data.distributed.DistributedSampler(train, shuffle=True, seed=1)
    loader = torch.utils.data.DataLoader(train, batch_size=BATCH, sampler=sampler, num_workers=0,
                                         collate_fn=collate)
    net = model('cnn')
    ddp = torch.nn.parallel.DistributedDataParallel(net)
    opt = torch.optim.Adam(ddp.parameters(), lr=1e-3)
    warm = 0 if epochs else WARM
    total = epochs * len(loader) if epochs else warm + steps
    i, epoch, t0 = 0, 0, None
    if warm == 0:
        dist.barrier()
        t0 = now()
    while i < total:
        sampler.set_epoch(epoch)
        epoch += 1
        for x, y in loader:
            loss = F.cross_entropy(ddp(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            i += 1
            if i == warm:
                dist.barrier()
                t0 = now()
            if i == total:
                break
    secs = slowest([now() - t0])[0]
    out = {'samples_s': dist.get_world_size() * (total - warm) * BATCH / secs}
    if epochs and rank == 0:
        out['accuracy'] = evaluate(net)
    return out


if __name__ == '__main__':
    ap = argparse.ArgumentParser()
    ap.add_argument('--steps', type=int, default=int(os.environ.get('EMBER_BENCH_DDP_STEPS', '100')))
    ap.add_argument('--epochs', type=int, default=0)
    a = ap.parse_args()
    if not os.path.exists(ROOT + '/train-images-idx3-ubyte.gz'):
        print('SKIP ddp_cnn: %s not found (dataset-fashion-mnist)' % ROOT)
        sys.exit(0)
    r = spawn(worker, a.steps, a.epochs)
    for name in ('local', 'mpi'):
        result('ddp_cnn_' + name, r['samples_s'], 'samples/s')
    if 'accuracy' in r:
        for name in ('local', 'mpi'):
            result('ddp_cnn_accuracy_' + name, r['accuracy'], '%')
