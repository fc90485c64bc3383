"""bench_startup.py -- wall time to start and quit: `ember -e ''` against
`python3 -c 'import torch'` (median of 11 runs each, after one warm-up run).

  python3 bench_startup.py EMBER_BINARY [torch]
"""
import statistics
import subprocess
import sys
import time


def wall(cmd, runs=11):
    subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    ts = []
    for _ in range(runs):
        t0 = time.perf_counter()
        r = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        ts.append(time.perf_counter() - t0)
        if r.returncode != 0:
            return None
    return statistics.median(ts)


ember = wall([sys.argv[1], '-e', ''])
if ember is None:
    print('ERROR %s -e \'\' failed' % sys.argv[1])
else:
    print('RESULT startup %.6g ms lower < 20 ms' % (ember * 1e3))
if len(sys.argv) > 2:
    t = wall([sys.executable, '-c', 'import torch'])   # the peers' python (run.sh)
    if t is not None:
        print('TORCH startup %.6g ms' % (t * 1e3))
