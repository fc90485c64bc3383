#!/bin/sh
# netns_agent.sh -- stands in for ssh when tests/dist/two_hosts.sh runs an MPI job
# across two network namespaces of this machine (mpirun --mca plm_rsh_agent).
#
# Open MPI's rsh launcher calls it as `AGENT [options] HOST COMMAND...`, where
# COMMAND is meant for the remote login shell (it sets PATH and friends with
# shell syntax, and quotes for that shell), so it is joined and given to sh -c,
# as ssh would. HOST is an IP address; EMBER_NETNS_HOSTS ("IP=NS IP=NS", set by
# two_hosts.sh and inherited through mpirun) says which namespace "is" that host.
while [ $# -gt 0 ]; do
  case $1 in -*) shift ;; *) break ;; esac
done
host=$1
shift
ns=""
for pair in $EMBER_NETNS_HOSTS; do
  [ "${pair%%=*}" = "$host" ] && ns=${pair#*=}
done
if [ -z "$ns" ]; then
  echo "netns_agent.sh: no namespace for host $host (EMBER_NETNS_HOSTS=$EMBER_NETNS_HOSTS)" >&2
  exit 255
fi
exec ip netns exec "$ns" sh -c "$*"
