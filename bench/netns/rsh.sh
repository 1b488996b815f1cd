#!/bin/sh
# mpirun's remote-shell agent for the namespaces of hosts.sh: "rsh.sh 10.213.77.I CMD..." runs
# CMD inside namespace bfnvI (mpirun --mca plm_rsh_agent bench/netns/rsh.sh).
# The namespaces share the file system and the host name, so each gets its own TMPDIR: Open MPI's
# daemons would otherwise race to create the same session directory.
host=$1
shift
ns="bfnv${host##*.}"
TMPDIR="/tmp/$ns"
mkdir -p "$TMPDIR"
export TMPDIR
exec ip netns exec "$ns" /bin/sh -c "$*"
