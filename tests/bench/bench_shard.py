"""bench_shard.py -- PyTorch side of bench_shard.lua: sharded data parallel on the
CPU, N gloo processes x torch.set_num_threads(1) (N = 2 and 4), the same model,
batch, steps and warm-up as ember's side, one peer per ember mode:

  plain       DistributedDataParallel (gradient_as_bucket_view: the gradients are
              the reducer's buckets, so one copy, as ember's wrap keeps)
  optimizer   ZeroRedundancyOptimizer (ZeRO-1, overlap_with_ddp=False) over that DDP
  gradients   FullyShardedDataParallel (FSDP1), ShardingStrategy.SHARD_GRAD_OP, one
              unit per Linear / Conv2d (ZeRO-2: parameters stay gathered from forward
              to backward)
  parameters  fully_shard (FSDP2) on each Linear / Conv2d and on the root (ZeRO-3)

Models: 'mlp' (784 -> 4 x 1024 -> 10, 3.96 M parameters: 63 MB of float32 Adam
state unsharded) and 'cnn' (train_common's Fashion-MNIST CNN), float32, Adam 1e-3,
cross-entropy, batch 64 per process on synthetic batches (the same shapes as
Fashion-MNIST; data loading is not what this measures).

Per mode and world size: global samples/s over the timed steps (the slowest
rank's seconds), then one more, untimed step measured for memory: the bytes of
the distinct storages this rank holds, by kind -- parameters (for FSDP the local
shards, ._local_tensor of FSDP2's DTensors, and the gathered copies while they
exist), gradients (.grad, FSDP's shards), optimizer state (the optimizer's state
tensors; ZeRO's local optimizer) and activations (the storages autograd saves for
backward during the forward, seen through saved_tensors_hooks). Each kind is its
peak over the step, sampled when autograd saves or unpacks a tensor and after
forward, backward and step; the figure is the largest rank's. Beside each, the
ZeRO formula for float32 Adam (bytes per parameter: plain 4 + 4 + 8; optimizer
4 + 4 + 8/N; gradients 4 + 4/N + 8/N; parameters 4/N + 4/N + 8/N).

  python bench_shard.py [--steps N] [--model mlp|cnn|all] [--world 2,4] [--modes ...]

RESULT lines (the names ember's side prints): shard_<model>_<mode>_n<N> (global
samples/s), shard_<model>_mem_<mode>_n<N> (parameters + gradients + optimizer
state per process, MB), shard_<model>_mem_<mode>_n<N>_vs_formula (that / the
formula); and a KIND line per configuration (bytes by kind) that bench_shard.lua
reads for its table."""
import argparse
import os
import sys
import warnings
from time import perf_counter as now

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from dist_common import dist, result, slowest, spawn, torch  # noqa: E402

nn, F = torch.nn, torch.nn.functional
BATCH, WARM, POOL = 64, 5, 4
MODES = ('plain', 'optimizer', 'gradients', 'parameters')
MB = 1024.0 * 1024.0


def make_model(kind):
    torch.manual_seed(0)
    if kind == 'mlp':
        return nn.Sequential(nn.Linear(784, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(),
                             nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(),
                             nn.Linear(1024, 10))
    from train_common import model
    return model('cnn')


def batches(kind, rank):
    g = torch.Generator().manual_seed(1000 + rank)
    shape = (BATCH, 784) if kind == 'mlp' else (BATCH, 1, 28, 28)
    return [(torch.randn(shape, generator=g), torch.randint(0, 10, (BATCH,), generator=g))
            for _ in range(POOL)]


def formula(mode, n, world):
    """ZeRO's bytes per kind for n float32 parameters under Adam."""
    if mode == 'plain':
        return {'parameters': 4 * n, 'gradients': 4 * n, 'optimizer': 8 * n}
    if mode == 'optimizer':
        return {'parameters': 4 * n, 'gradients': 4 * n, 'optimizer': 8 * n / world}
    if mode == 'gradients':
        return {'parameters': 4 * n, 'gradients': 4 * n / world, 'optimizer': 8 * n / world}
    return {'parameters': 4 * n / world, 'gradients': 4 * n / world, 'optimizer': 8 * n / world}


def wrap(mode, net, world):
    """The peer of an ember mode: (the module to call, the optimizer)."""
    layers = (nn.Linear, nn.Conv2d)
    if mode in ('plain', 'optimizer'):
        ddp = nn.parallel.DistributedDataParallel(net, gradient_as_bucket_view=True)
        if mode == 'plain':
            return ddp, torch.optim.Adam(ddp.parameters(), lr=1e-3)
        from torch.distributed.optim import ZeroRedundancyOptimizer
        return ddp, ZeroRedundancyOptimizer(ddp.parameters(), optimizer_class=torch.optim.Adam,
                                            overlap_with_ddp=False, lr=1e-3)
    if mode == 'gradients':
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP, ShardingStrategy
        from torch.distributed.fsdp.wrap import ModuleWrapPolicy
        m = FSDP(net, sharding_strategy=ShardingStrategy.SHARD_GRAD_OP,
                 auto_wrap_policy=ModuleWrapPolicy(set(layers)), device_id=torch.device('cpu'))
        return m, torch.optim.Adam(m.parameters(), lr=1e-3)
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    mesh = init_device_mesh('cpu', (world,))
    for m in net.modules():
        if isinstance(m, layers):
            fully_shard(m, mesh=mesh)
    fully_shard(net, mesh=mesh)
    return net, torch.optim.Adam(net.parameters(), lr=1e-3)


# -- Memory: the distinct storages this rank holds, by kind ----------------------------------

def local(t):
    return t._local_tensor if hasattr(t, '_local_tensor') else t


def fsdp_tensors(model):
    """(parameter tensors, gradient tensors) reachable through FSDP1's flat
    parameters and FSDP2's FSDPParams, besides model.parameters()."""
    ps, gs = [], []
    for p in model.parameters():            # FSDP1 FlatParameters (and plain ones)
        for a in ('_local_shard', '_full_param_padded', '_full_prec_full_param_padded',
                  '_mp_shard'):
            ps.append(getattr(p, a, None))
        for a in ('_saved_grad_shard', '_cpu_grad'):
            gs.append(getattr(p, a, None))
    for m in model.modules():                # FSDP2
        get = getattr(m, '_get_fsdp_state', None)
        if get is None:
            continue
        for group in get()._fsdp_param_groups:
            for fp in group.fsdp_params:
                ps.append(fp.sharded_param)
                ps.append(getattr(fp, '_sharded_param_data', None))
                ps.extend(getattr(fp, 'all_gather_outputs', []) or [])
                up = getattr(fp, '_unsharded_param', None)
                ps.append(up)
                gs.append(fp.sharded_param.grad)
                gs.append(up.grad if up is not None else None)
    return ps, gs


def storages(tensors, seen):
    """{data_ptr: bytes} of the tensors' storages not in `seen` (nor freed)."""
    out = {}
    for t in tensors:
        if t is None:
            continue
        st = local(t).untyped_storage()
        ptr, nb = st.data_ptr(), st.nbytes()
        if nb > 0 and ptr not in seen:
            out[ptr] = nb
    return out


class Meter:
    """Samples the bytes by kind; keeps each kind's peak."""

    def __init__(self, model, opt):
        self.model, self.opt = model, opt
        self.peak = dict.fromkeys(('parameters', 'gradients', 'optimizer', 'activations'), 0)
        self.saved = {}

    def held(self):
        params = list(self.model.parameters())
        ps, gs = fsdp_tensors(self.model)
        p = storages(params + ps, set())
        g = storages([x.grad for x in params] + gs, p)
        state = getattr(self.opt, 'optim', self.opt).state    # ZeRO's local optimizer
        o = storages([v for s in state.values() for v in s.values() if torch.is_tensor(v)],
                     set(p) | set(g))
        return p, g, o

    def sample(self):
        p, g, o = self.held()
        for k, d in (('parameters', p), ('gradients', g), ('optimizer', o)):
            self.peak[k] = max(self.peak[k], sum(d.values()))
        self.peak['activations'] = max(self.peak['activations'], sum(self.saved.values()))
        return p

    def pack(self, t):
        p = self.sample()
        if t.untyped_storage().nbytes() > 0:
            ptr = t.untyped_storage().data_ptr()
            if ptr not in p:
                self.saved[ptr] = t.untyped_storage().nbytes()
        return t

    def unpack(self, t):
        self.sample()
        return t


def measure(model, opt, x, y):
    """One step with the meter on: {kind: peak bytes}, the largest rank's."""
    meter = Meter(model, opt)
    opt.zero_grad()
    meter.sample()
    with torch.autograd.graph.saved_tensors_hooks(meter.pack, meter.unpack):
        loss = F.cross_entropy(model(x), y)
        meter.sample()
        loss.backward()
    meter.sample()
    opt.step()
    meter.sample()
    kinds = ('parameters', 'gradients', 'optimizer', 'activations')
    t = torch.tensor([float(meter.peak[k]) for k in kinds], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return dict(zip(kinds, t.tolist()))


def worker(rank, kind, mode, steps):
    warnings.filterwarnings('ignore')       # FSDP1's deprecation notices, on every rank
    world = dist.get_world_size()
    net = make_model(kind)
    n = sum(p.numel() for p in net.parameters())
    model, opt = wrap(mode, net, world)
    data = batches(kind, rank)

    def step(i):
        x, y = data[i % POOL]
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()

    for i in range(WARM):
        step(i)
    dist.barrier()
    t0 = now()
    for i in range(steps):
        step(i)
    secs = slowest([now() - t0])[0]
    mem = measure(model, opt, *data[0])
    return {'samples_s': world * steps * BATCH / secs, 'mem': mem, 'numel': n,
            'formula': formula(mode, n, world)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('--steps', type=int,
                    default=int(os.environ.get('EMBER_BENCH_SHARD_STEPS', '30')))
    ap.add_argument('--model', default='mlp', choices=('mlp', 'cnn', 'all'))
    ap.add_argument('--world', default='2,4')
    ap.add_argument('--modes', default=','.join(MODES))
    a = ap.parse_args()
    kinds = ('mlp', 'cnn') if a.model == 'all' else (a.model,)
    worlds = [int(w) for w in a.world.split(',')]
    print('PyTorch %s, gloo, N processes x 1 thread, batch %d per process, %d steps after %d'
          % (torch.__version__, BATCH, a.steps, WARM))
    print('%-5s %-11s %2s %10s   %-17s %-17s %-17s %9s' % (
        'model', 'mode', 'N', 'samples/s', 'parameters MB', 'gradients MB', 'optimizer MB',
        'activ. MB'))
    for kind in kinds:
        for world in worlds:
            for mode in a.modes.split(','):
                name = 'shard_%s_%s_n%d' % (kind, mode, world)
                try:
                    r = spawn(worker, kind, mode, a.steps, world=world)
                except Exception as e:      # a peer that cannot run: say why, go on
                    print('SKIP %s: n/a (%s)' % (name, str(e).strip().splitlines()[-1][:160]))
                    continue
                m, f = r['mem'], r['formula']
                cells = ['%7.2f / %-7.2f' % (m[k] / MB, f[k] / MB)
                         for k in ('parameters', 'gradients', 'optimizer')]
                print('%-5s %-11s %2d %10.0f   %s %9.2f' % (kind, mode, world, r['samples_s'],
                                                           ' '.join(cells), m['activations'] / MB))
                state = sum(m[k] for k in ('parameters', 'gradients', 'optimizer'))
                print('KIND %s %d %d %d %d %d' % (name, m['parameters'], m['gradients'],
                                                   m['optimizer'], m['activations'], r['numel']))
                result(name, r['samples_s'], 'samples/s')
                mem = 'shard_%s_mem_%s_n%d' % (kind, mode, world)
                result(mem, state / MB, 'MB')
                result(mem + '_vs_formula', state / sum(f.values()), 'x')


if __name__ == '__main__':
    main()
