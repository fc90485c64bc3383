"""bench_loader_jpeg.py -- PyTorch side of bench_loader_jpeg.lua: torchvision's
ImageFolder over the same JPEG folder (made by make_jpegs.py when missing) with
Compose([RandomCrop(224), RandomHorizontalFlip(), ToTensor(), Normalize(...)]),
DataLoader(batch_size=64, shuffle=True, num_workers=2, persistent_workers=True);
images/s over one whole epoch after a warm-up of a few batches."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import result, torch  # noqa: E402
from time import perf_counter as now  # noqa: E402
import make_jpegs  # noqa: E402

try:
    import torchvision.datasets as D
    import torchvision.transforms as TV
    root = make_jpegs.make(make_jpegs.default_dir())
except ImportError as e:
    print('SKIP loader_jpeg: %s' % e)
    sys.exit(0)

torch.manual_seed(0)
ds = D.ImageFolder(root, transform=TV.Compose([
    TV.RandomCrop(224), TV.RandomHorizontalFlip(), TV.ToTensor(),
    TV.Normalize((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))]))
loader = torch.utils.data.DataLoader(ds, batch_size=64, shuffle=True, num_workers=2,
                                     persistent_workers=True, pin_memory=False)
for i, _ in enumerate(loader):   # warm-up: workers, page cache
    if i == 4:
        break
t0, n = now(), 0
for x, _ in loader:
    n += x.shape[0]
result('loader_jpeg', n / (now() - t0), 'images/s')
