"""bench_step_peak.py -- PyTorch's twin of bench_step_peak.lua on a CUDA device: the same
three training steps (the Fashion-MNIST CNN, batch 128, Adam; the seed's ResNet-18 for
32x32 inputs, batch 32, SGD with momentum; the GPT example's model, 2 layers, dim 64,
4 heads, context 64, batch 16, Adam) on synthetic batches, and each step's
torch.cuda.max_memory_allocated with torch.cuda.reset_peak_memory_stats before it.
The CPU has no such counter in PyTorch: without a GPU this prints a skip line.

  python bench_step_peak.py [--models cnn,resnet,gpt] [--steps N]

Prints each step's peak and `RESULT step_peak_<model>_torch <MB> MB lower -` (the
largest peak of the measured steps), which bench_step_peak.lua --device cuda reads.
"""
import argparse
import math
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import resnet_common  # noqa: E402

nn = torch.nn
F = torch.nn.functional
MB = 2 ** 20


class Attention(nn.Module):
    def __init__(self, dim, heads):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x):
        B, T, C = x.shape
        H, D = self.heads, C // self.heads
        q, k, v = (t.reshape(B, T, H, D).transpose(1, 2) for t in self.qkv(x).split(C, dim=2))
        scores = (q @ k.transpose(2, 3)) * (1 / math.sqrt(D))
        keep = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
        scores = scores.masked_fill(~keep, float('-inf'))
        return self.proj((scores.softmax(-1) @ v).transpose(1, 2).reshape(B, T, C))


class Block(nn.Module):
    def __init__(self, dim, heads):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.attn = Attention(dim, heads)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, vocab, layers, dim, heads, context):
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, dim), nn.Embedding(context, dim)
        self.blocks = nn.Sequential(*[Block(dim, heads) for _ in range(layers)])
        self.ln, self.out = nn.LayerNorm(dim), nn.Linear(dim, vocab)

    def forward(self, ids):
        T = ids.shape[1]
        x = self.tok(ids) + self.pos(torch.arange(T, device=ids.device))
        return self.out(self.ln(self.blocks(x)))


def work(name, dev):
    if name == 'cnn':
        model = nn.Sequential(
            nn.Conv2d(1, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Flatten(), nn.Linear(3136, 128), nn.ReLU(), nn.Linear(128, 10)).to(dev)
        x, y = torch.randn(128, 1, 28, 28, device=dev), torch.randint(0, 10, (128,), device=dev)
        return model, torch.optim.Adam(model.parameters(), lr=1e-3), x, y, \
            lambda m, x, y: F.cross_entropy(m(x), y)
    if name == 'resnet':
        model = resnet_common.resnet18().to(dev)
        x, y = torch.randn(32, 3, 32, 32, device=dev), torch.randint(0, 10, (32,), device=dev)
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-4)
        return model, opt, x, y, lambda m, x, y: F.cross_entropy(m(x), y)
    if name == 'gpt':
        vocab = 96
        model = GPT(vocab, 2, 64, 4, 64).to(dev)
        x = torch.randint(0, vocab, (16, 64), device=dev)
        y = torch.randint(0, vocab, (16, 64), device=dev)
        return model, torch.optim.Adam(model.parameters(), lr=1e-3), x, y, \
            lambda m, x, y: F.cross_entropy(m(x).reshape(-1, vocab), y.reshape(-1))
    raise SystemExit('unknown model ' + name + ' (cnn, resnet, gpt)')


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('--models', default='cnn,resnet,gpt')
    ap.add_argument('--steps', type=int, default=6)
    a = ap.parse_args()
    if not torch.cuda.is_available():
        print('skip: bench_step_peak.py: no CUDA device (PyTorch counts no CPU memory)')
        return
    dev = torch.device('cuda')
    for name in a.models.split(','):
        torch.manual_seed(0)
        model, opt, x, y, loss_fn = work(name, dev)

        def step():
            loss = loss_fn(model, x, y)
            opt.zero_grad()
            loss.backward()
            opt.step()

        step(); step()                                   # the optimizer's state is born
        torch.cuda.synchronize()
        peaks = []
        for _ in range(a.steps):
            torch.cuda.reset_peak_memory_stats()
            step()
            torch.cuda.synchronize()
            peaks.append(torch.cuda.max_memory_allocated())
        print('%-7s torch peak per step (MB): %s' % (name, ' '.join('%.1f' % (p / MB) for p in peaks)))
        print('RESULT step_peak_%s_torch %.6g MB lower -' % (name, max(peaks) / MB))
        del model, opt, x, y
        torch.cuda.empty_cache()


if __name__ == '__main__':
    main()
