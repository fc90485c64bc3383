#!/bin/sh
# two_hosts.sh -- an MPI job between two "hosts" over TCP: two network namespaces
# of this machine joined by a veth pair, mpirun in the first, Open MPI's daemon
# started in the second through netns_agent.sh (in place of ssh).
#
#   sh tests/dist/two_hosts.sh PROGRAM
#
# PROGRAM is build/tests/test_comm_mpi: in mode "hosts" each rank checks an
# allreduce and that the two ranks are in different namespaces, and prints
# "hosts-ok rank R". The last line says "two_hosts: OK", "two_hosts: skipped: WHY"
# (not root, or namespaces not allowed here: exit 0) or "two_hosts: FAIL: WHY"
# (exit 1). The namespaces and the veth pair are removed on every exit.
prog=$1
here=$(cd "$(dirname "$0")" && pwd)
skip() { echo "two_hosts: skipped: $*"; exit 0; }
fail() { echo "two_hosts: FAIL: $*"; exit 1; }

[ -x "$prog" ] || fail "usage: sh two_hosts.sh PROGRAM (got '$prog')"
[ "$(id -u)" = 0 ] || skip "network namespaces need root"
command -v ip > /dev/null 2>&1 || skip "no ip command (Debian: iproute2)"
command -v mpirun > /dev/null 2>&1 || skip "no mpirun (Debian: openmpi-bin)"

id=$$
ns1=ember$id-a
ns2=ember$id-b
net=10.77.$((id % 200 + 20))
tmp=$(mktemp -d "${TMPDIR:-/tmp}/ember-hosts.XXXXXX") || fail "mktemp"
# processes still in a namespace (this job's: nothing else runs there)
stragglers() { ip netns pids "$ns1" 2> /dev/null; ip netns pids "$ns2" 2> /dev/null; }
cleanup() {
  for p in $(stragglers); do kill -9 "$p" 2> /dev/null; done
  ip netns del "$ns1" 2> /dev/null
  ip netns del "$ns2" 2> /dev/null
  rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 1' INT TERM HUP

ip netns add "$ns1" 2> "$tmp/err" || skip "ip netns add failed: $(cat "$tmp/err")"
ip netns add "$ns2" 2> "$tmp/err" || skip "ip netns add failed: $(cat "$tmp/err")"
# the veth ends are made inside the namespaces, so their names clash with nothing
ip -n "$ns1" link add eth0 type veth peer name eth0 netns "$ns2" 2> "$tmp/err" ||
  skip "no veth pair: $(cat "$tmp/err")"
for i in 1 2; do
  ns=$(eval echo \$ns$i)
  ip -n "$ns" link set lo up &&
    ip -n "$ns" addr add "$net.$i/24" dev eth0 &&
    ip -n "$ns" link set eth0 up || fail "could not set up namespace $ns"
done

unset OMPI_MCA_btl OMPI_MCA_btl_tcp_if_include OMPI_MCA_oob_tcp_if_include EMBER_MPI_TEST_DIR
EMBER_NETNS_HOSTS="$net.1=$ns1 $net.2=$ns2"
export EMBER_NETNS_HOSTS
ip netns exec "$ns1" timeout -k 5 60 mpirun --allow-run-as-root \
  --host "$net.1,$net.2" -np 2 \
  --mca plm_rsh_agent "sh $here/netns_agent.sh" \
  --mca btl tcp,self --mca btl_tcp_if_include "$net.0/24" \
  --mca oob_tcp_if_include "$net.0/24" --mca hwloc_base_binding_policy none \
  -x EMBER_MPI_TEST_MODE=hosts -x OMPI_ALLOW_RUN_AS_ROOT=1 \
  -x OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
  "$prog" > "$tmp/out" 2>&1
rc=$?
cat "$tmp/out"
n=$(grep -c '^hosts-ok rank' "$tmp/out")
left=""
for i in 1 2 3 4 5 6 7 8 9 10; do
  left=$(stragglers)
  [ -z "$left" ] && break
  sleep 0.3
done
[ "$rc" = 0 ] || fail "mpirun exited with status $rc"
[ -z "$left" ] || fail "processes left running after the job: $(echo $left)"
[ "$n" = 2 ] || fail "$n of 2 ranks reported success"
echo "two_hosts: OK (2 ranks in namespaces $ns1 and $ns2, TCP over $net.0/24)"
