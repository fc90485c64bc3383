#!/bin/sh
# gpu_run.sh -- the one script to run on a GPU machine (an H100 or H200 with
# PyTorch, no LuaJIT, no Debian packages, nothing built there). One run, under a
# hard deadline, tells nearly everything: the facts later failures need, the C tests
# on the real device, gpu_check.lua (every family of device work against the CPU),
# the Lua CUDA tests on the real device, every failure again with the runtime's
# debugging switches and under compute-sanitizer, then the benchmarks beside PyTorch.
#
#   sh tests/bench/gpu_run.sh [ARCHIVE | FOLDER]        (from the repository root)
#
# ARCHIVE defaults to build-portable/ember-gpu.tar.gz, made here by gpu_pack.sh and
# carried alone; it is unpacked into $TMPDIR. A FOLDER laid out as the archive's
# ember-gpu/ is used as it is.
#
# Time: EMBER_GPU_DEADLINE seconds in all (default 480); each step is capped by its
# own limit and by what is left, keeping EMBER_GPU_RESERVE seconds (default 20) for
# the summary. Steps that no longer fit are marked SKIP (deadline).
#
# Libraries: ember's processes, and only they, get LD_LIBRARY_PATH = the archive's
# lib/ then the folders of PyTorch's nvidia-* wheels that hold libcudart, cuBLAS(Lt),
# cuDNN and NCCL (unless EMBER_CUDA_HOME is set; ember's own search also looks in
# /usr/local/cuda). Python, also when ember starts it for a benchmark, keeps the
# environment it came with, through a wrapper set as EMBER_BENCH_PYTHON.
#
# Verdicts: a step passes when its command exits 0. A test step (a C test, a Lua
# test, gpu_check.lua, their reruns) must also end with `#counts P F [S]`: without
# that line it fails (a program that died quietly or a library that did not load
# must not pass), unless it printed `skip: WHY` (it cannot run here) and made no
# check, which is SKIP; so is 0 passed and 0 failed with a `skip:` line. Counts
# with no check passed and no `skip:` line fail too.
#
# Output: $EMBER_GPU_LOGS, else $OUT (the device runner's), else a temporary folder,
# gets summary.txt (a line per step: name, seconds, PASS/FAIL/SKIP and why, written
# as each ends) and run.log (every step's whole output, appended as it goes); at the
# end logs.tar.gz holds one log per step. The runner returns 8 files at most, so
# nothing else is written there. EMBER_GPU_ONLY=REGEX runs only the matching steps.
# Without a GPU it stops within a minute, saying so. Exit status: 1 if a step failed.
T0=$(date +%s)
DEADLINE=${EMBER_GPU_DEADLINE:-480}
RESERVE=${EMBER_GPU_RESERVE:-20}
ONLY=${EMBER_GPU_ONLY:-}
cd "$(dirname "$0")/../.." || exit 2
ROOT=$(pwd)

LOGDIR=${EMBER_GPU_LOGS:-${OUT:-}}
[ -n "$LOGDIR" ] || LOGDIR=$(mktemp -d "${TMPDIR:-/tmp}/ember-gpu-logs.XXXXXX")
mkdir -p "$LOGDIR" || exit 2
WORK=$(mktemp -d "${TMPDIR:-/tmp}/ember-gpu.XXXXXX") || exit 2
mkdir -p "$WORK/logs"
SUMMARY="$LOGDIR/summary.txt"
RUNLOG="$LOGDIR/run.log"
: > "$SUMMARY"; : > "$RUNLOG"
failed=0
FAILED_STEPS=""

say() { echo "$*"; echo "$*" >> "$RUNLOG"; }
left() { echo $((DEADLINE - ($(date +%s) - T0))); }
finish() {
  tar -C "$WORK" -czf "$LOGDIR/logs.tar.gz" logs 2>/dev/null
  rm -rf "$WORK"
  say ""
  say "=== summary ($(($(date +%s) - T0)) s; logs in $LOGDIR: summary.txt, run.log, logs.tar.gz)"
  cat "$SUMMARY"; cat "$SUMMARY" >> "$RUNLOG"
  exit "$1"
}
record() {   # record NAME SECONDS VERDICT
  printf '%-34s %5ss  %s\n' "$1" "$2" "$3" >> "$SUMMARY"
  say "--- $1: $3 ($2 s)"
}

have_timeout=0
command -v timeout >/dev/null 2>&1 && have_timeout=1

# step NAME CAP SHOW CMD...: runs CMD for at most CAP seconds (and what is left), its
# output to logs/NAME.log and run.log; SHOW is "all" or a number of last lines to
# print. Sets $rc and $verdict; a failure joins FAILED_STEPS (for the reruns).
# test_step: the same for a test program, whose verdict also needs its counts.
counted=0
test_step() { counted=1; step "$@"; counted=0; }
step() {
  name=$1; cap=$2; show=$3; shift 3
  rc=0; verdict=""
  if [ -n "$ONLY" ] && ! echo "$name" | grep -Eq "$ONLY"; then return 0; fi
  room=$(( $(left) - RESERVE ))
  if [ "$room" -lt 5 ]; then record "$name" 0 "SKIP (deadline: ${DEADLINE}s in all)"; rc=0; return 0; fi
  [ "$cap" -gt "$room" ] && cap=$room
  log="$WORK/logs/$name.log"
  say ""
  say "=== $name (cap ${cap}s): $*"
  t0=$(date +%s)
  if [ $have_timeout = 1 ]; then timeout -k 5 "$cap" "$@" > "$log" 2>&1
  else "$@" > "$log" 2>&1; fi
  rc=$?
  dt=$(( $(date +%s) - t0 ))
  cat "$log" >> "$RUNLOG"
  if [ "$show" = all ]; then cat "$log"; else tail -n "$show" "$log"; fi
  # the last `#counts P F [S]` line, as "P F S"; the first `skip: WHY` line's WHY
  counts=$(grep -E '^#counts [0-9]+ [0-9]+' "$log" | tail -n 1 | awk '{ print $2, $3, ($4 == "" ? 0 : $4) }')
  skipwhy=$(grep -m 1 '^skip: ' "$log" | cut -c 7-150)
  np=${counts%% *}; nf=$(echo "$counts" | awk '{ print $2 }'); ns=${counts##* }
  if [ $rc = 124 ] || [ $rc = 137 ]; then verdict="FAIL (timed out after ${cap}s)"
  elif [ $rc -gt 128 ]; then verdict="FAIL (signal $((rc - 128)))"
  elif [ -n "$counts" ] && [ "$nf" -gt 0 ]; then verdict="FAIL ($nf of $((np + nf)) checks failed)"
  elif [ $rc != 0 ]; then verdict="FAIL (exit $rc)"
  elif [ $counted = 0 ]; then verdict=PASS
  elif [ -z "$counts" ] && [ -z "$skipwhy" ]; then verdict="FAIL (no #counts line: the checks did not run)"
  elif [ -z "$counts" ] || [ "$np" = 0 ]; then
    if [ -n "$skipwhy" ]; then verdict="SKIP ($skipwhy)"
    else verdict="FAIL (no check made and no skip: line)"; fi
  elif [ "$ns" -gt 0 ]; then
    why=$(grep -m 1 -E '^(skip: |  skip |[^ ]+ +SKIP  )' "$log" | sed -E 's/^(skip: |  skip |[^ ]+ +SKIP  )//' | cut -c 1-120)
    verdict="PASS ($ns skipped${why:+: $why})"
  else verdict=PASS; fi
  case "$verdict" in FAIL*) failed=1; FAILED_STEPS="$FAILED_STEPS $name" ;; esac
  echo "$verdict" > "$WORK/verdict.$name"
  record "$name" "$dt" "$verdict"
}

# -- The build: unpack the archive ------------------------------------------------------------
SRC=${1:-build-portable/ember-gpu.tar.gz}
if [ -f "$SRC" ]; then
  tar -C "$WORK" -xzf "$SRC" || { say "gpu_run: could not unpack $SRC"; finish 2; }
  PACK="$WORK/ember-gpu"
elif [ -x "$SRC/ember" ]; then PACK=$(cd "$SRC" && pwd)
else say "gpu_run: no $SRC (make it with sh tests/bench/gpu_pack.sh, carry it)"; finish 2; fi
EMBER="$PACK/ember"
say "gpu_run: ember $EMBER; deadline ${DEADLINE}s; logs $LOGDIR"

# -- Facts ----------------------------------------------------------------------------------------
# EMBER_GPU_EMULATE=N:MB runs the whole script on emulated devices instead (a check
# of the script itself, tests/lua/test_gpu_pack.lua; no figure of it is a GPU's).
if [ -z "${EMBER_GPU_EMULATE:-}" ] && { ! command -v nvidia-smi >/dev/null 2>&1 || ! timeout 30 nvidia-smi -L > "$WORK/smi" 2>&1 ||
   ! grep -q '^GPU ' "$WORK/smi"; }; then
  cat "$WORK/smi" 2>/dev/null
  record gpu 0 "SKIP (no GPU here: nvidia-smi $( [ -s "$WORK/smi" ] && head -c 150 "$WORK/smi" | tr '\n' ' ' || echo 'not found'))"
  finish 0
fi
PY=${EMBER_BENCH_PYTHON:-python3}
step facts 60 all sh -c '
  echo "## GPU";     nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,compute_cap --format=csv
  echo "## driver";  cat /proc/driver/nvidia/version 2>/dev/null | head -n 1
  echo "## kernel";  uname -srm
  echo "## glibc";   ldd --version 2>&1 | head -n 1
  echo "## CPU";     grep -m 1 "model name" /proc/cpuinfo; echo "cores $(nproc)"
  printf "flags:"; for f in avx2 fma avx512f avx512bw avx512_bf16 amx_tile; do
    grep -m 1 "^flags" /proc/cpuinfo | grep -qw $f && printf " %s" $f; done; echo
  echo "## nvcc";    (nvcc --version || /usr/local/cuda/bin/nvcc --version) 2>/dev/null | tail -n 2 | head -n 1
  echo "## compute-sanitizer"; command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null
  echo "## torch"
  '"$PY"' -c "import torch, sys
print(\"python\", sys.version.split()[0], \"torch\", torch.__version__, \"cuda\", torch.version.cuda,
      \"cudnn\", torch.backends.cudnn.version(), \"nccl\", \".\".join(map(str, torch.cuda.nccl.version())))
print(\"device\", torch.cuda.get_device_name(0), \"capability\", torch.cuda.get_device_capability(0))"
  true'

# Ember's library path: the archive's lib/, then the wheels' CUDA libraries.
CUDA_DIRS=""
if [ -z "${EMBER_CUDA_HOME:-}" ]; then
  nv=$("$PY" -c 'import nvidia, sys; print("\n".join(nvidia.__path__))' 2>/dev/null)
  CUDA_DIRS=$(for p in $nv /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib; do
      find "$p" \( -name 'libcudart.so*' -o -name 'libcublasLt.so*' -o -name 'libcudnn.so*' \
                   -o -name 'libnccl.so*' \) 2>/dev/null
    done | xargs -r -n 1 dirname | awk '!seen[$0]++' | paste -sd: -)
fi
EMBER_LD="$PACK/lib${CUDA_DIRS:+:$CUDA_DIRS}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
ORIG_LD=${LD_LIBRARY_PATH:-}
# Python started by ember (the benchmarks' PyTorch side) gets its own environment back.
cat > "$WORK/python" <<EOF
#!/bin/sh
if [ -n "$ORIG_LD" ]; then export LD_LIBRARY_PATH="$ORIG_LD"; else unset LD_LIBRARY_PATH; fi
exec "$(command -v "$PY")" "\$@"
EOF
chmod +x "$WORK/python"
export EMBER_BENCH_PYTHON="$WORK/python" EMBER_TESTS="$ROOT/tests" PYTHONDONTWRITEBYTECODE=1
# ember_env CMD...: CMD with ember's libraries, on the real devices (a command, not a
# function, so that timeout can run it).
if [ -n "${EMBER_GPU_EMULATE:-}" ]; then real="export EMBER_CUDA_EMULATE='$EMBER_GPU_EMULATE'"
else real="unset EMBER_CUDA_EMULATE; export EMBER_TEST_REAL_CUDA=1"; fi
cat > "$WORK/ember_env" <<EOF
#!/bin/sh
export LD_LIBRARY_PATH="$EMBER_LD"
$real
exec "\$@"
EOF
chmod +x "$WORK/ember_env"
ember_env="$WORK/ember_env"

say "ember's LD_LIBRARY_PATH=$EMBER_LD"
step libraries 30 all sh -c '
  for d in $(echo "$1" | tr ":" " "); do ls "$d"/libcudart.so* "$d"/libcublasLt.so* "$d"/libcudnn.so.* "$d"/libnccl.so* 2>/dev/null; done
  echo "## ldd ember"; LD_LIBRARY_PATH="$1" ldd "$2"
  ! LD_LIBRARY_PATH="$1" ldd "$2" | grep "not found"' sh "$EMBER_LD" "$EMBER"
step info 60 all "$ember_env" "$EMBER" --info
if [ "$rc" != 0 ]; then say "gpu_run: ember does not start here; stopping (see info above)"; finish 1; fi
if ! grep -qi 'cuda:0' "$WORK/logs/info.log"; then
  say "gpu_run: ember finds no CUDA device (no libcudart.so.13 on its path?); stopping"
  failed=1; record stop 0 "FAIL (ember --info lists no cuda device)"; finish 1
fi

# -- The C tests, most basic first -------------------------------------------------------------
for t in test_cuda_libs test_cuda_real test_cuda_backend test_cuda_elementwise test_cuda_transfer \
         test_cuda_reduce test_cuda_index test_cuda_random test_cuda_matmul test_cuda_dnn \
         test_cuda_graph test_cuda_loader test_comm_nccl test_cuda_optim test_backend_parity; do
  [ -x "$PACK/tests/$t" ] || { record "$t" 0 "SKIP (not in the archive)"; continue; }
  test_step "$t" 60 12 "$ember_env" "$PACK/tests/$t"
done

# -- Lua: every family against the CPU, then the Lua CUDA tests on the real device ------------
test_step gpu_check.lua 120 all "$ember_env" "$EMBER" "$ROOT/tests/bench/gpu_check.lua"
for t in test_cuda_ops test_cuda_index_grads test_cuda_nn_ops test_cuda_nn_dnn test_cuda_optim test_cuda_amp test_cuda_amp_graph test_cuda_bn_mixed test_cuda_channels_last test_cuda_bn_nhwc test_cuda_reduce_rows \
         test_cuda test_cuda_loader; do
  test_step "$t.lua" 60 12 "$ember_env" "$EMBER" "$ROOT/tests/lua/$t.lua"
done
# Two replicas on this one GPU (NCCL refuses that; 'auto' takes the host communicator,
# buffers staged through pinned memory): the CNN wrapped, sharded, in groups and as a
# 2-stage pipeline, each against one replica on the global batch. About 30 s.
test_step test_cuda_shared_gpu.lua 45 12 "$ember_env" "$EMBER" "$ROOT/tests/lua/test_cuda_shared_gpu.lua"

# -- Every failure once more: synchronous launches, library logging, eager module loading,
#    then compute-sanitizer where time allows ---------------------------------------------------
SAN=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null)
GDB=$(command -v cuda-gdb || ls /usr/local/cuda/bin/cuda-gdb 2>/dev/null)
for name in $FAILED_STEPS; do
  case "$name" in facts|libraries|info) continue ;; esac
  case "$name" in
    *.lua) cmd="$EMBER"; arg1="$ROOT/tests/$( [ "$name" = gpu_check.lua ] && echo bench || echo lua)/$name" ;;
    *) cmd="$PACK/tests/$name"; arg1="" ;;
  esac
  test_step "$name.debug" 60 20 "$ember_env" env CUDA_LAUNCH_BLOCKING=1 CUDA_MODULE_LOADING=EAGER \
    CUDNN_LOGLEVEL_DBG=2 CUDNN_LOGDEST_DBG=stderr CUBLASLT_LOG_LEVEL=1 $cmd $arg1
  # A crash: where, from cuda-gdb (the GPU machines have no gdb), in batch mode.
  if [ -n "$GDB" ] && grep -q 'signal' "$WORK/verdict.$name" 2>/dev/null; then
    step "$name.backtrace" 60 40 "$ember_env" "$GDB" -batch -ex run -ex bt -ex 'info threads' \
      --args $cmd $arg1
  fi
  if [ -n "$SAN" ]; then
    test_step "$name.sanitizer" 90 30 "$ember_env" "$SAN" --tool memcheck --print-limit 20 $cmd $arg1
  fi
done

# -- Benchmarks last ---------------------------------------------------------------------------
say "benchmarks: TF32 for float32 matmul is off on both sides except in the row that says on"
step bench_cuda 120 all "$ember_env" "$EMBER" "$ROOT/tests/bench/bench_cuda.lua"
step bench_cuda_train 240 all "$ember_env" "$EMBER" "$ROOT/tests/bench/bench_cuda_train.lua" --steps 20
# A training step's peak, every step, against its needs and PyTorch's max_memory_allocated.
step bench_step_peak 90 all "$ember_env" "$EMBER" "$ROOT/tests/bench/bench_step_peak.lua" --device cuda
# Where a bf16 channels-last step goes: the two halves of that row apart, with cuDNN's
# algorithm trial and then with its heuristics alone (EMBER_CUDNN_FIND=0), then the
# profiler's report of that row (ember alone; the trace stays in the work folder).
step bench_cuda_train_split 120 all sh -c '"$@" && EMBER_CUDNN_FIND=0 "$@"' sh "$ember_env" \
  "$EMBER" "$ROOT/tests/bench/bench_cuda_train.lua" --steps 20 \
  --only resnet,resnet_cl,resnet_amp,resnet_bf16 --no-peer
step profile_resnet_bf16 60 60 sh -c 'cd "$1" && shift && "$@"' sh "$WORK" "$ember_env" "$EMBER" \
  --profile "$ROOT/tests/bench/bench_cuda_train.lua" --steps 5 --only resnet_bf16 --no-peer

finish $failed
