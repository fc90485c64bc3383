#!/bin/sh
# run.sh -- runs the test programs and adds up their results.
#
#   sh tests/run.sh [--c-only] [--only REGEX] BUILD_DIR
#
# --only runs just the programs whose names match the extended regex (the
# ThreadSanitizer pass runs the tests of the concurrent code this way).
# Runs every BUILD_DIR/tests/test_* C program and, unless --c-only, every
# tests/lua/test_*.lua with BUILD_DIR/ember. Each program prints one line per check
# group or failure and ends with `#counts PASSED FAILED`; this script prints their
# output, sums the counts and ends with exactly one line `N passed, N failed`.
# A program that crashes, hangs past EMBER_TEST_TIMEOUT seconds (default 600),
# exits non-zero with no failed check (e.g. LeakSanitizer at exit) or never prints
# its counts adds one failure, reported by name. The exit status is non-zero when
# anything failed.

c_only=0 only=""
if [ "$1" = "--c-only" ]; then c_only=1; shift; fi
if [ "$1" = "--only" ]; then only=$2; shift 2; fi
BUILD=${1:-build}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
TIMEOUT=${EMBER_TEST_TIMEOUT:-600}
TMP=$(mktemp -d "${TMPDIR:-/tmp}/ember-tests.XXXXXX") || exit 2
trap 'rm -rf "$TMP"' EXIT INT TERM

passed=0
failed=0
problems=""

have_timeout=0
command -v timeout >/dev/null 2>&1 && have_timeout=1

# run_one NAME COMMAND...: runs it, streams its output, adds its counts.
run_one() {
  name=$1; shift
  if [ -n "$only" ] && ! echo "$name" | grep -Eq "$only"; then return; fi
  echo "== $name"
  # The exit status travels through a file: in a pipeline sh keeps only tee's.
  {
    if [ $have_timeout = 1 ]; then timeout -k 10 "$TIMEOUT" "$@" 2>&1; else "$@" 2>&1; fi
    echo $? > "$TMP/rc"
  } | tee "$TMP/out"
  rc=$(cat "$TMP/rc" 2>/dev/null || echo 1)
  counts=$(grep -E '^#counts [0-9]+ [0-9]+' "$TMP/out" | tail -n 1)
  if [ -n "$counts" ]; then
    p=$(echo "$counts" | awk '{print $2}')
    f=$(echo "$counts" | awk '{print $3}')
  else
    p=0 f=0
  fi
  passed=$((passed + p))
  failed=$((failed + f))
  why=""
  if [ "$rc" = 124 ] && [ $have_timeout = 1 ]; then why="timed out after ${TIMEOUT}s"
  elif [ "$rc" -gt 128 ] 2>/dev/null; then why="crashed (signal $((rc - 128)))"
  elif [ -z "$counts" ]; then why="exited with status $rc without printing its counts"
  elif [ "$rc" != 0 ] && [ "$f" = 0 ]; then why="exited with status $rc after its checks passed"
  fi
  if [ -n "$why" ]; then
    failed=$((failed + 1))
    echo "FAIL $name: $why"
    problems="$problems
  $name: $why"
  elif [ "$f" != 0 ]; then
    problems="$problems
  $name: $f failed"
  fi
}

# -- C tests ---------------------------------------------------------------------------
found=0
# One program per source in tests/c: a binary left in the build folder by a
# source since removed must not run (it would test stale code).
for src in "$ROOT"/tests/c/test_*.c; do
  t="$BUILD/tests/$(basename "$src" .c)"
  found=1
  if [ -x "$t" ]; then
    run_one "$(basename "$t")" "$t"
  else
    run_one "$(basename "$t")" sh -c "echo '$t was not built'; exit 1"
  fi
done
if [ $found = 0 ]; then
  echo "FAIL no C test programs in $BUILD/tests (build them with make test)"
  failed=$((failed + 1))
  problems="$problems
  C tests: none built"
fi

# -- Lua tests --------------------------------------------------------------------------
if [ $c_only = 0 ]; then
  EMBER_TESTS="$ROOT/tests"
  export EMBER_TESTS
  for t in "$ROOT"/tests/lua/test_*.lua; do
    [ -f "$t" ] || continue
    if [ ! -x "$BUILD/ember" ]; then
      run_one "$(basename "$t")" sh -c "echo '$BUILD/ember is missing'; exit 1"
    else
      run_one "$(basename "$t")" "$BUILD/ember" "$t"
    fi
  done
fi

if [ -n "$problems" ]; then
  echo "== problems:$problems"
fi
echo "$passed passed, $failed failed"
[ "$failed" = 0 ]
