"""bench_ddp_cnn_tf.py -- TensorFlow side of bench_ddp_cnn.lua (and of its PyTorch
twin bench_ddp_cnn.py): data-parallel training of the Fashion-MNIST CNN
(train_common.py's, in Keras, PyTorch's default init), Adam 1e-3, cross-entropy,
batch 128 PER REPLICA, 2 replicas, each on its shard of the shuffled train set
(one permutation per epoch, seed 1, the same in every replica; replica r takes
every 2nd sample from r, as DistributedSampler does), the batch made in the
training loop (gather, to float, normalize: no loader threads, as workers = 0 /
num_workers=0 on the other sides). Global samples/s, all replicas together, over
100 steps per replica (--steps N, or EMBER_BENCH_DDP_STEPS) after 10 warm-up
steps, using the slower replica's time; or with --epochs N whole epochs from the
start and replica 0's test accuracy. Two configurations, each in its own
processes (started by this script, killed after EMBER_BENCH_TIMEOUT seconds,
default 900, as ember's launches):

  mirrored     tf.distribute.MirroredStrategy over 2 logical CPU devices
               (tf.config.set_logical_device_configuration) in 1 process with
               1 intra-op and 2 inter-op threads (the 2 replicas' ops run side by
               side, each single-threaded: 2 x 1 thread, as ember's replicas;
               EMBER_BENCH_TF_MIRRORED_INTRA=2 gives it 2 intra-op threads)
  multiworker  tf.distribute.MultiWorkerMirroredStrategy, 2 worker processes on
               127.0.0.1 (TF_CONFIG, 2 free ports), each with 1 intra-op and 1
               inter-op thread, ring all-reduce over gRPC

Each prints `INFO ddp_cnn_tf_<config> <samples/s> samples/s ...` (or `SKIP
ddp_cnn_tf_<config>: n/a (reason)`), and the faster one is printed under
ddp_cnn_local and ddp_cnn_mpi, the names ember's global samples/s figures have
(as the PyTorch twin does), so that the ratios are ember's against TensorFlow's
best; with --epochs also ddp_cnn_accuracy_local/_mpi (that run's accuracy).

Each step is one tf.function running strategy.run (forward, GradientTape
backward, Keras Adam: the gradients are all-reduced (summed) across replicas
inside apply_gradients, each replica's loss being its batch mean / 2, which is
DDP's average of the replicas' gradients).

Differences from the ember side that could not be removed:
- channels-last (NHWC) activations (TensorFlow's CPU convolutions want them);
- the step is a traced graph (tf.function), not eager ops;
- Keras's Adam puts eps inside the bias correction (lr_t * m / (sqrt(v) + eps));
- the permutation and the initial weights come from TensorFlow's generators: the
  same distributions and sharding, not the same draws as ember's or PyTorch's;
- MirroredStrategy's replicas are one process's 2 logical devices sharing one
  runtime, whose gradients are summed by ops on one device (its CPU default,
  ReductionToOneDevice), not an all-reduce between 2 processes; MultiWorker's
  workers also run gRPC's threads beside the 1 + 1 that are set;
- the gradients are all-reduced after the whole backward, in Keras's one
  all-reduce call (TensorFlow may pack them), not in buckets overlapping the
  backward as ember's and DDP's reducers do.
"""
import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tf_common as C  # noqa: E402

BATCH, WARM, WORLD = 128, 10, 2
TIMEOUT = float(os.environ.get('EMBER_BENCH_TIMEOUT') or 900)
HERE = os.path.abspath(__file__)
# intra-op threads of the mirrored process (its inter-op threads: WORLD). 1 makes it
# 2 replicas x 1 thread, as ember's; 2 (4 threads on 2 cores) measured 5-10 % faster
# on a loaded 2-core machine, within its noise.
MIRRORED_INTRA = int(os.environ.get('EMBER_BENCH_TF_MIRRORED_INTRA') or 1)


# ---------------------------------------------------------------- the worker

def train(mode, task, steps, epochs):
    """One process of a configuration: trains and prints DATA lines (secs: its time
    over the timed steps; steps; replicas; accuracy with --epochs, task 0 only)."""
    from time import perf_counter as now
    if mode == 'mirrored':
        tf = C.import_tf('ddp_cnn', intra=MIRRORED_INTRA, inter=WORLD)
        cpu = tf.config.list_physical_devices('CPU')[0]
        tf.config.set_logical_device_configuration(
            cpu, [tf.config.LogicalDeviceConfiguration() for _ in range(WORLD)])
        devices = [d.name for d in tf.config.list_logical_devices('CPU')][:WORLD]
        strategy = tf.distribute.MirroredStrategy(devices)
        local = list(range(WORLD))                  # the replicas this process runs
    else:
        tf = C.import_tf('ddp_cnn', intra=1, inter=1)
        comm = tf.distribute.experimental.CommunicationOptions(
            implementation=tf.distribute.experimental.CommunicationImplementation.RING)
        strategy = tf.distribute.MultiWorkerMirroredStrategy(communication_options=comm)
        local = [task]
    replicas = strategy.num_replicas_in_sync
    assert replicas == WORLD, 'expected %d replicas, got %d' % (WORLD, replicas)

    tf.keras.utils.set_random_seed(1)
    images, labels = C.fashion('train')
    n = len(labels)
    images = tf.constant(images)
    labels = tf.constant(labels)

    def shard(r):
        """Replica r's batches: every epoch a permutation of the train set (seeded by
        the epoch: the same in every replica), its r-th of WORLD interleaved shares,
        in batches of BATCH (the last one short), made as the step needs them."""
        def epoch(e):
            perm = tf.argsort(tf.random.stateless_uniform([n], seed=tf.stack([tf.constant(1, tf.int64), e])))
            return tf.data.Dataset.from_tensor_slices(perm).shard(WORLD, r).batch(BATCH)

        def make(ix):
            x = (tf.cast(tf.gather(images, ix), tf.float32) / 255 - C.MEAN) / C.STD
            return x, tf.gather(labels, ix)

        opts = tf.data.Options()
        opts.threading.private_threadpool_size = 1
        opts.threading.max_intra_op_parallelism = 1
        opts.autotune.enabled = False
        return iter(tf.data.Dataset.range(1 << 30).flat_map(epoch).map(make).with_options(opts))

    per_epoch = -(-(n // WORLD) // BATCH)               # 235 steps per replica
    with strategy.scope():
        model = C.model(tf, 'cnn')
        opt = C.adam(tf)
        opt.build(model.trainable_variables)
    ce = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    def replica_step(x, y):
        with tf.GradientTape() as tape:
            loss = ce(y, model(x, training=True)) / replicas
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    @tf.function
    def step(x, y):
        return strategy.run(replica_step, args=(x, y))

    @tf.function
    def barrier():
        return strategy.run(lambda: tf.distribute.get_replica_context().all_reduce(
            tf.distribute.ReduceOp.SUM, tf.constant(1.0)))

    iters = {r: shard(r) for r in local}

    def next_batch():
        batches = {r: next(iters[r]) for r in local}
        xs = strategy.experimental_distribute_values_from_function(
            lambda ctx: batches[ctx.replica_id_in_sync_group][0])
        ys = strategy.experimental_distribute_values_from_function(
            lambda ctx: batches[ctx.replica_id_in_sync_group][1])
        return xs, ys

    def sync(out):
        for v in strategy.experimental_local_results(out):
            v.numpy()

    warm = 0 if epochs else WARM
    total = epochs * per_epoch if epochs else warm + steps
    t0 = None
    if warm == 0:
        sync(barrier())
        t0 = now()
    for i in range(1, total + 1):
        loss = step(*next_batch())
        if i == warm:
            sync(loss)
            sync(barrier())
            t0 = now()
    sync(loss)
    secs = now() - t0
    print('DATA secs %.9g' % secs, flush=True)
    print('DATA steps %d' % (total - warm), flush=True)
    print('DATA replicas %d' % replicas, flush=True)
    if epochs and task == 0:
        x, y = C.fashion('t10k')
        x = C.normalize(x)
        correct = 0
        for s in range(0, len(y), 1000):
            logits = model(tf.constant(x[s:s + 1000]), training=False)
            correct += int((tf.argmax(logits, 1).numpy() == y[s:s + 1000]).sum())
        print('DATA accuracy %.9g' % (100.0 * correct / len(y)), flush=True)


# ---------------------------------------------------------------- the driver

def free_ports(k):
    socks = []
    try:
        for _ in range(k):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(('127.0.0.1', 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def worker_env(threads, extra=None):
    env = dict(os.environ)
    for k in ('EMBER_NUM_THREADS', 'OMP_NUM_THREADS', 'OPENBLAS_NUM_THREADS', 'MKL_NUM_THREADS'):
        env[k] = str(threads)
    env['TF_CPP_MIN_LOG_LEVEL'] = env.get('TF_CPP_MIN_LOG_LEVEL', '2')
    env['PYTHONDONTWRITEBYTECODE'] = '1'
    # gRPC honours http(s)_proxy: never send the workers' 127.0.0.1 traffic to a proxy
    for k in ('no_proxy', 'NO_PROXY'):
        env[k] = ','.join(x for x in (env.get(k), '127.0.0.1', 'localhost') if x)
    env['no_grpc_proxy'] = env['no_proxy']
    env.update(extra or {})
    return env


def run_procs(cmds_envs):
    """Starts the processes (each in its own process group), waits for all of them
    until TIMEOUT, killing the rest when one fails or time is up. Returns their
    (outputs, error or None)."""
    procs = [subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              start_new_session=True) for cmd, env in cmds_envs]
    outs = [[] for _ in procs]
    import threading

    def pump(i, p):
        for line in iter(p.stdout.readline, b''):
            outs[i].append(line.decode('utf-8', 'replace'))
    pumps = [threading.Thread(target=pump, args=(i, p), daemon=True) for i, p in enumerate(procs)]
    for t in pumps:
        t.start()
    deadline, err = time.monotonic() + TIMEOUT, None
    while True:
        codes = [p.poll() for p in procs]
        if all(c is not None for c in codes):
            break
        bad = [c for c in codes if c not in (None, 0)]
        if bad:
            err = 'a process exited with status %d' % bad[0]
            break
        if time.monotonic() > deadline:
            err = 'timed out after %g s' % TIMEOUT
            break
        time.sleep(0.2)
    for p in procs:
        if p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except OSError:
                pass
        p.wait()
    for t in pumps:
        t.join(5)
    texts = [''.join(o) for o in outs]
    if err is None and any(p.returncode for p in procs):
        err = 'a process exited with status %d' % next(p.returncode for p in procs if p.returncode)
    return texts, err


def data(text):
    r = {}
    for line in text.splitlines():
        f = line.split()
        if len(f) == 3 and f[0] == 'DATA':
            r[f[1]] = float(f[2])
    return r


def last_line(text):
    """The last line worth quoting: not a DATA line, nor TensorFlow's informational
    log lines (I0000 ... port.cc ...)."""
    lines = [ln.strip() for ln in text.splitlines()
             if ln.strip() and not ln.startswith(('DATA ', 'INFO tensorflow', 'WARNING: All log'))
             and not (ln[:1] == 'I' and ln[1:5].isdigit())]
    return lines[-1][:160] if lines else ''


def launch(mode, args):
    base = [sys.executable, HERE, '--worker', mode]
    if mode == 'mirrored':
        jobs = [(base + ['--task', '0'] + args, worker_env(1))]
    else:
        ports = free_ports(WORLD)
        cluster = {'worker': ['127.0.0.1:%d' % p for p in ports]}
        jobs = [(base + ['--task', str(i)] + args,
                 worker_env(1, {'TF_CONFIG': json.dumps(
                     {'cluster': cluster, 'task': {'type': 'worker', 'index': i}})}))
                for i in range(WORLD)]
    texts, err = run_procs(jobs)
    ds = [data(t) for t in texts]
    if err or not all('secs' in d for d in ds):
        why = err or 'no figures'
        tail = next((last_line(t) for t in texts if last_line(t)), '')
        return None, '%s failed: %s%s' % (mode, why, (': ' + tail) if tail else '')
    d0 = ds[0]
    secs = max(d['secs'] for d in ds)                       # the slower process
    out = {'samples_s': d0['replicas'] * d0['steps'] * BATCH / secs,
           'step_ms': 1000 * secs / d0['steps']}
    if 'accuracy' in d0:
        out['accuracy'] = d0['accuracy']
    return out, None


DESCR = {
    'mirrored': 'MirroredStrategy, 1 process, 2 logical CPU devices, %d intra-op x %d inter-op threads'
                % (MIRRORED_INTRA, WORLD),
    'multiworker': 'MultiWorkerMirroredStrategy, 2 workers x (1 intra-op, 1 inter-op thread), '
                   'ring all-reduce over gRPC on 127.0.0.1',
}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('--steps', type=int, default=int(os.environ.get('EMBER_BENCH_DDP_STEPS', '100')))
    ap.add_argument('--epochs', type=int, default=0)
    ap.add_argument('--worker', choices=('mirrored', 'multiworker'))
    ap.add_argument('--task', type=int, default=0)
    a = ap.parse_args()
    if a.worker:
        train(a.worker, a.task, a.steps, a.epochs)
        return
    C.import_tf('ddp_cnn')                   # the INFO line first; SKIP and exit 0 without TF
    if not os.path.exists(C.ROOT + '/train-images-idx3-ubyte.gz'):
        print('SKIP ddp_cnn: %s not found (dataset-fashion-mnist)' % C.ROOT)
        return
    args = ['--steps', str(a.steps), '--epochs', str(a.epochs)]
    best = None
    for mode in ('mirrored', 'multiworker'):
        r, why = launch(mode, args)
        if r is None:
            print('SKIP ddp_cnn_tf_%s: n/a (%s)' % (mode, why), flush=True)
            continue
        acc = (' accuracy %.2f %%' % r['accuracy']) if 'accuracy' in r else ''
        C.info('ddp_cnn_tf_%s %.6g samples/s (step %.1f ms%s; %s)' % (
            mode, r['samples_s'], r['step_ms'], acc, DESCR[mode]))
        if best is None or r['samples_s'] > best[1]['samples_s']:
            best = (mode, r)
    if best is None:
        return
    C.info('ddp_cnn_tf: the faster, %s, is printed as ddp_cnn_local and ddp_cnn_mpi' % best[0])
    for name in ('local', 'mpi'):
        C.result('ddp_cnn_' + name, best[1]['samples_s'], 'samples/s')
    if 'accuracy' in best[1]:
        for name in ('local', 'mpi'):
            C.result('ddp_cnn_accuracy_' + name, best[1]['accuracy'], '%')


if __name__ == '__main__':
    main()
