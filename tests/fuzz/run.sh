#!/bin/sh
# run.sh -- runs the libFuzzer harnesses of tests/fuzz/, FUZZ_JOBS at a time, for
# SECONDS each (`make fuzz` calls it after building them):
#
#   sh tests/fuzz/run.sh BUILD SECONDS NAME...
#
# Each harness grows its own corpus, BUILD/fuzz/corpus/NAME (kept between runs, so
# a later run starts where an earlier one stopped), seeded from BUILD/fuzz/seeds/NAME.
# One line per harness: executions, executions per second, corpus size. A finding
# (crash, leak, UB, timeout, out-of-memory) prints the sanitizer's summary and where
# the input was saved (BUILD/fuzz/findings/). The last lines count clean harnesses
# and findings (also as `N passed, N failed`); the exit status is 1 when there is
# any finding.
B=$1 S=$2
shift 2
[ -n "$B" ] && [ -n "$S" ] && [ $# -gt 0 ] || { echo "usage: run.sh BUILD SECONDS NAME..." >&2; exit 2; }
mkdir -p "$B/fuzz/corpus" "$B/fuzz/findings" "$B/fuzz/logs"

# Requests over 256 MB are refused, not reported: a file may claim any size and the
# parser must turn the refusal into an error. ember's own allocations meet the same
# limit in the harness's allocator (tests/fuzz/fuzz.h); ASan applies it to direct
# malloc calls (the CSV and image readers, libjpeg, libpng, zlib). What still grows
# past libFuzzer's RSS limit is a finding.
export ASAN_OPTIONS="allocator_may_return_null=1:max_allocation_size_mb=256:detect_leaks=1"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"

# fuzz_one NAME: runs one harness and prints its line (and a finding's summary)
# whole, under a lock, so that harnesses running side by side do not mix lines.
fuzz_one() {
  name=$1
  case $name in
    cifar) max_len=9300 ;;       # up to three 3073-byte records and the file-count byte
    jpeg|png) max_len=8192 ;;
    *) max_len=4096 ;;
  esac
  dict=
  case $name in json|safetensors) dict=-dict=tests/fuzz/json.dict ;; esac
  log=$B/fuzz/logs/$name.log
  mkdir -p "$B/fuzz/corpus/$name"
  t0=$(date +%s)
  "$B/fuzz/fuzz_$name" "$B/fuzz/corpus/$name" "$B/fuzz/seeds/$name" $dict \
    -max_total_time="$S" -max_len=$max_len -timeout=10 -rss_limit_mb=2048 \
    -artifact_prefix="$B/fuzz/findings/$name-" -print_final_stats=1 >"$log" 2>&1
  rc=$?
  secs=$(( $(date +%s) - t0 ))
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n 1)
  rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -n 1)
  units=$(ls "$B/fuzz/corpus/$name" | wc -l)
  line="fuzz_$name: ${execs:-?} executions in ${secs} s (${rate:-?}/s), corpus $units"
  echo "$rc" > "$B/fuzz/logs/$name.rc"
  {
    flock 9
    if [ "$rc" = 0 ]; then
      echo "$line: clean"
    else
      echo "$line: FINDING (exit $rc; log $log)"
      grep -E 'ERROR: |SUMMARY: |runtime error|ember fuzz check failed|Test unit written|^artifact_prefix' \
        "$log" | head -n 8 | sed 's/^/    /'
    fi
  } 9>"$B/fuzz/logs/.lock"
}

# FUZZ_JOBS harnesses at a time (default: the number of cores): each is one
# process on one core, and each still gets its SECONDS.
jobs=${FUZZ_JOBS:-$(nproc 2>/dev/null || echo 1)}
running=0
for name in "$@"; do
  rm -f "$B/fuzz/logs/$name.rc"
  fuzz_one "$name" &
  running=$((running + 1))
  if [ "$running" -ge "$jobs" ]; then wait; running=0; fi
done
wait

clean=0 found=0
for name in "$@"; do
  if [ "$(cat "$B/fuzz/logs/$name.rc" 2>/dev/null)" = 0 ]; then clean=$((clean + 1))
  else found=$((found + 1)); fi
done
echo "fuzz: $clean clean, $found with findings"
echo "$clean passed, $found failed"
[ "$found" = 0 ]
