"""bench_rnn.py -- PyTorch's side of bench_rnn.lua: nn.LSTM and nn.GRU forward (no
autograd) and a training step (forward, backward of the output's sum), same sizes and
names."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import result, time_per_iter, torch  # noqa: E402

T, N, I, H, L = (int(v) for v in os.environ.get('BENCH_LSTM_SIZES', '64,32,128,256,2').split(','))
dev = os.environ.get('EMBER_BENCH_DEVICE', 'cpu')
reps = int(os.environ.get('BENCH_LSTM_REPS', '10'))


def sync():
    if dev != 'cpu':
        torch.cuda.synchronize()


for kind in ('LSTM', 'GRU'):
    torch.manual_seed(0)
    m = getattr(torch.nn, kind)(I, H, num_layers=L).to(dev)
    x = torch.randn(T, N, I, device=dev)

    def forward(n):
        with torch.no_grad():
            for _ in range(n):
                m(x)
        sync()

    def train(n):
        for _ in range(n):
            m.zero_grad()
            y, _ = m(x)
            y.sum().backward()
        sync()

    forward(1)
    train(1)
    name = kind.lower()
    result(name + '_forward', time_per_iter(forward, reps, 3) * 1e3, 'ms/call')
    result(name + '_train_step', time_per_iter(train, reps, 3) * 1e3, 'ms/call')
