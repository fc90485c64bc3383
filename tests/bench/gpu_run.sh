#!/bin/sh
# gpu_run.sh -- the one script to run on the GPU machine (an H100 with PyTorch, no
# LuaJIT, no Debian packages, nothing built there): the CUDA tests with the real
# runtime, then the GPU benchmarks (bench_cuda.lua and bench_cuda_train.lua beside
# PyTorch on the same GPU).
#
#   sh tests/bench/gpu_run.sh [BUILD]       (from the repository root)
#
# What it needs, packed on the build machine by `sh tests/bench/gpu_pack.sh` after
# make: BUILD (default build/carry when it has an ember, else build) with ember,
# lua/, kernels/, tests/test_cuda_* and test_grid_emu, and lib/ -- the shared
# libraries `ldd ember` names (libluajit, libopenblas, ...), put first on
# LD_LIBRARY_PATH here. The GPU machine's glibc must be at least the one
# gpu_pack.sh prints. The CUDA libraries (libcudart, libcublasLt, ...) are not
# carried: unless EMBER_CUDA_HOME is set, the folders of PyTorch's nvidia-* wheels
# that hold them are added to LD_LIBRARY_PATH (ember's own search also looks in
# /usr/local/cuda/lib64). ember looks for the major versions it was built against.
# The python with torch is $EMBER_BENCH_PYTHON, default `python3` here.
#
# The steps, none stopping the others; a summary of each at the end; the exit
# status is 1 when one failed:
#   nvidia-smi -L; ldd (nothing "not found"); ember --info
#   every C test BUILD/tests/test_cuda_*, test_comm_nccl and test_grid_emu, with
#     EMBER_TEST_REAL_CUDA=1
#     and no EMBER_CUDA_EMULATE: the backend's tests (cuda_check_open) then open the
#     real device. test_cuda_emu, test_cuda_alloc and test_grid_emu test the emulator
#     itself and run on the CPU anyway.
#     test_cuda_backend's no-device check skips itself under EMBER_TEST_REAL_CUDA.
#   tests/lua/test_cuda*.lua -- NOTE: these force emulation (each runs itself again
#     with EMBER_CUDA_EMULATE=2:64), so here they check the carried build, not the GPU.
#   build's ember on tests/bench/bench_cuda.lua, with the real GPU (full sizes).
# Each step's full output goes to LOGDIR ($EMBER_GPU_LOGS, else $OUT when the device
# runner sets it, else a temporary folder); the C and Lua tests print their last
# lines here, the rest in full. EMBER_GPU_ONLY=REGEX runs only the steps whose names
# match (e.g. 'bench' or 'test_cuda_matmul|bench'); EMBER_GPU_STEP_TIMEOUT (default
# 300 s) bounds each step.
cd "$(dirname "$0")/../.." || exit 2
ROOT=$(pwd)
if [ -n "$1" ]; then BUILD=$1
elif [ -x build/carry/ember ]; then BUILD=build/carry
else BUILD=build; fi
BUILD=$(cd "$BUILD" 2>/dev/null && pwd) || { echo "gpu_run: no folder $1"; exit 2; }
EMBER="$BUILD/ember"
PY=${EMBER_BENCH_PYTHON:-python3}
export EMBER_BENCH_PYTHON="$PY"
STEP_TIMEOUT=${EMBER_GPU_STEP_TIMEOUT:-300}
ONLY=${EMBER_GPU_ONLY:-}
unset EMBER_CUDA_EMULATE
export EMBER_TESTS="$ROOT/tests" PYTHONDONTWRITEBYTECODE=1

LOGDIR=${EMBER_GPU_LOGS:-${OUT:-}}
[ -n "$LOGDIR" ] || LOGDIR=$(mktemp -d "${TMPDIR:-/tmp}/ember-gpu.XXXXXX")
mkdir -p "$LOGDIR" || exit 2

# The carried libraries first, then the CUDA libraries of PyTorch's wheels.
libpath=""
[ -d "$BUILD/lib" ] && libpath="$BUILD/lib"
if [ -z "${EMBER_CUDA_HOME:-}" ]; then
  nv=$("$PY" -c 'import nvidia; print("\n".join(nvidia.__path__))' 2>/dev/null)
  for d in $(for p in $nv; do
               find "$p" \( -name 'libcudart.so*' -o -name 'libcublasLt.so*' -o -name 'libcublas.so*' \
                           -o -name 'libcudnn.so*' -o -name 'libnccl.so*' \) 2>/dev/null
             done | xargs -r -n 1 dirname | sort -u); do
    libpath="${libpath:+$libpath:}$d"
  done
fi
[ -n "$libpath" ] && export LD_LIBRARY_PATH="$libpath${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

have_timeout=0
command -v timeout >/dev/null 2>&1 && have_timeout=1
SUMMARY="$LOGDIR/summary.txt"
: > "$SUMMARY"
failed=0

# step NAME SHOW CMD...: runs CMD with the step timeout, its output to LOGDIR/NAME.log;
# SHOW is "all" (print it all) or a number of last lines to print.
step() {
  name=$1; show=$2; shift 2
  if [ -n "$ONLY" ] && ! echo "$name" | grep -Eq "$ONLY"; then return 0; fi
  log="$LOGDIR/$name.log"
  echo "=== $name: $*"
  t0=$(date +%s)
  if [ $have_timeout = 1 ]; then timeout -k 10 "$STEP_TIMEOUT" "$@" > "$log" 2>&1
  else "$@" > "$log" 2>&1; fi
  rc=$?
  t1=$(date +%s)
  if [ "$show" = all ]; then cat "$log"; else tail -n "$show" "$log"; fi
  # A test that exited 0 but counted failures ("#counts PASSED FAILED") failed.
  if [ $rc = 0 ] && grep -Eq '^#counts [0-9]+ [1-9]' "$log"; then
    verdict="FAIL ($(grep -E '^#counts' "$log" | tail -n 1 | awk '{ print $3 " of " $2 + $3 }') checks failed)"
    failed=1
  elif [ $rc = 0 ]; then
    verdict=PASS
    grep -q '^skipped:' "$log" && verdict="SKIP ($(grep -m 1 '^skipped:' "$log" | cut -c 1-150))"
  elif [ $rc = 124 ] && [ $have_timeout = 1 ]; then verdict="FAIL (timed out after ${STEP_TIMEOUT}s)"; failed=1
  else verdict="FAIL (exit $rc)"; failed=1; fi
  printf '%-24s %5ss  %s\n' "$name" "$((t1 - t0))" "$verdict" >> "$SUMMARY"
  echo
}

echo "gpu_run: ember $EMBER; python $PY; logs $LOGDIR"
echo "LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}"
echo
step nvidia-smi all nvidia-smi -L
step ldd all sh -c "ldd '$EMBER'; ! ldd '$EMBER' | grep -q 'not found'"
step info all "$EMBER" --info
step torch all "$PY" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available())'

for t in "$BUILD"/tests/test_cuda_* "$BUILD"/tests/test_comm_nccl "$BUILD"/tests/test_grid_emu; do
  case "$t" in *.d|*.o) continue ;; esac
  [ -x "$t" ] || continue
  step "$(basename "$t")" 8 env EMBER_TEST_REAL_CUDA=1 "$t"
done

for t in "$ROOT"/tests/lua/test_cuda*.lua; do
  [ -f "$t" ] || continue
  step "$(basename "$t")" 8 "$EMBER" "$t"
done

step bench_cuda all "$EMBER" "$ROOT/tests/bench/bench_cuda.lua"
step bench_cuda_train all "$EMBER" "$ROOT/tests/bench/bench_cuda_train.lua"

echo "=== summary (full logs in $LOGDIR)"
cat "$SUMMARY"
exit $failed
