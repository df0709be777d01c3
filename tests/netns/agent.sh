#!/bin/sh
# tests/netns/agent.sh HOST COMMAND...: Open MPI's remote-shell agent for the namespace test
# (--mca plm_rsh_agent, or OMPI_MCA_plm_rsh_agent): where mpirun would `ssh HOST COMMAND`, it
# runs COMMAND in HOST's network namespace with HOST as its hostname, as on a separate machine.
# SHARD_NETNS_MAP names a file of "HOST NAMESPACE" lines. COMMAND is one shell string, as ssh
# would hand it to the remote shell.
map=${SHARD_NETNS_MAP:?SHARD_NETNS_MAP is not set (tests/netns/run.sh sets it)}
while [ $# -gt 0 ]; do case $1 in -*) shift ;; *) break ;; esac; done   # ssh-style options
host=$1; shift
ns=$(awk -v h="$host" '$1 == h { print $2 }' "$map")
if [ -z "$ns" ]; then echo "agent.sh: no namespace for host '$host' in $map" >&2; exit 255; fi
exec ip netns exec "$ns" unshare --uts -- sh -c 'hostname "$0" && eval "$1"' "$host" "$*"
