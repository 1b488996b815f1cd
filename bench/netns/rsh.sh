#!/bin/sh
# mpirun's remote-shell agent for the namespaces of hosts.sh: "rsh.sh 10.213.77.I CMD..." runs
# CMD inside namespace bfnvI (mpirun --mca plm_rsh_agent bench/netns/rsh.sh); the prefix is
# BF_NETNS_PREFIX when set (see hosts.sh).
# The namespaces share the file system and the host name, so each gets its own TMPDIR: Open MPI's
# daemons would otherwise race to create the same session directory.
host=$1
shift
ns="${BF_NETNS_PREFIX:-bfnv}${host##*.}"
TMPDIR="/tmp/$ns"
mkdir -p "$TMPDIR"
export TMPDIR
# Shared memory between the ranks of one pretend host: Open MPI names its segments after the
# host name and local rank, which every namespace shares, so each host keeps them in its own
# directory (otherwise local rank 0 of two hosts map the same segment and crash).
export OMPI_MCA_btl_vader_backing_directory="$TMPDIR"
exec ip netns exec "$ns" /bin/sh -c "$*"
