#!/usr/bin/env bash
# run.sh -- fault tests (`make test-faults`): a replica killed, stopped or cut
# off mid-training, a disk that fills up during a checkpoint.
#
#   bash tests/faults/run.sh [--only REGEX] BUILD_DIR
#
# Each case starts the processes it hurts with a hard deadline (timeout -k), so a
# case that fails can never hang: a deadline reached is a failure, reported by
# name. A case passes when every process it started has ended, each message
# names the cause (the dead, stopped or unreachable replica; the full disk), and
# the checkpoint written before the fault loads whole. The replicas are MPI
# processes (mpirun on this host; `ember --replicas` threads cannot be killed one
# by one). The cases:
#   kill-N-R        mpirun -np N; replica R gets SIGKILL mid-step. mpirun ends
#                   the job, naming rank R; replica 0 saves a checkpoint every
#                   step, so when R = 0 the kill may tear a save.
#   kill-N-R-ft     the same with Open MPI's orte_enable_recovery (the launcher
#                   keeps the job): each survivor's communicator times out naming
#                   replica R. (mpirun's own status is 0 in this mode.)
#   stop-N-R        replica R gets SIGSTOP: the others end at the communicator's
#                   timeout, naming R; mpirun then ends the job, R included.
#   stop-N-R-cont   the same with orte_abort_on_non_zero_status off: once the
#                   others have ended, R gets SIGCONT and ends by itself, with
#                   the others' message. (mpirun's status is 0 in this mode.)
#   netns-cut       two hosts (network namespaces joined by a veth pair, as
#                   tests/dist/two_hosts.sh); the link goes down mid-allreduce:
#                   each side names the other. Needs root and `ip netns`.
#   disk-full       tests/faults/disk_full.lua on a 4 MiB tmpfs. Needs root.
# Cases that cannot run here are skipped with the reason. The last line is
# `N passed, N failed`; the exit status is non-zero when anything failed.
only=""
if [ "$1" = "--only" ]; then only=$2; shift 2; fi
BUILD=$(cd "${1:-build}" && pwd) || exit 2
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
EMBER=$BUILD/ember
T=5                       # the communicator's timeout in the replicas, seconds
TMP=$(mktemp -d "${TMPDIR:-/tmp}/ember-faults.XXXXXX") || exit 2
EMBER_TESTS=$ROOT/tests
export EMBER_TESTS
OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_ALLOW_RUN_AS_ROOT OMPI_ALLOW_RUN_AS_ROOT_CONFIRM

passed=0 failed=0 skipped=0 problems=""
cleanups=""
cleanup() {
  for c in $cleanups; do eval "$c"; done
  rm -rf "$TMP"
}
trap cleanup EXIT
trap 'exit 1' INT TERM HUP

pass() { passed=$((passed + 1)); echo "ok   $case: $*"; }
fail() {
  failed=$((failed + 1)); echo "FAIL $case: $*"
  problems="$problems
  $case: $*"
}
skip() { skipped=$((skipped + 1)); echo "skip $case: $*"; }
# check COND MESSAGE: one check of the current case
check() { if eval "$1"; then pass "$2"; else fail "$2"; fi; }
wanted() { [ -z "$only" ] || echo "$1" | grep -Eq "$only"; }
now() { date +%s.%N | cut -c1-14; }
secs() { awk "BEGIN { printf \"%.1f\", $2 - $1 }"; }
# count FILE REGEX: lines of FILE matching REGEX
count() { grep -Ec "$2" "$1" 2> /dev/null || true; }
show() { sed 's/^/    | /' "$1" | tail -n 40; }

# said OUT RANK MSG: replica RANK's error message in mpirun's output OUT has MSG
# (ember prefixes the lines of every replica but 0 with "[rank R] ").
said() {
  if [ "$2" = 0 ]; then grep -q "^ember: .*$3" "$1"
  else grep -q "^\[rank $2\] ember: .*$3" "$1"; fi
}
# others_name OUT MSG: one check per replica but $victim, that it ended with MSG
others_name() {
  r=0 on_out=$1 on_msg=$2
  while [ $r -lt "$np" ]; do
    [ $r = "$victim" ] || check 'said "$on_out" $r "$on_msg"' "replica $r ends with '$2'"
    r=$((r + 1))
  done
}

# wait_ready DIR N JOB: waits (up to 60 s) until N replicas wrote DIR/ready.R, or
# the job JOB (a pid) ended; true when all are ready.
wait_ready() {
  i=0
  while [ $i -lt 600 ]; do
    n=$(ls "$1" 2> /dev/null | grep -c '^ready\.[0-9]*$')
    [ "$n" -ge "$2" ] && return 0
    kill -0 "$3" 2> /dev/null || return 1
    sleep 0.1; i=$((i + 1))
  done
  return 1
}

# alive PIDS: the ones still running (zombies count as ended)
alive() {
  for p in $*; do
    s=$(ps -o stat= -p "$p" 2> /dev/null)
    [ -n "$s" ] && [ "${s#Z}" = "$s" ] && echo "$p"
  done
}

# mpi_start DIR NP [MPIRUN OPTIONS]: mpirun of train.lua in the background, its
# output in DIR/out; sets job (mpirun's pid). Deadline: 60 s beyond the timeout.
mpi_start() {
  d=$1 np=$2; shift 2
  mkdir -p "$d"
  timeout -v -k 5 $((T + 60)) mpirun --oversubscribe --bind-to none \
    --mca btl self,vader,tcp --mca btl_tcp_if_include lo --mca oob_tcp_if_include lo \
    "$@" -np "$np" "$EMBER" "$HERE/train.lua" "$d" "$T" > "$d/out" 2>&1 &
  job=$!
}

# mpi_end: waits for the job; sets rc and took (seconds from the fault to the end).
# A deadline reached shows in DIR/out: timeout -v says so there.
mpi_end() {
  wait "$job"; rc=$?
  took=$(secs "$t_fault" "$(now)")
}

# ready_pids DIR NP: the replicas' pids, in rank order
ready_pids() {
  r=0 pids=""
  while [ $r -lt "$2" ]; do pids="$pids $(cat "$1/ready.$r")"; r=$((r + 1)); done
  echo $pids
}

# The checks every MPI fault case ends with: the deadline was not reached, no
# replica is left, and the checkpoint replica 0 saved before the fault loads whole.
common_checks() {
  check '! grep -q "^timeout: sending signal" "$d/out"' \
    "mpirun ended ${took}s after the fault, before its deadline (status $rc)"
  left=$(alive $pids)
  check '[ -z "$left" ]' "no replica left running${left:+ (left: $left)}"
  [ -z "$left" ] || kill -9 $left 2> /dev/null
  ck=$(timeout -k 5 60 "$EMBER" "$HERE/check_ckpt.lua" "$d/ckpt" 2>&1 | tail -n 1)
  check 'echo "$ck" | grep -q "^ckpt-ok"' "the checkpoint saved before the fault loads whole: $ck"
}

have_mpi() {
  command -v mpirun > /dev/null 2>&1 || { skip "no mpirun (Debian: openmpi-bin)"; return 1; }
}

# begin_case CASE NP VICTIM [MPIRUN OPTIONS]: starts the job and waits until every
# replica trains; sets d, job, pids and vpid (the victim's pid). False when the
# case is over already: not wanted, cannot run here, or did not start.
begin_case() {
  case=$1 np=$2 victim=$3; shift 3
  wanted "$case" || return 1
  echo "== $case"
  have_mpi || return 1
  d=$TMP/$case
  mpi_start "$d" "$np" "$@"
  if ! wait_ready "$d" "$np" "$job"; then
    kill "$job" 2> /dev/null; wait "$job"
    fail "the replicas did not start training"; show "$d/out"; return 1
  fi
  pids=$(ready_pids "$d" "$np")
  vpid=$(cat "$d/ready.$victim")
  sleep 0.3
}

# -- SIGKILL ------------------------------------------------------------------------------
# kill_case NP VICTIM [ft]
kill_case() {
  ft=$3
  if [ -n "$ft" ]; then begin_case "kill-$1-$2-ft" "$1" "$2" --mca orte_enable_recovery 1
  else begin_case "kill-$1-$2" "$1" "$2"; fi || return 0
  kill -9 "$vpid"; t_fault=$(now)
  mpi_end
  if [ -n "$ft" ]; then
    others_name "$d/out" "timed out after $T s: replica $victim did not arrive"
  else
    check 'grep -q "process rank $victim with PID .* exited on signal 9" "$d/out"' \
      "mpirun names rank $victim, killed"
    check '[ "$rc" != 0 ]' "the job's status is non-zero ($rc)"
  fi
  common_checks
  [ "$failed" = "$failed0" ] || show "$d/out"
}

# -- SIGSTOP ------------------------------------------------------------------------------
# stop_case NP VICTIM [cont]
stop_case() {
  cont=$3
  if [ -n "$cont" ]; then
    begin_case "stop-$1-$2-cont" "$1" "$2" --mca orte_abort_on_non_zero_status 0
  else begin_case "stop-$1-$2" "$1" "$2"; fi || return 0
  kill -STOP "$vpid"; t_fault=$(now)
  msg="timed out after $T s: replica $victim did not arrive"
  if [ -n "$cont" ]; then
    # the survivors end; then the stopped one goes on, and must end by itself
    i=0
    while [ $i -lt $(((T + 30) * 10)) ] && [ "$(count "$d/out" "$msg")" -lt $((np - 1)) ]; do
      sleep 0.1; i=$((i + 1))
    done
    sleep 1
    kill -CONT "$vpid"
  fi
  mpi_end
  kill -CONT "$vpid" 2> /dev/null    # a stopped process left behind would never end
  others_name "$d/out" "$msg"
  if [ -n "$cont" ]; then
    check 'said "$d/out" "$victim" "$msg"' \
      "once continued, replica $victim ends by itself with the others' message"
  else
    check '[ "$rc" != 0 ]' "the job's status is non-zero ($rc)"
  fi
  common_checks
  [ "$failed" = "$failed0" ] || show "$d/out"
}

# -- A cut link between two hosts ---------------------------------------------------------
netns_case() {
  case=netns-cut
  wanted "$case" || return 0
  echo "== $case"
  have_mpi || return 0
  [ "$(id -u)" = 0 ] || { skip "network namespaces need root"; return 0; }
  command -v ip > /dev/null 2>&1 || { skip "no ip command (Debian: iproute2)"; return 0; }
  d=$TMP/$case
  mkdir -p "$d"
  ns1=emberf$$-a ns2=emberf$$-b net=10.78.$(($$ % 200 + 20))
  cleanups="$cleanups netns_cleanup"
  ip netns add "$ns1" 2> "$d/err" || { skip "ip netns add failed: $(cat "$d/err")"; return 0; }
  ip netns add "$ns2" 2> "$d/err" || { skip "ip netns add failed: $(cat "$d/err")"; return 0; }
  ip -n "$ns1" link add eth0 type veth peer name eth0 netns "$ns2" 2> "$d/err" ||
    { skip "no veth pair: $(cat "$d/err")"; return 0; }
  for ns in "$ns1" "$ns2"; do
    i=1; [ "$ns" = "$ns2" ] && i=2
    # Linux retransmits on a dead TCP connection for about 15 minutes; Open MPI's
    # launcher and daemon wait that long to hear of the cut. Cluster settings
    # shorten it; so do these "hosts" (5 retries: about 13 s). The replicas'
    # own timeout does not depend on it.
    ip -n "$ns" link set lo up && ip -n "$ns" addr add "$net.$i/24" dev eth0 &&
      ip -n "$ns" link set eth0 up &&
      ip netns exec "$ns" sysctl -qw net.ipv4.tcp_retries2=5 ||
      { fail "could not set up namespace $ns"; return; }
  done
  # Each replica's output goes to a file: rank 1's would travel to mpirun over
  # the link that is cut.
  EMBER_NETNS_HOSTS="$net.1=$ns1 $net.2=$ns2" \
  ip netns exec "$ns1" timeout -v -k 5 $((T + 90)) mpirun --allow-run-as-root \
    --host "$net.1,$net.2" -np 2 \
    --mca plm_rsh_agent "sh $ROOT/tests/dist/netns_agent.sh" \
    --mca btl tcp,self --mca btl_tcp_if_include "$net.0/24" \
    --mca oob_tcp_if_include "$net.0/24" --mca hwloc_base_binding_policy none \
    -x EMBER_NETNS_HOSTS -x OMPI_ALLOW_RUN_AS_ROOT -x OMPI_ALLOW_RUN_AS_ROOT_CONFIRM \
    sh -c "exec '$EMBER' '$HERE/train.lua' '$d' $T > '$d/out.'\$OMPI_COMM_WORLD_RANK 2>&1" \
    > "$d/out" 2>&1 &
  job=$!
  if ! wait_ready "$d" 2 "$job"; then
    kill "$job" 2> /dev/null; wait "$job"
    fail "the replicas did not start training"; show "$d/out"; show "$d/out.0"; return
  fi
  pids=$(ready_pids "$d" 2)
  sleep 0.3
  ip -n "$ns1" link set eth0 down; t_fault=$(now)
  mpi_end
  check 'grep -q "timed out after $T s: replica 1 did not arrive" "$d/out.0"' \
    "host 1's replica names replica 1"
  check 'grep -q "timed out after $T s: replica 0 did not arrive" "$d/out.1"' \
    "host 2's replica names replica 0"
  check '[ "$rc" != 0 ]' "the job's status is non-zero ($rc)"
  i=0 left="x"
  while [ $i -lt 300 ]; do                 # Open MPI's daemon ends after mpirun
    left=$(ip netns pids "$ns1"; ip netns pids "$ns2")
    [ -z "$left" ] && break
    sleep 0.1; i=$((i + 1))
  done
  check '[ -z "$left" ]' "nothing left running in the namespaces${left:+ (left: $(echo $left))}"
  common_checks
  [ "$failed" = "$failed0" ] || { show "$d/out"; show "$d/out.0"; show "$d/out.1"; }
}
netns_cleanup() {
  for p in $(ip netns pids "$ns1" 2> /dev/null) $(ip netns pids "$ns2" 2> /dev/null); do
    kill -9 "$p" 2> /dev/null
  done
  ip netns del "$ns1" 2> /dev/null
  ip netns del "$ns2" 2> /dev/null
}

# -- A full disk --------------------------------------------------------------------------
disk_case() {
  case=disk-full
  wanted "$case" || return 0
  echo "== $case"
  [ "$(id -u)" = 0 ] || { skip "mounting a tmpfs needs root"; return 0; }
  d=$TMP/$case
  mkdir -p "$d"
  mount -t tmpfs -o size=4m ember-faults "$d" 2> "$TMP/err" ||
    { skip "could not mount a tmpfs: $(cat "$TMP/err")"; return 0; }
  cleanups="$cleanups disk_cleanup"
  # a plain checkpoint from one process, then a sharded one from two replicas
  for variant in plain sharded; do
    rm -rf "${d:?}"/*
    if [ $variant = plain ]; then
      timeout -k 5 120 "$EMBER" "$HERE/disk_full.lua" "$d" > "$TMP/disk.out" 2>&1; rc=$?
    else
      timeout -k 5 120 "$EMBER" --replicas 2 "$HERE/disk_full.lua" "$d" sharded \
        > "$TMP/disk.out" 2>&1; rc=$?
    fi
    cat "$TMP/disk.out"
    c=$(grep -E '^#counts [0-9]+ [0-9]+' "$TMP/disk.out" | tail -n 1)
    if [ -z "$c" ] || [ "$rc" -gt 1 ]; then
      fail "disk_full.lua ($variant) exited with status $rc${c:+ after its checks}"
    else
      passed=$((passed + $(echo "$c" | awk '{print $2}')))
      f=$(echo "$c" | awk '{print $3}')
      failed=$((failed + f))
      [ "$f" = 0 ] || problems="$problems
  $case ($variant): $f failed"
    fi
  done
  umount "$d"
}
disk_cleanup() { umount "$TMP/disk-full" 2> /dev/null; }

# -- The cases ------------------------------------------------------------------------------
[ -x "$EMBER" ] || { echo "FAIL $EMBER is missing (make all)"; echo "0 passed, 1 failed"; exit 1; }
# Two cases at a time (EMBER_FAULT_JOBS): a case spends most of its time waiting
# for a communicator's timeout or for mpirun to notice, so a second one fills that
# time. Each runs in a subshell with its own counts and cleanups, its output in a
# file printed whole when it ends; the counts are added up after the last one.
# The longest (the cut link, which waits out TCP's retries) starts first.
jobs=${EMBER_FAULT_JOBS:-2} i=0
for c in "netns_case" "kill_case 2 1" "kill_case 3 0" "kill_case 2 1 ft" "kill_case 3 2 ft" \
         "stop_case 2 1" "stop_case 3 1 cont" "disk_case"; do
  i=$((i + 1))
  while [ "$(jobs -rp | wc -l)" -ge "$jobs" ]; do wait -n; done
  (
    passed=0 failed=0 skipped=0 problems="" cleanups="" failed0=0
    trap 'for x in $cleanups; do eval "$x"; done' EXIT
    out=$TMP/case.$i    # (the case functions have an i of their own)
    $c > "$out.out" 2>&1
    echo "$passed $failed $skipped" > "$out.counts"
    printf '%s' "$problems" > "$out.problems"
    { flock 9; cat "$out.out"; } 9> "$TMP/print.lock"
  ) < /dev/null &
done
wait
n=$i i=0
while [ $i -lt "$n" ]; do
  i=$((i + 1))
  if [ -f "$TMP/case.$i.counts" ]; then
    read -r p f s < "$TMP/case.$i.counts"
    passed=$((passed + p)) failed=$((failed + f)) skipped=$((skipped + s))
    problems="$problems$(cat "$TMP/case.$i.problems")"
  else
    failed=$((failed + 1)) problems="$problems
  case $i: ended without its counts"
  fi
done

[ -z "$problems" ] || echo "== problems:$problems"
[ "$skipped" = 0 ] || echo "($skipped skipped)"
echo "$passed passed, $failed failed"
[ "$failed" = 0 ]
