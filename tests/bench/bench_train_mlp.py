"""bench_train_mlp.py -- PyTorch side of bench_train_mlp.lua (see train_common.py)."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from train_common import run  # noqa: E402

run("mlp", 100)
