#!/usr/bin/env bash
# The Gloo backend across hosts on one machine: 2 "hosts" made of Linux network namespaces
# joined by a bridge (as run_netns.sh does for MPI), each rank started in its host's namespace
# with its own hostname and MASTER_ADDR=10.79.0.1 (host 1), RANK, WORLD_SIZE: no mpirun.
# Needs root (ip netns, unshare).
#
#   tests/multihost/gloo_netns.sh [STEP ...]      # default: hello bfrun api
#
# Steps: hello (each rank alone on its host: local_size 1, cross_size 2, the allreduce crosses
# the hosts), bfrun (the same under bfrun --gloo -H with a remote-shell agent), api
# (test_collectives, test_process_sets, test_horovod_api through tests/mpi_pytest.sh on both
# hosts); digits, only when named (about 2 minutes): examples/tape_digits.py trained under
# bfrun --gloo with both ranks on host 1, then with one rank on each host: the same test
# accuracy, and identical weights on the ranks.
# Exit status: 0 passed, 1 failed, 77 skipped. Namespaces and their processes are removed on
# exit.
set -uo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$repo"
py=${PYTHON:-$repo/.venv/bin/python}
prefix=${BF_NETNS_PREFIX:-bfgl}
net=10.79.0
nhosts=2
api_tests="tests/python/mpi/test_collectives.py tests/python/mpi/test_process_sets.py tests/python/mpi/test_horovod_api.py"

log() { echo "[gloo_netns] $*" >&2; }
skip() { log "SKIP: $*"; exit 77; }
[ "$(id -u)" = 0 ] || skip "needs root (network namespaces)"
command -v ip >/dev/null || skip "the ip command (iproute2) is not installed"
command -v unshare >/dev/null || skip "unshare (util-linux) is not installed"
ip netns list >/dev/null 2>&1 || skip "ip netns is not usable here"
work=$(mktemp -d /tmp/bluefog-gloo-netns.XXXXXX)
source "$repo/tests/multihost/netns_hosts.sh"

cleanup() {
  netns_cleanup
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# Runs "$@" as rank i-1 on host i for every host; each rank's output in $work/<name>.<rank>.
# Returns the worst exit status.
run_ranks() {
  local name=$1 limit=$2; shift 2
  local pids=() i rc worst=0
  for i in $(seq 1 $nhosts); do
    ip netns exec "$(host_ns "$i")" unshare --uts env MASTER_ADDR=$net.1 MASTER_PORT=29511 \
      RANK=$((i - 1)) WORLD_SIZE=$nhosts BLUEFOG_GLOO_TIMEOUT=60 TF_CPP_MIN_LOG_LEVEL=3 \
      PYTHONPATH="$repo" /bin/sh -c 'hostname "$0"; exec "$@"' \
      "$(host_ns "$i")" timeout -k 10 "$limit" "$@" >"$work/$name.$((i - 1))" 2>&1 &
    pids+=($!)
  done
  for i in "${!pids[@]}"; do
    wait "${pids[$i]}"; rc=$?
    [ $rc -ne 0 ] && { log "$name: rank $i exited $rc:"; tail -n 30 "$work/$name.$i" >&2; }
    [ $rc -gt $worst ] && worst=$rc
  done
  return $worst
}

step_hello() {
  cat >"$work/hello.py" <<'PY'
import socket, tensorflow as tf
import bluefog.tensorflow as bf
bf.init()
n = int(bf.allreduce(tf.constant(1), average=False).numpy())
print(f"HELLO rank {bf.rank()}/{bf.size()} {bf.backend()} on {socket.gethostname()} "
      f"local_size {bf.local_size()} cross {bf.cross_rank()}/{bf.cross_size()} sum {n}")
PY
  run_ranks hello 300 "$py" "$work/hello.py" || { log "hello: FAILED"; return 1; }
  local i
  for i in $(seq 0 $((nhosts - 1))); do
    grep -qE "HELLO rank $i/$nhosts gloo on $(host_ns $((i + 1))) local_size 1 cross $i/$nhosts sum $nhosts" \
      "$work/hello.$i" || { log "hello: FAILED on rank $i:"; cat "$work/hello.$i" >&2; return 1; }
  done
  log "hello: passed"
}

# bfrun --gloo from outside the hosts, reaching each through a remote-shell agent (as ssh
# would): -H by address, so MASTER_ADDR is host 1's address and bfrun picks the port and token.
make_agent() {
  cat >"$work/agent.sh" <<SH
#!/bin/sh
# agent.sh HOST COMMAND: run COMMAND on the host whose address is HOST.
ns="$prefix-h\${1##*.}"
shift
exec ip netns exec "\$ns" unshare --uts /bin/sh -c 'hostname "\$0"; exec sh -c "\$1"' "\$ns" "\$*"
SH
  chmod +x "$work/agent.sh"
}

step_bfrun() {
  make_agent
  PYTHONPATH="$repo" BLUEFOG_GLOO_TIMEOUT=60 TF_CPP_MIN_LOG_LEVEL=3 timeout -k 10 300 \
    "$py" -m bluefog.run --gloo -np 2 -H $net.1:1,$net.2:1 --rsh-agent "$work/agent.sh" \
    "$py" "$work/hello.py" >"$work/bfrun.out" 2>&1 || {
    log "bfrun: FAILED:"; tail -n 30 "$work/bfrun.out" >&2; return 1; }
  local i
  for i in $(seq 0 $((nhosts - 1))); do
    grep -qE "^\[$i\]<stdout>:HELLO rank $i/$nhosts gloo on $(host_ns $((i + 1))) local_size 1 cross $i/$nhosts sum $nhosts" \
      "$work/bfrun.out" || { log "bfrun: FAILED on rank $i:"; cat "$work/bfrun.out" >&2; return 1; }
  done
  log "bfrun: passed"
}

step_digits() {
  make_agent
  local where out acc=()
  for where in "$net.1:2" "$net.1:1,$net.2:1"; do
    out="$work/digits.$where.out"
    PYTHONPATH="$repo" BLUEFOG_GLOO_TIMEOUT=60 TF_CPP_MIN_LOG_LEVEL=3 timeout -k 10 600 \
      "$py" -m bluefog.run --gloo -np 2 -H "$where" --rsh-agent "$work/agent.sh" \
      "$py" examples/tape_digits.py --epochs 3 >"$out" 2>&1 || {
      log "digits: FAILED on -H $where:"; tail -n 30 "$out" >&2; return 1; }
    grep -q "^\[0\] weights identical on all ranks" "$out" || {
      log "digits: FAILED on -H $where (weights differ):"; tail -n 30 "$out" >&2; return 1; }
    acc+=("$(grep -oE 'ranks=2 .*test accuracy=[0-9.]+' "$out" | grep -oE '[0-9.]+$')")
    log "digits: -H $where: test accuracy ${acc[-1]}"
  done
  [ -n "${acc[0]}" ] && [ "${acc[0]}" = "${acc[1]}" ] || {
    log "digits: FAILED: test accuracy ${acc[0]:-missing} on one host, ${acc[1]:-missing} across"
    return 1; }
  log "digits: passed (the same accuracy on one host and across hosts)"
}

step_api() {
  # shellcheck disable=SC2086
  run_ranks api 900 tests/mpi_pytest.sh "$py" -p no:cacheprovider $api_tests || {
    log "api: FAILED"; return 1; }
  log "api: $(grep -oE '[0-9]+ passed.*' "$work/api.0" | tail -n 1)"
}

netns_make || { log "setup failed"; exit 1; }
log "hosts up: $(host_ns 1)=$net.1 $(host_ns 2)=$net.2"
steps=("$@")
[ ${#steps[@]} -gt 0 ] || steps=(hello bfrun api)
status=0
for step in "${steps[@]}"; do
  case $step in
  hello | bfrun | api | digits) [ $status = 0 ] && { "step_$step" || status=1; } ;;
  *) log "unknown step '$step' (hello, bfrun, api, digits)"; exit 2 ;;
  esac
done
[ $status = 0 ] && log "all passed" || log "FAILED"
exit $status
