"""tf_common.py -- shared by the TensorFlow side of the benchmarks (bench_*_tf.py,
run by the peers environment's python): importing TensorFlow (or a SKIP line and
exit 0 when it can not be imported), the `INFO tensorflow <version>` line, the
thread counts (EMBER_NUM_THREADS intra-op threads, 2 by default, as the ember and
PyTorch sides), the same RESULT line as common.py, the Fashion-MNIST files the
other sides read, the models of train_common.py in Keras with PyTorch's default
initialization, and peak RSS. It does not import torch."""
import gzip
import math
import os
import sys

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')      # no C++ INFO/WARNING chatter
# numpy is imported where it is used: without it (and so without TensorFlow) the
# scripts still get as far as their SKIP line.

THREADS = int(os.environ.get('EMBER_NUM_THREADS', '2'))
ROOT = os.environ.get('EMBER_DATA', '/usr/share/datasets') + '/fashion-mnist'
MEAN, STD = 0.2860, 0.3530


def import_tf(name, intra=None, inter=1):
    """TensorFlow, its INFO line printed and its thread pools sized (intra-op: intra,
    default THREADS; inter-op: inter), before anything starts its runtime. When it
    can not be imported: `SKIP <name> tensorflow not importable: ...` and exit 0."""
    try:
        import tensorflow as tf
    except Exception as e:        # ImportError, or a broken install raising anything
        msg = (str(e).strip().splitlines() or [type(e).__name__])[0]
        print('SKIP %s tensorflow not importable: %s' % (name, msg), flush=True)
        sys.exit(0)
    print('INFO tensorflow %s' % tf.__version__, flush=True)
    tf.config.threading.set_intra_op_parallelism_threads(THREADS if intra is None else intra)
    tf.config.threading.set_inter_op_parallelism_threads(inter)
    return tf


def result(name, value, unit):
    print('RESULT %s %.6g %s' % (name, value, unit), flush=True)


def info(text):
    print('INFO ' + text, flush=True)


def idx(path, offset):
    import numpy as np
    with gzip.open(path, 'rb') as f:
        return np.frombuffer(f.read(), dtype=np.uint8, offset=offset)


def fashion(split):
    """(images uint8 N x 28 x 28 x 1, labels int64 N) of split 'train' or 't10k'."""
    import numpy as np
    images = idx('%s/%s-images-idx3-ubyte.gz' % (ROOT, split), 16).reshape(-1, 28, 28, 1)
    labels = idx('%s/%s-labels-idx1-ubyte.gz' % (ROOT, split), 8).astype(np.int64)
    return images, labels


def normalize(images):
    """uint8 -> float32, (x / 255 - MEAN) / STD, as the other sides."""
    import numpy as np
    return ((images.astype(np.float32) / 255 - MEAN) / STD).astype(np.float32)


def model(tf, kind):
    """train_common.py's models in Keras, channels-last (NHWC: TensorFlow's CPU
    convolutions and pooling want it), each layer initialized as PyTorch's (and
    ember's) default: weight and bias U(-1/sqrt(fan_in), 1/sqrt(fan_in)) (that is
    kaiming_uniform(a = sqrt(5)) for the weight; VarianceScaling(1/3, fan_in,
    uniform) draws from the same range)."""
    L = tf.keras.layers
    w = tf.keras.initializers.VarianceScaling(1 / 3, 'fan_in', 'uniform')

    def b(fan_in):
        r = 1 / math.sqrt(fan_in)
        return tf.keras.initializers.RandomUniform(-r, r)

    def dense(n_in, n_out, relu=True):
        return L.Dense(n_out, activation='relu' if relu else None, kernel_initializer=w,
                       bias_initializer=b(n_in))

    def conv(c_in, c_out):
        return L.Conv2D(c_out, 3, padding='same', activation='relu', kernel_initializer=w,
                        bias_initializer=b(c_in * 9))

    if kind == 'mlp':
        layers = [L.Flatten(), dense(784, 512), dense(512, 256), dense(256, 10, relu=False)]
    else:
        layers = [conv(1, 32), L.MaxPooling2D(2), conv(32, 64), L.MaxPooling2D(2),
                  L.Flatten(), dense(3136, 128), dense(128, 10, relu=False)]
    return tf.keras.Sequential([tf.keras.Input((28, 28, 1))] + layers)


def adam(tf):
    """Adam 1e-3 with PyTorch's defaults (betas 0.9/0.999, eps 1e-8; Keras's eps is 1e-7)."""
    return tf.keras.optimizers.Adam(learning_rate=1e-3, beta_1=0.9, beta_2=0.999, epsilon=1e-8)


def peak_rss_mb():
    with open('/proc/self/status') as f:
        for line in f:
            if line.startswith('VmHWM:'):
                return int(line.split()[1]) / 1024


def run_train(kind, steps):
    """train_common.py's run() in Keras: the first 40 batches of 128 Fashion-MNIST
    training samples, Adam 1e-3, cross-entropy; 5 warm-up steps, then `steps` steps
    timed; train_<kind> in samples/s and rss_<kind> (peak RSS, MB)."""
    from time import perf_counter as now
    tf = import_tf('train_' + kind)
    tf.keras.utils.set_random_seed(0)
    batch, n = 128, 128 * 40
    images, labels = fashion('train')
    x, y = normalize(images[:n]), labels[:n]
    batches = [(tf.constant(x[s:s + batch]), tf.constant(y[s:s + batch]))
               for s in range(0, n, batch)]
    del images, labels, x, y
    m = model(tf, kind)
    opt = adam(tf)
    opt.build(m.trainable_variables)
    ce = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    @tf.function
    def step(xb, yb):
        with tf.GradientTape() as tape:
            loss = ce(yb, m(xb, training=True))
        grads = tape.gradient(loss, m.trainable_variables)
        opt.apply_gradients(zip(grads, m.trainable_variables))
        return loss

    for i in range(5):             # warm-up; the first call also traces the function
        step(*batches[i % 40]).numpy()
    t0 = now()
    for i in range(steps):
        loss = step(*batches[i % 40])
    loss.numpy()                   # the last step has finished
    result('train_' + kind, steps * batch / (now() - t0), 'samples/s')
    result('rss_' + kind, peak_rss_mb(), 'MB')
