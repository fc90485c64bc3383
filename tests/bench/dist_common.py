"""dist_common.py -- shared by the PyTorch side of the em.distribute benchmarks
(bench_allreduce.py, bench_ddp_cnn.py, bench_shard.py): WORLD processes (or
spawn's world=) started with
torch.multiprocessing (spawn), joined by torch.distributed's gloo backend on
127.0.0.1 at a free port; rank 0 hands its figures back through a queue."""
import os
import socket
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import result, torch  # noqa: E402,F401
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

WORLD = 2


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]


def _entry(rank, fn, port, queue, args, world=WORLD):
    os.environ['MASTER_ADDR'] = '127.0.0.1'
    os.environ['MASTER_PORT'] = str(port)
    torch.set_num_threads(1)        # world processes x 1 intra-op thread (as ember's replicas)
    dist.init_process_group('gloo', rank=rank, world_size=world)
    try:
        out = fn(rank, *args)
        if rank == 0:
            queue.put(out)
        dist.barrier()
    finally:
        dist.destroy_process_group()


def spawn(fn, *args, world=WORLD):
    """Runs fn(rank, *args) in `world` processes; returns what rank 0's returned."""
    ctx = mp.get_context('spawn')
    queue = ctx.SimpleQueue()
    mp.spawn(_entry, args=(fn, free_port(), queue, args, world), nprocs=world, join=True)
    return queue.get()


def slowest(seconds):
    """The per-element max over the ranks of a list of times (float64)."""
    t = torch.tensor(seconds, dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.tolist()
