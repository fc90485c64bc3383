"""bench_loader_jpeg_tf.py -- TensorFlow side of bench_loader_jpeg.lua (and of its
PyTorch twin bench_loader_jpeg.py): tf.data over the same JPEG folder (5,000
256x256 RGB JPEGs in 10 class folders, made by make_jpegs.py when missing), the
files listed as torchvision's ImageFolder lists them (sorted class folders, label
= folder's index), shuffled (seed 0, reshuffled each epoch), then per image
read_file, decode_jpeg (RGB, the accurate integer IDCT that PIL and ember use),
random_crop 224, random horizontal flip (p = 0.5), to float in [0, 1], normalize
(ImageNet mean/std), in map(num_parallel_calls=2) -- the 2 workers of the other
sides, on a private tf.data thread pool of 2 threads, 1 intra-op thread per op,
as the workers have -- then batch(64) and prefetch(4) (PyTorch's DataLoader keeps
prefetch_factor 2 x 2 workers = 4 batches ahead). images/s over one whole epoch
after a warm-up of 5 batches (of an epoch left unfinished, as the others do);
printed as loader_jpeg.

Differences from the ember side that could not be removed:
- the batches are 64 x 224 x 224 x 3 (HWC, TensorFlow's layout), not
  64 x 3 x 224 x 224: the same values, laid out channels-last;
- tf.data's map runs on threads in this process (as ember's loader workers do);
  PyTorch's twin uses 2 worker processes; the batching (stacking) runs on
  tf.data's own threads, after the parallel map, not in the 2 map threads;
- the random crops, flips and the shuffle come from TensorFlow's generator: the
  same distributions, not the same draws.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tf_common import import_tf, result  # noqa: E402
from time import perf_counter as now  # noqa: E402
import make_jpegs  # noqa: E402

WORKERS, BATCH, CROP = 2, 64, 224
MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)

tf = import_tf('loader_jpeg')
try:
    root = make_jpegs.make(make_jpegs.default_dir())
except ImportError as e:
    print('SKIP loader_jpeg: %s' % e)
    sys.exit(0)

classes = sorted(d.name for d in os.scandir(root) if d.is_dir())
paths, labels = [], []
for k, c in enumerate(classes):
    for f in sorted(os.listdir(os.path.join(root, c))):
        if f.lower().endswith(('.jpg', '.jpeg')):
            paths.append(os.path.join(root, c, f))
            labels.append(k)

tf.random.set_seed(0)
mean = tf.constant(MEAN, tf.float32)
std = tf.constant(STD, tf.float32)


def load(path, label):
    img = tf.io.decode_jpeg(tf.io.read_file(path), channels=3, dct_method='INTEGER_ACCURATE')
    img = tf.image.random_crop(img, (CROP, CROP, 3))
    img = tf.image.random_flip_left_right(img)
    img = (tf.cast(img, tf.float32) / 255 - mean) / std
    return img, label


opts = tf.data.Options()
opts.threading.private_threadpool_size = WORKERS
opts.threading.max_intra_op_parallelism = 1
ds = (tf.data.Dataset.from_tensor_slices((paths, labels))
      .shuffle(len(paths), seed=0, reshuffle_each_iteration=True)
      .map(load, num_parallel_calls=WORKERS)
      .batch(BATCH)
      .prefetch(2 * WORKERS)
      .with_options(opts))

for i, _ in enumerate(ds):           # warm-up: threads, page cache, the traced map function
    if i == 4:
        break
t0, n = now(), 0
for x, _ in ds:
    n += int(x.shape[0])
result('loader_jpeg', n / (now() - t0), 'images/s')
