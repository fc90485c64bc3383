"""bench_cuda_train.py -- PyTorch's side of bench_cuda_train.lua: the same two
training steps (the Fashion-MNIST CNN with Adam, an 18-layer residual network
on 32x32 inputs with SGD momentum), eager mode, timed the same way: warm-up
steps, then the median of --reps repetitions of --steps steps, each between two
torch.cuda.synchronize() calls. Prints

  INFO <text>                     torch version, device name
  RESULT <name> <samples/s> samples/s
  NA <name> <reason>

--bf16 1 adds cnn_bf16 and resnet_bf16: the same steps under torch.autocast(device,
dtype=torch.bfloat16) with the model and each batch in torch.channels_last.
--device cpu is for bench_cuda_train.lua's smoke run on emulated devices. --tf32 1
lets float32 matmuls and convolutions use TF32, as em.cuda.allow_tf32(true) does on
ember's side; 0 (the default) keeps both in IEEE float32.
"""
import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import result, set_tf32, torch  # noqa: E402
from resnet_common import resnet18, sgd  # noqa: E402

nn = torch.nn
F = torch.nn.functional

p = argparse.ArgumentParser()
p.add_argument('--device', default='cuda')
p.add_argument('--cnn-batch', type=int, default=128)
p.add_argument('--resnet-batch', type=int, default=512)
p.add_argument('--steps', type=int, default=20)
p.add_argument('--reps', type=int, default=5)
p.add_argument('--warm', type=int, default=5)
p.add_argument('--tf32', type=int, default=0, help='TF32 for float32 matmul and conv (as ember)')
p.add_argument('--bf16', type=int, default=1, help='the bf16 autocast + channels_last rows too')
args = p.parse_args()

dev = torch.device(args.device)
cuda = dev.type == 'cuda'
print('INFO torch %s' % torch.__version__, flush=True)
if cuda:
    if not torch.cuda.is_available():
        for name in ('cnn', 'resnet', 'cnn_bf16', 'resnet_bf16'):
            print('NA %s torch sees no CUDA device' % name, flush=True)
        sys.exit(0)
    print('INFO device %s' % torch.cuda.get_device_name(dev), flush=True)
    # PyTorch's default runs cuDNN's float32 convolutions in TF32; ember's does not:
    # both sides are set alike here (the Lua side says which).
    set_tf32(matmul=bool(args.tf32), conv=bool(args.tf32))
else:
    print('INFO device cpu (%d threads)' % torch.get_num_threads(), flush=True)


def sync():
    if cuda:
        torch.cuda.synchronize(dev)


def rate(step, batch):
    for _ in range(args.warm):
        step()
    rs = []
    for _ in range(args.reps):
        sync()
        t0 = time.perf_counter()
        for _ in range(args.steps):
            step()
        sync()
        rs.append(args.steps * batch / (time.perf_counter() - t0))
    return statistics.median(rs)


def cnn():
    return nn.Sequential(
        nn.Conv2d(1, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(3136, 128), nn.ReLU(), nn.Linear(128, 10))


def bench(name, model, opt, shape, batch, low=False):
    """low: bfloat16 autocast, the model and each batch in channels_last."""
    if low:
        model = model.to(memory_format=torch.channels_last)
    x = torch.randn(batch, *shape, device=dev)
    y = torch.randint(0, 10, (batch,), device=dev)

    def step():
        if low:
            with torch.autocast(dev.type, dtype=torch.bfloat16):
                loss = F.cross_entropy(model(x.contiguous(memory_format=torch.channels_last)), y)
        else:
            loss = F.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    try:
        result(name, rate(step, batch), 'samples/s')
    except Exception as e:  # a figure we could not get is a row that says so
        print('NA %s %s' % (name, str(e).splitlines()[0] if str(e) else type(e).__name__),
              flush=True)


for low in ((False, True) if args.bf16 else (False,)):
    suffix = '_bf16' if low else ''
    torch.manual_seed(0)
    m = cnn().to(dev)
    bench('cnn' + suffix, m, torch.optim.Adam(m.parameters(), lr=1e-3), (1, 28, 28),
          args.cnn_batch, low)
    torch.manual_seed(0)
    m = resnet18().to(dev)
    bench('resnet' + suffix, m, sgd(m), (3, 32, 32), args.resnet_batch, low)
