"""bench_jpeg_scale.py -- PIL side of bench_jpeg_scale.lua: the same 40 1024x768
JPEGs (made by the ember side; made here with numpy and PIL when that folder is
missing), each opened, converted to RGB and resized (bilinear) to N x N as a
uint8 torch tensor, on one thread, for N = 64 and 224. jpeg_full_N decodes at
full size; jpeg_reduced_N calls draft('RGB', (N, N)) first, PIL's DCT-scaled
decode (the smallest scale whose output still covers N x N, as ember picks).
images/s, median of 3 passes after a warm-up pass; the speed-up too."""
import os
import sys
import statistics
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import result, torch  # noqa: E402

COUNT, W, H = 40, 1024, 768
try:
    import numpy as np
    from PIL import Image
except ImportError as e:
    print('SKIP jpeg_scale: %s' % e)
    sys.exit(0)

root = os.environ.get('EMBER_BENCH_JPEGS_LARGE') or os.path.join(
    os.environ.get('TMPDIR') or '/tmp', 'ember-bench-jpegs-1024')
marker = '%d %dx%d' % (COUNT, W, H)


def complete():
    try:
        with open(os.path.join(root, '.complete')) as f:
            return f.read().startswith(marker)
    except OSError:
        return False


if not complete():   # the ember side's recipe: gradients, soft blobs, a little noise
    os.makedirs(os.path.join(root, 'a'), exist_ok=True)
    rng = np.random.default_rng(0)
    yy, xx = np.mgrid[0:H, 0:W].astype(np.float64)
    yy, xx = yy / H, xx / W
    for i in range(1, COUNT + 1):
        r = rng.uniform(0, 1, (3, 3))
        img = np.stack([(xx - .5) * (r[c, 0] * 240 - 120) + (yy - .5) * (r[c, 1] * 240 - 120)
                        + 40 + r[c, 2] * 175 for c in range(3)], 2)
        for _ in range(5):
            b = rng.uniform(0, 1, 6)
            rad = 0.05 + b[2] * 0.25
            blob = np.exp(((xx - b[0]) ** 2 + (yy - b[1]) ** 2) / (-2 * rad * rad))
            img += blob[:, :, None] * (b[3:] * 180 - 90)
        img += rng.normal(0, 6, img.shape)
        Image.fromarray(np.clip(img, 0, 255).astype(np.uint8)).save(
            os.path.join(root, 'a', '%03d.jpg' % i), quality=90)
    with open(os.path.join(root, '.complete'), 'w') as f:
        f.write(marker + '\n')

files = sorted(os.path.join(root, 'a', f) for f in os.listdir(os.path.join(root, 'a')))


def load(path, n, draft):
    with Image.open(path) as im:
        if draft:
            im.draft('RGB', (n, n))
        im = im.convert('RGB').resize((n, n), Image.BILINEAR)
        return torch.from_numpy(np.array(im)).permute(2, 0, 1)


def rate(n, draft):
    def one_pass():
        for p in files:
            load(p, n, draft)
    one_pass()
    ts = []
    for _ in range(3):
        t0 = time.perf_counter()
        one_pass()
        ts.append(time.perf_counter() - t0)
    return len(files) / statistics.median(ts)


for n in (64, 224):
    full, reduced = rate(n, False), rate(n, True)
    result('jpeg_full_%d' % n, full, 'images/s')
    result('jpeg_reduced_%d' % n, reduced, 'images/s')
    result('jpeg_speedup_%d' % n, reduced / full, 'x')
