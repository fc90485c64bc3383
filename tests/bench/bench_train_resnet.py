"""bench_train_resnet.py -- PyTorch's side of bench_train_resnet.lua: the seed's
18-layer ResNet for 32x32 inputs (resnet_common.py), batch 64, SGD momentum 0.9 with
weight decay 5e-4, synthetic data, eager mode on the CPU, timed the same way: warm-up
steps, then the median of --reps repetitions of --steps whole steps. Configurations:
fp32_nchw, fp32_cl (model.to(memory_format=torch.channels_last), each batch made
channels-last at the model's entry), bf16_nchw, bf16_cl (torch.autocast('cpu',
dtype=torch.bfloat16) around forward and loss). Prints

  INFO <text>                                   torch version, threads
  RESULT train_resnet_<config> <samples/s> samples/s
  RESULT train_resnet_fp32 / _bf16 <samples/s>  the best layout of each
  RESULT train_resnet_torch_compile_fp32 / _bf16 <samples/s>
                                                that best layout's model through
                                                torch.compile (inductor; compiled in
                                                the warm-up; --torch-compile 0: not run)
  NA <config> <reason>
"""
import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import result, torch  # noqa: E402
from resnet_common import F, resnet18, sgd  # noqa: E402

p = argparse.ArgumentParser()
p.add_argument('--configs', default='fp32_nchw,fp32_cl,bf16_nchw,bf16_cl')
p.add_argument('--batch', type=int, default=64)
p.add_argument('--steps', type=int, default=20)
p.add_argument('--reps', type=int, default=5)
p.add_argument('--warm', type=int, default=3)
p.add_argument('--torch-compile', type=int, default=1)
args = p.parse_args()
print('INFO torch %s (%d threads)' % (torch.__version__, torch.get_num_threads()), flush=True)


def make_step(name, compiled=False):
    torch.manual_seed(0)
    cl, bf16 = name.endswith('_cl'), name.startswith('bf16')
    model = resnet18()
    if cl:
        model = model.to(memory_format=torch.channels_last)
    opt = sgd(model)
    if compiled:
        model = torch.compile(model)
    x = torch.randn(args.batch, 3, 32, 32)
    y = torch.randint(0, 10, (args.batch,))

    def step():
        xin = x.contiguous(memory_format=torch.channels_last) if cl else x
        if bf16:
            with torch.autocast('cpu', dtype=torch.bfloat16):
                loss = F.cross_entropy(model(xin), y)
        else:
            loss = F.cross_entropy(model(xin), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return step


def rate(step):
    for _ in range(args.warm):
        step()
    rs = []
    for _ in range(args.reps):
        t0 = time.perf_counter()
        for _ in range(args.steps):
            step()
        rs.append(args.steps * args.batch / (time.perf_counter() - t0))
    return statistics.median(rs)


best, best_name = {}, {}
for name in args.configs.split(','):
    try:
        v = rate(make_step(name))
    except Exception as e:  # a figure we could not get is a row that says so
        print('NA %s %s' % (name, str(e).splitlines()[0] if str(e) else type(e).__name__),
              flush=True)
        continue
    result('train_resnet_' + name, v, 'samples/s')
    kind = name.split('_')[0]
    if v > best.get(kind, 0):
        best[kind], best_name[kind] = v, name
for kind, v in best.items():
    result('train_resnet_' + kind, v, 'samples/s')
for kind, name in best_name.items() if args.torch_compile else []:
    try:
        result('train_resnet_torch_compile_' + kind, rate(make_step(name, compiled=True)),
               'samples/s')
    except Exception as e:  # noqa: BLE001 -- a missing compiler toolchain, say
        print('SKIP train_resnet_torch_compile_%s: torch.compile failed: %s' %
              (kind, str(e).splitlines()[0] if str(e) else type(e).__name__), flush=True)
