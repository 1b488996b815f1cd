#!/bin/sh
# mpirun's remote-shell agent for pretend hosts on this machine: "loopback_rsh.sh HOST CMD..."
# runs CMD here, with a TMPDIR per host (the daemons would otherwise share a session directory).
# With -H 127.0.0.2:2,127.0.0.3:2 Open MPI treats each address as a host of its own, so the
# ranks on different addresses talk over TCP and land in different MPI_COMM_TYPE_SHARED groups.
host=$1
shift
TMPDIR="${TMPDIR:-/tmp}/bluefog-loopback-$(id -u)/$host"
mkdir -p "$TMPDIR"
export TMPDIR
exec /bin/sh -c "$*"
