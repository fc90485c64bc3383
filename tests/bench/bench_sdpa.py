"""bench_sdpa.py -- PyTorch's side of bench_sdpa.lua: F.scaled_dot_product_attention
forward + backward on the CPU, causal, 8 heads of 64, float32 and bfloat16."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import result, time_per_iter, torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

heads, E = 8, 64
for T in [int(t) for t in os.environ.get('EMBER_BENCH_SDPA_T', '256,1024').split(',')]:
    for dt, tag in ((torch.float32, 'fp32'), (torch.bfloat16, 'bf16')):
        torch.manual_seed(0)
        q, k, v = (torch.randn(1, heads, T, E).to(dt).requires_grad_() for _ in range(3))
        g = torch.randn(1, heads, T, E).to(dt)

        def step(n):
            for _ in range(n):
                q.grad = k.grad = v.grad = None
                F.scaled_dot_product_attention(q, k, v, is_causal=True).backward(g)

        step(1)
        s = time_per_iter(step, 2, 3 if T >= 1024 else 5)
        result('sdpa_%s_T%d' % (tag, T), s * 1e3, 'ms')
