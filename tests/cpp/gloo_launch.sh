#!/usr/bin/env bash
# Starts N copies of a program as one Gloo job on this host, the way a scheduler without MPI
# would: MASTER_ADDR=127.0.0.1, a free MASTER_PORT (and a second free port in
# GLOO_TEST_SPARE_PORT for tests that need another rendezvous), RANK and WORLD_SIZE. Each
# rank's output goes to a log printed when that rank fails; exits with the worst status.
# GLOO_TEST_HOSTS=H: H pretend hosts, ranks in blocks, each rank in a UTS namespace of its own
# named after its host (unshare, root), so the ranks see H host names; exits 77 (skipped) where
# unshare cannot do that.
# Usage: gloo_launch.sh N program [args...]
set -u
n=$1; shift
if [ -n "${GLOO_TEST_HOSTS:-}" ] && ! unshare --uts /bin/true 2>/dev/null; then
  echo "gloo_launch.sh: GLOO_TEST_HOSTS needs unshare --uts (root); skipped"
  exit 77
fi
read -r port spare < <(python3 -c '
import socket
socks = [socket.socket() for _ in range(2)]
for s in socks:
    s.bind(("127.0.0.1", 0))
print(*(s.getsockname()[1] for s in socks))')
logs=$(mktemp -d /tmp/bluefog-gloo-launch.XXXXXX)
pids=()
for ((r = 0; r < n; r++)); do
  wrap=()
  if [ -n "${GLOO_TEST_HOSTS:-}" ]; then
    wrap=(unshare --uts /bin/sh -c 'hostname "$0" && exec "$@"' "pretend$((r * GLOO_TEST_HOSTS / n))")
  fi
  MASTER_ADDR=127.0.0.1 MASTER_PORT=$port GLOO_TEST_SPARE_PORT=$spare RANK=$r WORLD_SIZE=$n \
    "${wrap[@]}" "$@" >"$logs/rank$r" 2>&1 &
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
