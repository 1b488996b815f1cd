#!/bin/sh
# mpirun's remote-shell agent for the namespaces of hosts.sh: "rsh.sh 10.213.77.I CMD..." runs
# CMD inside namespace bfnvI (mpirun --mca plm_rsh_agent bench/netns/rsh.sh); the prefix is
# BF_NETNS_PREFIX when set (see hosts.sh).
# Each namespace gets a host name of its own (unshare --uts), as separate hosts have: launchers
# and libraries that group ranks by host name (Gloo's local ranks) then see two hosts.
# The namespaces share the file system, so each gets its own TMPDIR: Open MPI's daemons would
# otherwise race to create the same session directory.
host=$1
shift
ns="${BF_NETNS_PREFIX:-bfnv}${host##*.}"
TMPDIR="/tmp/$ns"
mkdir -p "$TMPDIR"
export TMPDIR
# Shared memory between the ranks of one pretend host: Open MPI names its segments after the
# host name and local rank; each pretend host keeps them in a directory of its own as well, as
# real hosts do (with one shared name, local rank 0 of two hosts mapped the same segment).
export OMPI_MCA_btl_vader_backing_directory="$TMPDIR"
exec ip netns exec "$ns" unshare --uts /bin/sh -c 'hostname "$0"; exec /bin/sh -c "$1"' "$ns" "$*"
