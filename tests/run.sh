#!/usr/bin/env bash
# run.sh -- runs the test programs, several at a time, and adds up their results.
#
#   bash tests/run.sh [--c-only] [--only REGEX] [--except REGEX] [--jobs N] BUILD_DIR
#
# Runs every BUILD_DIR/tests/test_* C program and, unless --c-only, every
# tests/lua/test_*.lua with BUILD_DIR/ember. --only keeps the programs whose names
# match the extended regex (`make check ONLY=...`, and the ThreadSanitizer pass
# runs the tests of the concurrent code this way); --except leaves out those that
# match (`make check` leaves out the portable build's packaging test).
#
# Each program prints one line per check group or failure and ends with
# `#counts PASSED FAILED [SKIPPED]`. This script prints each program's output whole
# when it ends (programs run side by side, so their lines are not interleaved),
# headed by `== NAME (SECONDS s) [DONE/ALL]`, sums the counts and ends with exactly
# one line `N passed, N failed, N skipped`. A program fails, by name, when it
# crashes, hangs past EMBER_TEST_TIMEOUT seconds (default 600), exits non-zero
# with no failed check (e.g. a sanitizer's report at exit), never prints its
# counts, or makes no check at all without saying why on a `skip: REASON` line.
#
# Why in parallel, and in this order: on two cores one test at a time leaves a
# core idle whenever a test sleeps, waits on a child or runs one thread, so
# EMBER_TEST_JOBS programs (default: the number of cores) run at once, the
# longest first so that none is left running alone at the end. The order comes
# from the seconds each program took last time in this build folder
# (BUILD_DIR/test-times); a fresh build uses the hint list below. So no test may
# compare a wall-clock time with a bound: its neighbours could push it over.

c_only=0 only="" except="" jobs=${EMBER_TEST_JOBS:-}
while [ $# -gt 1 ]; do
  case $1 in
    --c-only) c_only=1; shift ;;
    --only) only=$2; shift 2 ;;
    --except) except=$2; shift 2 ;;
    --jobs) jobs=$2; shift 2 ;;
    *) break ;;
  esac
done
BUILD=${1:-build}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
TIMEOUT=${EMBER_TEST_TIMEOUT:-600}
[ -n "$jobs" ] || jobs=$(nproc 2>/dev/null || echo 2)
TMP=$(mktemp -d "${TMPDIR:-/tmp}/ember-tests.XXXXXX") || exit 2
trap 'rm -rf "$TMP"' EXIT
trap 'kill $(jobs -p) 2>/dev/null; exit 130' INT TERM
EMBER_TESTS="$ROOT/tests"
export EMBER_TESTS

# The programs that take longest on a fresh build, longest first; the rest
# follow in name order. Only the order depends on this list.
SLOW_HINT="test_distribute_plan.lua test_gpu_pack.lua test_plan_grid.lua test_distribute.lua test_cuda_reduce
test_cuda_ops.lua test_distribute_pipeline.lua test_distribute_p2p.lua test_cuda.lua
test_cuda_distribute.lua test_distribute_shard.lua test_cuda_elementwise test_embed.lua
test_comm_mpi test_cuda_index_grads.lua test_profile.lua test_memory_sweep.lua test_cuda_example.lua"

have_timeout=0
command -v timeout >/dev/null 2>&1 && have_timeout=1

# -- The list: NAME<TAB>COMMAND per program --------------------------------------
list=$TMP/list
: > "$list"
add() {   # add NAME COMMAND
  if [ -n "$only" ] && ! printf '%s\n' "$1" | grep -Eq "$only"; then return; fi
  if [ -n "$except" ] && printf '%s\n' "$1" | grep -Eq "$except"; then return; fi
  printf '%s\t%s\n' "$1" "$2" >> "$list"
}
found=0
# One program per source in tests/c: a binary left in the build folder by a
# source since removed must not run (it would test stale code).
for src in "$ROOT"/tests/c/test_*.c; do
  [ -f "$src" ] || continue
  found=1
  name=$(basename "$src" .c)
  t="$BUILD/tests/$name"
  if [ -x "$t" ]; then add "$name" "exec '$t'"; else add "$name" "echo '$t was not built'; exit 1"; fi
done
if [ $c_only = 0 ]; then
  for t in "$ROOT"/tests/lua/test_*.lua; do
    [ -f "$t" ] || continue
    name=$(basename "$t")
    if [ -x "$BUILD/ember" ]; then add "$name" "exec '$BUILD/ember' '$t'"
    else add "$name" "echo '$BUILD/ember is missing'; exit 1"; fi
  done
fi

# Order: recorded seconds (longest first), else the hint's rank, else name order.
times=$BUILD/test-times
order() {
  awk -F'\t' -v hint="$SLOW_HINT" -v times="$times" '
    BEGIN { n = split(hint, h, /[ \n]+/); for (i = 1; i <= n; i++) rank[h[i]] = n - i + 1
            while ((getline line < times) > 0) { split(line, f, " "); secs[f[1]] = f[2]; have = 1 } }
    { k = have ? ($1 in secs ? secs[$1] : 1e6) : ($1 in rank ? rank[$1] : 0)
      printf "%012.3f\t%s\n", k, $0 }' "$list" | sort -t"$(printf '\t')" -k1,1r -k2,2 | cut -f2-
}
order > "$TMP/ordered"
total=$(wc -l < "$TMP/ordered")
mkdir -p "$TMP/res"

# run_one NAME COMMAND: runs it with its output in a file, then prints that output
# whole (under a lock) and leaves `PASSED FAILED SKIPPED SECONDS WHY` in res/NAME.
run_one() {
  local name=$1 cmd=$2 out=$TMP/res/$name.out rc t0 t1 counts p f s why secs
  t0=$(date +%s%N)
  if [ $have_timeout = 1 ]; then timeout -k 10 "$TIMEOUT" sh -c "$cmd" > "$out" 2>&1
  else sh -c "$cmd" > "$out" 2>&1; fi
  rc=$?
  t1=$(date +%s%N)
  secs=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.1f", (b - a) / 1e9 }')
  counts=$(grep -E '^#counts [0-9]+ [0-9]+' "$out" | tail -n 1)
  read -r _ p f s <<< "$counts"
  p=${p:-0} f=${f:-0} s=${s:-0}
  why=""
  if [ "$rc" = 124 ] && [ $have_timeout = 1 ]; then why="timed out after ${TIMEOUT}s"
  elif [ "$rc" -gt 128 ] 2>/dev/null; then why="crashed (signal $((rc - 128)))"
  elif [ -z "$counts" ]; then why="exited with status $rc without printing its counts"
  elif [ "$rc" != 0 ] && [ "$f" = 0 ]; then why="exited with status $rc after its checks passed"
  elif [ "$((p + f))" = 0 ] && ! grep -q '^skip: ' "$out"; then
    why="made no checks and printed no 'skip: REASON' line"
  fi
  {
    flock 9     # (the result is written under the lock too, so DONE counts it once)
    printf '%s %s %s %s %s\n' "$p" "$f" "$s" "$secs" "$why" > "$TMP/res/$name"
    done_n=$(ls "$TMP/res" | grep -vc '\.out$')
    echo "== $name ($secs s) [$done_n/$total]"
    cat "$out"
    [ -z "$why" ] || echo "FAIL $name: $why"
  } 9> "$TMP/lock"
}

# -- The pool: JOBS at a time ---------------------------------------------------------
while IFS="$(printf '\t')" read -r name cmd; do
  while [ "$(jobs -rp | wc -l)" -ge "$jobs" ]; do wait -n; done
  run_one "$name" "$cmd" < /dev/null &
done < "$TMP/ordered"
wait

# -- The sums, the problems, the times for next time --------------------------------
passed=0 failed=0 skipped=0 problems="" newtimes=$TMP/times
: > "$newtimes"
while IFS="$(printf '\t')" read -r name cmd; do
  if [ -f "$TMP/res/$name" ]; then read -r p f s secs why < "$TMP/res/$name"
  else p=0 f=0 s=0 secs=0 why="never ran (no result)"; fi
  passed=$((passed + p)) failed=$((failed + f)) skipped=$((skipped + s))
  echo "$name $secs" >> "$newtimes"
  if [ -n "$why" ]; then
    failed=$((failed + 1)); problems="$problems
  $name: $why"
  elif [ "$f" != 0 ]; then problems="$problems
  $name: $f failed"
  fi
  # The failing checks' own lines, repeated here: a log cut to its tail still says why.
  if [ -n "$why" ] || [ "$f" != 0 ]; then
    lines=$(grep -E '^ *(FAIL|not ok)' "$TMP/res/$name.out" 2>/dev/null | head -n 8 | cut -c1-300)
    [ -z "$lines" ] || problems="$problems
$(printf '%s\n' "$lines" | sed 's/^ */    /')"
  fi
done < "$TMP/ordered"
# Merged into the recorded times: a subset run keeps the others' seconds.
{ [ -f "$times" ] && awk 'NR == FNR { seen[$1] = 1; next } !($1 in seen)' "$newtimes" "$times"
  cat "$newtimes"; } > "$TMP/merged" 2>/dev/null && cp "$TMP/merged" "$times" 2>/dev/null
if [ $found = 0 ]; then
  failed=$((failed + 1)); problems="$problems
  C tests: none in tests/c"
fi
echo "== slowest: $(sort -k2,2nr "$newtimes" | head -n 5 | awk '{printf "%s%s %ss", (NR > 1 ? ", " : ""), $1, $2}')"
[ -z "$problems" ] || echo "== problems:$problems"
echo "$passed passed, $failed failed, $skipped skipped"
[ "$failed" = 0 ]
