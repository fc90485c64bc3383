#!/bin/sh
# setup.sh -- the peers' Python environment for the benchmarks: the PyTorch 2 and
# TensorFlow 2 that users pick today, from PyPI, pinned in requirements.txt beside
# this file, in a virtual environment outside the source tree.
#
#   sh tests/bench/peers/setup.sh            make it, or reuse it; says what it did
#   sh tests/bench/peers/setup.sh --python   the same, then its python's path alone
#                                            on stdout (what it did goes to stderr)
#
# Where: $EMBER_PEERS_VENV, default ${XDG_CACHE_HOME:-~/.cache}/ember/peers. It is
# reused as it is when it was made from this very requirements.txt (a copy is kept
# in it) and its packages import; otherwise it is made again. `make bench` calls
# it; the tests never need it (`make test` and CI stay without network installs).
# Needs python3 with venv (Debian: python3-venv, which `make bench` installs) and
# PyPI; the first run downloads about 3 GB (PyPI's torch wheel brings NVIDIA's
# CUDA libraries; the benchmarks run it on the CPU).
DIR=$(cd "$(dirname "$0")" && pwd)
REQ="$DIR/requirements.txt"
VENV=${EMBER_PEERS_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/ember/peers}
PY="$VENV/bin/python"
say() { echo "peers: $*" >&2; }
export TF_CPP_MIN_LOG_LEVEL=${TF_CPP_MIN_LOG_LEVEL:-2}   # TensorFlow's start-up chatter

imports_ok() {
  "$PY" -c 'import torch, tensorflow, numpy, safetensors, PIL' >/dev/null 2>&1
}

if [ -x "$PY" ] && cmp -s "$REQ" "$VENV/.ember-requirements.txt" && imports_ok; then
  say "reusing $VENV"
else
  say "making $VENV from $REQ (the first time downloads about 3 GB)"
  rm -rf "$VENV"
  mkdir -p "$(dirname "$VENV")" || exit 1
  python3 -m venv "$VENV" || {
    say "python3 -m venv failed (Debian: apt-get install python3-venv)"; exit 1; }
  "$PY" -m pip install -q --disable-pip-version-check -r "$REQ" >&2 || {
    say "pip install -r $REQ failed"; exit 1; }
  imports_ok || { say "installed, but torch/tensorflow/numpy/safetensors/PIL do not import"; exit 1; }
  cp "$REQ" "$VENV/.ember-requirements.txt"
  say "installed:"
  "$PY" -m pip list --disable-pip-version-check 2>/dev/null |
    grep -Ei '^(torch|torchvision|tensorflow[-_]cpu|numpy|safetensors|pillow) ' | sed 's/^/  /' >&2
fi
"$PY" -c 'import torch, tensorflow as tf, numpy, safetensors
print("peers: torch %s, tensorflow %s, numpy %s, safetensors %s" % (torch.__version__,
      tf.__version__, numpy.__version__, safetensors.__version__))' >&2 2>/dev/null
if [ "$1" = "--python" ]; then echo "$PY"; fi
exit 0
