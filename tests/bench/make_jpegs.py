"""make_jpegs.py -- the JPEG folder of the loader_jpeg benchmark: 5,000 256x256 RGB
JPEGs (quality 90) in 10 class subfolders, photo-like enough to compress like
photos (smooth colour gradients and blobs plus a little noise), so decoding costs
what it costs on real images.

  /usr/bin/python3 tests/bench/make_jpegs.py [DIR]     (prints DIR)

DIR defaults to $EMBER_BENCH_JPEGS, else $TMPDIR/ember-bench-jpegs (/tmp when
TMPDIR is unset). A complete folder (its .complete marker names the count) is
reused, so benchmark rounds do not regenerate it; the images are written under a
temporary name and renamed into place at the end, so an interrupted run leaves no
half folder. Deterministic (seeded), needs numpy and PIL."""
import os
import shutil
import sys

COUNT, CLASSES, SIZE, QUALITY = 5000, 10, 256, 90


def default_dir():
    d = os.environ.get('EMBER_BENCH_JPEGS')
    if d:
        return d
    return os.path.join(os.environ.get('TMPDIR') or '/tmp', 'ember-bench-jpegs')


def complete(root):
    try:
        with open(os.path.join(root, '.complete')) as f:
            return f.read().split() == [str(COUNT), str(SIZE)]
    except OSError:
        return False


def image(rng, np):
    # a smooth field: a random linear gradient per channel plus a few soft blobs
    yy, xx = np.mgrid[0:SIZE, 0:SIZE].astype(np.float32) / SIZE
    img = np.empty((SIZE, SIZE, 3), np.float32)
    for c in range(3):
        a, b, o = rng.uniform(-120, 120, 2).tolist() + [rng.uniform(40, 215)]
        img[:, :, c] = o + a * (xx - 0.5) + b * (yy - 0.5)
    for _ in range(rng.integers(3, 8)):
        cx, cy = rng.uniform(0, 1, 2)
        r = rng.uniform(0.05, 0.3)
        blob = np.exp(-((xx - cx) ** 2 + (yy - cy) ** 2) / (2 * r * r))
        img += blob[:, :, None] * rng.uniform(-90, 90, 3).astype(np.float32)
    img += rng.normal(0, 6, img.shape).astype(np.float32)   # sensor-like noise
    return np.clip(img, 0, 255).astype(np.uint8)


def make(root):
    if complete(root):
        return root
    import numpy as np
    from PIL import Image
    tmp = root + '.tmp%d' % os.getpid()
    rng = np.random.default_rng(4)
    for k in range(CLASSES):
        os.makedirs(os.path.join(tmp, 'class%d' % k))
    for i in range(COUNT):
        path = os.path.join(tmp, 'class%d' % (i % CLASSES), 'img%05d.jpg' % i)
        Image.fromarray(image(rng, np), 'RGB').save(path, quality=QUALITY)
    with open(os.path.join(tmp, '.complete'), 'w') as f:
        f.write('%d %d\n' % (COUNT, SIZE))
    if complete(root):              # another run finished first: keep its folder
        shutil.rmtree(tmp)
        return root
    if os.path.exists(root):
        shutil.rmtree(root)
    os.rename(tmp, root)
    return root


if __name__ == '__main__':
    print(make(sys.argv[1] if len(sys.argv) > 1 else default_dir()))
