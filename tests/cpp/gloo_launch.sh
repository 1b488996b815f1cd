#!/usr/bin/env bash
# Starts N copies of a program as one Gloo job on this host, the way a scheduler without MPI
# would: MASTER_ADDR=127.0.0.1, a free MASTER_PORT (and a second free port in
# GLOO_TEST_SPARE_PORT for tests that need another rendezvous), RANK and WORLD_SIZE. Each
# rank's output goes to a log printed when that rank fails; exits with the worst status.
# Usage: gloo_launch.sh N program [args...]
set -u
n=$1; shift
read -r port spare < <(python3 -c '
import socket
socks = [socket.socket() for _ in range(2)]
for s in socks:
    s.bind(("127.0.0.1", 0))
print(*(s.getsockname()[1] for s in socks))')
logs=$(mktemp -d /tmp/bluefog-gloo-launch.XXXXXX)
pids=()
for ((r = 0; r < n; r++)); do
  MASTER_ADDR=127.0.0.1 MASTER_PORT=$port GLOO_TEST_SPARE_PORT=$spare RANK=$r WORLD_SIZE=$n \
    "$@" >"$logs/rank$r" 2>&1 &
  pids+=($!)
done
worst=0
for ((r = 0; r < n; r++)); do
  wait "${pids[$r]}"
  rc=$?
  if [ "$r" = 0 ] || [ $rc -ne 0 ]; then
    [ $rc -ne 0 ] && echo "---- rank $r of $n failed (exit $rc); its output: ----"
    cat "$logs/rank$r"
  fi
  [ $rc -gt $worst ] && worst=$rc
done
rm -rf "$logs"
exit $worst
