"""bench_pipeline.py -- PyTorch side of bench_pipeline.lua: pipeline parallelism on
the CPU with PyTorch 2's torch.distributed.pipelining, P gloo processes x
torch.set_num_threads(1) (P = 2 and 4), one stage per process (PipelineStage),
schedules ScheduleGPipe and Schedule1F1B with M = 4 and 8 micro-batches, and
ScheduleInterleaved1F1B with two stages per process (pieces rank and rank + P of
2P, as ember's virtual = 2 holds them).

Model: 8 blocks of Linear(1024, 1024) + ReLU (8.4 M parameters), cut into P stages
of 8/P blocks each, as ember's side cuts it (balance = the same child counts);
float32, MSE loss against a random target, SGD lr 1e-3 (zero_grad, the schedule's
step, the optimizer's step), batch 64 rows per step split into M micro-batches,
synthetic data; `steps` timed steps after WARM.

Per configuration: samples/s (64 * steps / the slowest rank's seconds) and the
measured bubble: the share of the schedule's step each rank sat blocked on its
neighbours -- the time inside the schedule's waits on its point-to-point work
(torch.distributed.pipelining.schedules._wait_batch_p2p, wrapped here), over the
time inside schedule.step() -- averaged over the ranks, beside the formula
(p-1)/(m+p-1).

  python bench_pipeline.py [--steps N] [--world 2,4] [--chunks 4,8]
         [--schedules gpipe,1f1b]

RESULT lines (the names ember's side prints): pipe_<schedule>_p<P>_m<M> (samples/s)
and pipe_<schedule>_p<P>_m<M>_bubble (the share)."""
import argparse
import os
import sys
import warnings
from time import perf_counter as now

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from dist_common import dist, result, spawn, torch  # noqa: E402

nn, F = torch.nn, torch.nn.functional
BATCH, WIDTH, BLOCKS, WARM, VIRTUAL = 64, 1024, 8, 3, 2


def stage_module(index, pieces):
    """Piece `index` of `pieces` equal pieces of the model, made whole on every rank
    with one seed so that each stage holds the same weights as in one model."""
    torch.manual_seed(0)
    layers = []
    for _ in range(BLOCKS):
        layers += [nn.Linear(WIDTH, WIDTH), nn.ReLU()]
    per = len(layers) // pieces
    return nn.Sequential(*layers[index * per:(index + 1) * per])


def worker(rank, schedule, chunks, steps):
    warnings.filterwarnings('ignore')
    from torch.distributed.pipelining import (PipelineStage, Schedule1F1B, ScheduleGPipe,
                                              ScheduleInterleaved1F1B)
    from torch.distributed.pipelining import schedules as sched_mod
    world = dist.get_world_size()
    cpu = torch.device('cpu')
    if schedule == 'interleaved':       # pieces rank, rank + P, ... of P x VIRTUAL
        pieces = world * VIRTUAL
        mods = [stage_module(rank + v * world, pieces) for v in range(VIRTUAL)]
        stages = [PipelineStage(m, rank + v * world, pieces, cpu) for v, m in enumerate(mods)]
        sched = ScheduleInterleaved1F1B(stages, chunks, loss_fn=F.mse_loss)
    else:
        mods = [stage_module(rank, world)]
        stage = PipelineStage(mods[0], rank, world, cpu)   # shapes inferred
        cls = ScheduleGPipe if schedule == 'gpipe' else Schedule1F1B
        sched = cls(stage, chunks, loss_fn=F.mse_loss)
    opt = torch.optim.SGD([p for m in mods for p in m.parameters()], lr=1e-3)
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(BATCH, WIDTH, generator=g), torch.randn(BATCH, WIDTH, generator=g)

    waited = [0.0]
    inner = sched_mod._wait_batch_p2p

    def timed_wait(work):
        t0 = now()
        inner(work)
        waited[0] += now() - t0
    sched_mod._wait_batch_p2p = timed_wait

    in_step = [0.0]

    def step():
        opt.zero_grad()
        t0 = now()
        if rank == 0:
            sched.step(x)
        elif rank == world - 1:
            sched.step(target=y, losses=[])
        else:
            sched.step()
        in_step[0] += now() - t0
        opt.step()

    for _ in range(WARM):
        step()
    dist.barrier()
    waited[0], in_step[0] = 0.0, 0.0
    t0 = now()
    for _ in range(steps):
        step()
    secs = now() - t0
    t = torch.tensor([secs, waited[0] / in_step[0]], dtype=torch.float64)
    top = t.clone()
    dist.all_reduce(top, op=dist.ReduceOp.MAX)
    dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return {'samples_s': steps * BATCH / top[0].item(), 'bubble': t[1].item() / world}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('--steps', type=int,
                    default=int(os.environ.get('EMBER_BENCH_PIPE_STEPS', '20')))
    ap.add_argument('--world', default='2,4')
    ap.add_argument('--chunks', default='4,8')
    ap.add_argument('--schedules', default='gpipe,1f1b,interleaved')
    a = ap.parse_args()
    print('PyTorch %s, torch.distributed.pipelining, gloo, P processes x 1 thread, batch %d, '
          '%d steps after %d' % (torch.__version__, BATCH, a.steps, WARM))
    print('%-11s %2s %2s %10s %8s %8s' % ('sched', 'P', 'M', 'samples/s', 'bubble', 'formula'))
    for world in [int(w) for w in a.world.split(',')]:
        for schedule in a.schedules.split(','):
            for chunks in [int(m) for m in a.chunks.split(',')]:
                name = 'pipe_%s_p%d_m%d' % (schedule, world, chunks)
                try:
                    r = spawn(worker, schedule, chunks, a.steps, world=world)
                except Exception as e:      # a peer that cannot run: say why, go on
                    print('SKIP %s: n/a (%s)' % (name, str(e).strip().splitlines()[-1][:160]))
                    continue
                v = VIRTUAL if schedule == 'interleaved' else 1
                formula = (world - 1) / (v * chunks + world - 1)
                print('%-11s %2d %2d %10.1f %8.3f %8.3f' % (schedule, world, chunks,
                                                           r['samples_s'], r['bubble'], formula))
                result(name, r['samples_s'], 'samples/s')
                result(name + '_bubble', r['bubble'], 'share')


if __name__ == '__main__':
    main()
