#!/bin/sh
# run.sh -- the benchmarks: ember beside PyTorch, measured in the same run.
#
#   sh tests/bench/run.sh BUILD_DIR          (make bench)
#   EMBER_BENCH_ONLY=train_cnn sh tests/bench/run.sh build   (the matching benchmarks only)
#
# Each bench_NAME.lua runs under BUILD_DIR/ember and prints
#   RESULT <name> <value> <unit> <lower|higher> <target>
# and bench_NAME.py prints the same names for PyTorch, bench_NAME_tf.py (where
# there is one) for TensorFlow. The peers are those users pick today, PyTorch 2 and
# TensorFlow 2 from PyPI, in the virtual environment tests/bench/peers/setup.sh
# makes or reuses (EMBER_BENCH_PYTHON overrides its python). Every side uses 2
# threads. The table gives
#   name  ember X unit  torch Y unit  ratio R  [tf Z unit  ratio_tf S]  (target ...)
# (best of EMBER_BENCH_ROUNDS alternating runs, default 3) where R is ember's
# speed relative to PyTorch's: torch/ember for times,
# ember/torch for throughputs -- above 1 means ember is faster. Startup compares
# `ember -e ''` with `python3 -c 'import torch'` (median of 11 runs).
# The table, the machine and the library versions are also written to the page
# docs/benchmarks.md (write_page.sh; EMBER_BENCH_PAGE names another file). A run of
# a subset (EMBER_BENCH_ONLY) writes BUILD_DIR/benchmarks-subset.md instead, so that
# the page always holds a whole run.
# Benchmarks are never part of `make test`. The GPU benchmarks (bench_cuda.lua,
# bench_cuda_train.lua: ember on cuda beside PyTorch on cuda) are left out here: tests/bench/gpu_run.sh
# runs them on a GPU machine, and they print their own table.
#
# The em.distribute benchmarks (bench_allreduce, bench_ddp_*; see dist_common.lua)
# start their own replicas: `ember --replicas 2`, `mpirun -np 2 ember` and 1
# replica x 2 threads, with the thread counts they need; their PyTorch twins
# spawn 2 gloo processes x 1 thread. There the twin's figure is printed under
# each ember column's name, so the ratio is ember's configuration against the
# same PyTorch figure (local/gloo, mpi/gloo, ember/DDP). A configuration that
# could not run (no mpirun, say) prints a SKIP line with the reason, shown below
# the table. EMBER_BENCH_PEER=0 tells their drivers not to run the twin
# themselves, as they do when started by hand.

BUILD=${1:-build}
DIR=$(cd "$(dirname "$0")" && pwd)
EMBER="$BUILD/ember"
if [ -n "${EMBER_BENCH_PYTHON:-}" ]; then PY=$EMBER_BENCH_PYTHON
else PY=$(sh "$DIR/peers/setup.sh" --python) || { echo "bench: the peers' environment could not be made"; PY=/usr/bin/python3; }
fi
export EMBER_BENCH_PYTHON="$PY" TF_CPP_MIN_LOG_LEVEL=2
THREADS=2
export EMBER_NUM_THREADS=$THREADS OMP_NUM_THREADS=$THREADS OPENBLAS_NUM_THREADS=$THREADS \
       MKL_NUM_THREADS=$THREADS PYTHONDONTWRITEBYTECODE=1 EMBER_BENCH_PEER=0
TMP=$(mktemp -d "${TMPDIR:-/tmp}/ember-bench.XXXXXX") || exit 2
trap 'rm -rf "$TMP"' EXIT INT TERM

if [ ! -x "$EMBER" ]; then
  echo "bench: $EMBER not found (run make first)"
  exit 1
fi
torch=0 tf=0
if [ -x "$PY" ] && "$PY" -c 'import torch' >/dev/null 2>&1; then torch=1; fi
if [ -x "$PY" ] && "$PY" -c 'import tensorflow' >/dev/null 2>&1; then tf=1; fi
echo "ember: $EMBER    torch: $([ $torch = 1 ] && "$PY" -c 'import torch; print(torch.__version__)' || echo n/a)    tensorflow: $([ $tf = 1 ] && "$PY" -c 'import tensorflow as t; print(t.__version__)' 2>/dev/null || echo n/a)    threads: $THREADS"
echo

: > "$TMP/ember"
: > "$TMP/torch"
: > "$TMP/tf"
: > "$TMP/skip"
# The two sides alternate, ROUNDS times, and each keeps its best figure: on a
# shared machine the load changes between runs, and the best of a few is the
# figure least disturbed by it.
ROUNDS=${EMBER_BENCH_ROUNDS:-3}
r=0
while [ $r -lt "$ROUNDS" ]; do
  r=$((r + 1))
  for lua in "$DIR"/bench_*.lua; do
    name=$(basename "$lua" .lua)
    case "$name" in bench_cuda|bench_cuda_train) continue ;; esac   # gpu_run.sh
    case "$name" in bench_cpu_kernels) continue ;; esac   # kernel by kernel, run alone
    # the planner's grid measures memory, not speed, and takes about half an hour:
    # run alone (build/ember tests/bench/bench_plan_grid.lua)
    case "$name" in bench_plan_grid) continue ;; esac
    # EMBER_BENCH_ONLY=REGEX: only the benchmarks whose names match (grep -E)
    if [ -n "${EMBER_BENCH_ONLY:-}" ] && ! echo "$name" | grep -Eq "$EMBER_BENCH_ONLY"; then
      continue
    fi
    # the ResNet's compiled rows too (em.compile's step beside the eager ones)
    args=""
    case "$name" in bench_train_resnet) args="--compile" ;; esac
    if ! "$EMBER" "$lua" $args > "$TMP/out" 2>&1; then
      echo "$name: ember failed:"; sed 's/^/  /' "$TMP/out" | tail -n 5
    fi
    grep '^RESULT ' "$TMP/out" >> "$TMP/ember"
    grep '^SKIP ' "$TMP/out" >> "$TMP/skip"
    if [ $torch = 1 ] && [ -f "$DIR/$name.py" ]; then
      if ! "$PY" "$DIR/$name.py" > "$TMP/out" 2>&1; then
        echo "$name: torch failed:"; sed 's/^/  /' "$TMP/out" | tail -n 5
      fi
      grep '^RESULT ' "$TMP/out" >> "$TMP/torch"
      grep '^SKIP ' "$TMP/out" | sed 's/^SKIP /SKIP torch: /' >> "$TMP/skip"
    fi
    if [ $tf = 1 ] && [ -f "$DIR/${name}_tf.py" ]; then
      if ! "$PY" "$DIR/${name}_tf.py" > "$TMP/out" 2>&1; then
        echo "$name: tensorflow failed:"; sed 's/^/  /' "$TMP/out" | tail -n 5
      fi
      grep '^RESULT ' "$TMP/out" >> "$TMP/tf"
      grep -E '^(SKIP|INFO) ' "$TMP/out" | sed -E 's/^(SKIP|INFO) /\1 tensorflow: /' >> "$TMP/skip"
    fi
  done
done

# Startup: timed by Python when there is one, else by date(1) (coarser).
if [ -x "$PY" ]; then
  "$PY" "$DIR/bench_startup.py" "$EMBER" $([ $torch = 1 ] && echo torch) > "$TMP/out" 2>&1
  grep '^RESULT ' "$TMP/out" >> "$TMP/ember"
  grep '^TORCH ' "$TMP/out" | sed 's/^TORCH/RESULT/' >> "$TMP/torch"
  grep '^ERROR ' "$TMP/out"
else
  ts=""
  for _ in 1 2 3 4 5 6 7 8 9 10 11; do
    t0=$(date +%s%N); "$EMBER" -e '' >/dev/null 2>&1; t1=$(date +%s%N)
    ts="$ts $(( (t1 - t0) / 1000 ))"
  done
  med=$(echo $ts | tr ' ' '\n' | sort -n | sed -n 6p)
  echo "RESULT startup $(awk "BEGIN{print $med/1000}") ms lower < 20 ms" >> "$TMP/ember"
fi

echo "RESULT _ 0 _" >> "$TMP/torch"   # never empty: awk tells the files apart by FNR == NR
echo "RESULT _ 0 _" >> "$TMP/tf"

# best SIDE: SIDE's best figure of the rounds per name, in the direction ember's
# line for that name gives.
best() {
  awk 'FNR == NR { dir[$2] = $5; next }
       { better = dir[$2]
         if (!($2 in best) || (better == "lower" ? $3 < best[$2] : $3 > best[$2])) {
           best[$2] = $3; line[$2] = $0 } }
       END { for (n in line) print line[n] }' "$TMP/ember" "$1"
}
best "$TMP/ember" > "$TMP/ember.best"
best "$TMP/torch" > "$TMP/torch.best"; echo "RESULT _ 0 _" >> "$TMP/torch.best"
best "$TMP/tf" > "$TMP/tf.best"; echo "RESULT _ 0 _" >> "$TMP/tf.best"
sort -k2,2 "$TMP/ember.best" > "$TMP/ember"
# The table: ember's lines joined with torch's and tensorflow's on the name. Then the
# the headline ratios, as RESULT lines of their own (ember / peer, same run):
# ddp_cnn_vs_torch2 and ddp_cnn_vs_tf (the threads replicas' global samples/s),
# train_cnn_fp32_vs_torch2, train_mlp_fp32_vs_torch2, train_cnn_fp32_vs_tf,
# train_cnn_bf16_vs_torch2, train_resnet_fp32_vs_torch2, train_resnet_bf16_vs_torch2,
# train_cnn_compiled_vs_torch2 and _vs_tf (em.compile's step against the peers' own),
# train_resnet_compiled_fp32_vs_torch2 and _bf16_ (the best compiled layout against
# PyTorch's best eager one), the same three against torch.compile's
# (train_cnn_compiled_vs_torch_compile, train_resnet_compiled_{fp32,bf16}_vs_torch_compile),
# compile_tiny_step_vs_torch2 (a small MLP's compiled step against PyTorch eager),
# compile_chain_vs_torch2 (a compiled element-wise chain against PyTorch eager), and for
# the sharded modes shard_<model>_<mode>_n<N>_vs_torch2 (samples/s, ember/PyTorch)
# and shard_<model>_mem_<mode>_n<N>_vs_torch2 (memory per replica, PyTorch/ember),
# and for the pipelines pipe_<schedule>_p<P>_m<M>_vs_torch2 (samples/s, ember/PyTorch).
{ awk '
  function cmp(x, op, y) {
    if (op == "<=") return x <= y + 0 ? "met" : "MISSED"
    if (op == "<") return x < y + 0 ? "met" : "MISSED"
    if (op == ">=") return x >= y + 0 ? "met" : "MISSED"
    if (op == ">") return x > y + 0 ? "met" : "MISSED"
    return ""
  }
  function ratio(better, mine, peer) { return better == "lower" ? peer / mine : mine / peer }
  FILENAME == ARGV[1] { tv[$2] = $3; tu[$2] = $4; next }
  FILENAME == ARGV[2] { fv[$2] = $3; fu[$2] = $4; next }
  {
    name = $2; v = $3; unit = $4; better = $5; ev[name] = v; eb[name] = better
    target = ""; for (i = 6; i <= NF; i++) target = target (i > 6 ? " " : "") $i
    r = ""
    if (name in tv && tv[name] > 0 && v > 0) {
      r = ratio(better, v, tv[name])
      t = sprintf("torch %9.4g %-8s", tv[name], tu[name]); rs = sprintf("ratio %6.3g", r)
    } else {
      t = sprintf("torch %9s %-8s", "n/a", ""); rs = sprintf("ratio %6s", "n/a")
    }
    f = ""
    if (name in fv && fv[name] > 0 && v > 0)
      f = sprintf("  tf %9.4g %-8s ratio_tf %6.3g", fv[name], fu[name], ratio(better, v, fv[name]))
    # the verdict: "ratio OP X" compares the ratio (against PyTorch), "OP torch" the
    # figure with the PyTorch figure, "OP X unit" the figure with X
    n = split(target, w, " "); verdict = ""
    if (w[1] == "ratio" && n >= 3 && r != "") verdict = cmp(r, w[2], w[3])
    else if (w[1] != "ratio" && w[2] == "torch") { if (r != "") verdict = cmp(v, w[1], tv[name]) }
    else if (w[1] != "ratio" && n >= 2) verdict = cmp(v, w[1], w[2])
    printf "%-24s ember %9.4g %-8s %s %s%s  (target %s)%s\n", name, v, unit, t, rs, f, target,
           verdict == "" ? "" : "  " verdict
    # sharded data parallel: the samples/s and memory per replica of each mode against
    # the PyTorch peer (bench_shard), and the samples/s of the pipelines (bench_pipeline), as
    # headlines below (in name order, as read)
    if (((name ~ /^shard_/ && name !~ /_vs_formula$/) || name ~ /^pipe_.*_m[0-9]+$/) && r != "")
      shard = shard sprintf("RESULT %s_vs_torch2 %.4g x higher\n", name, r)
  }
  END {
    # NAME:EMBER_FIGURE[:PEER_FIGURE when the peers name it otherwise] (a compiled
    # step against the plain step of the peers)
    split("ddp_cnn_vs:ddp_cnn_local train_cnn_fp32_vs:train_cnn train_mlp_fp32_vs:train_mlp " \
          "train_cnn_bf16_vs:train_cnn_bf16 train_resnet_fp32_vs:train_resnet_fp32 " \
          "train_resnet_bf16_vs:train_resnet_bf16 " \
          "train_resnet_compiled_fp32_vs:train_resnet_compiled_fp32:train_resnet_fp32 " \
          "train_resnet_compiled_bf16_vs:train_resnet_compiled_bf16:train_resnet_bf16 " \
          "train_cnn_compiled_vs:train_cnn_compiled:train_cnn " \
          "compile_tiny_step_vs:compile_tiny_step compile_chain_vs:compile_chain " \
          "ddp_cnn_compiled_vs:ddp_cnn_local_compiled:ddp_cnn_local", pairs, " ")
    for (i = 1; i in pairs; i++) {
      n = split(pairs[i], kv, ":"); key = kv[2]; peer = n >= 3 ? kv[3] : key
      if (!(key in ev) || ev[key] <= 0) continue
      if (peer in tv && tv[peer] > 0)
        printf "RESULT %s_torch2 %.4g x higher\n", kv[1], ratio(eb[key], ev[key], tv[peer])
      if (peer in fv && fv[peer] > 0)
        printf "RESULT %s_tf %.4g x higher\n", kv[1], ratio(eb[key], ev[key], fv[peer])
    }
    # a compiled step against the same model through torch.compile (NAME:EMBER:PEER)
    split("train_cnn_compiled_vs_torch_compile:train_cnn_compiled:train_cnn_torch_compile " \
          "train_resnet_compiled_fp32_vs_torch_compile:train_resnet_compiled_fp32:" \
          "train_resnet_torch_compile_fp32 " \
          "train_resnet_compiled_bf16_vs_torch_compile:train_resnet_compiled_bf16:" \
          "train_resnet_torch_compile_bf16", tc, " ")
    for (i = 1; i in tc; i++) {
      split(tc[i], kv, ":")
      if (kv[2] in ev && ev[kv[2]] > 0 && kv[3] in tv && tv[kv[3]] > 0)
        printf "RESULT %s %.4g x higher\n", kv[1], ratio(eb[kv[2]], ev[kv[2]], tv[kv[3]])
    }
    printf "%s", shard
  }
' "$TMP/torch.best" "$TMP/tf.best" "$TMP/ember"
# Skipped configurations, once each.
if [ -s "$TMP/skip" ]; then echo; sort -u "$TMP/skip"; fi
} | tee "$TMP/table"

# The page: the whole run's, or a subset's beside the build.
if [ -n "${EMBER_BENCH_ONLY:-}" ]; then PAGE=${EMBER_BENCH_PAGE:-$BUILD/benchmarks-subset.md}
else PAGE=${EMBER_BENCH_PAGE:-$DIR/../../docs/benchmarks.md}; fi
cmd="make bench"
[ -n "${EMBER_BENCH_ONLY:-}" ] && cmd="EMBER_BENCH_ONLY='$EMBER_BENCH_ONLY' $cmd"
[ "$ROUNDS" != 3 ] && cmd="EMBER_BENCH_ROUNDS=$ROUNDS $cmd"
sh "$DIR/write_page.sh" "$EMBER" "$PY" "$TMP/table" "$PAGE" "$cmd" && echo && echo "bench: wrote $PAGE"
