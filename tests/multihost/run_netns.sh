#!/usr/bin/env bash
# Multi-host test on one machine: 3 "hosts" made of Linux network namespaces, joined by a bridge,
# talking TCP only. Needs root (ip netns, unshare).
#
#   tests/multihost/run_netns.sh            # setup, hello, api, cut, teardown
#   tests/multihost/run_netns.sh api        # only the API tests across the hosts
#   tests/multihost/run_netns.sh cut        # only the link-cut test
#
# Topology (nothing is added to the machine's own network namespace):
#
#   namespace bfmh-sw: bridge br0 with ports h1p h2p h3p
#   namespace bfmh-hN: eth0 = 10.77.0.N/24 (veth peer of hNp), lo; own hostname bfmh-hN (UTS
#                      namespace per process tree, through unshare --uts)
#
# The launcher (bfrun -H when bluefog/run/bfrun.py exists, else mpirun -H) runs inside bfmh-h1.
# Open MPI starts its daemons on the other hosts through --mca plm_rsh_agent, a generated script
# that maps a host IP to its namespace and runs the daemon there with `ip netns exec`. All
# traffic goes over TCP inside 10.77.0.0/24: --mca btl self,tcp and btl/oob_tcp_if_include.
#
# Steps:
#   hello  a one-line bluefog job: each rank must be alone on its host (local_size 1) and the
#        allreduce must cross the hosts.
#   api  runs the seed API tests (tests/python/mpi/test_collectives.py, test_gradients.py,
#        test_graph_concurrency.py) and the reductions and compression tests (test_reduce_ops.py,
#        test_compression.py: bluefog's own MPI op over TCP), Horovod's collectives (alltoall,
#        reducescatter: test_horovod_collectives.py), process sets (test_process_sets.py) and
#        windows (test_windows.py, test_win_mutex.py, test_win_pushsum.py: puts served across
#        hosts over TCP) and
#        Horovod's host layout (test_horovod_api.py: cross_rank, cross_size);
#        BF_MULTIHOST_TESTS=paths for others. One rank per host, through tests/mpi_pytest.sh.
#   cut  runs a loop of allreduces on the 3 hosts, then takes host 3's link down (its bridge
#        port) mid-run, and checks that the job ends with a non-zero status, naming the lost
#        host, within BF_CUT_BOUND seconds (default 120) instead of hanging.
#        Open MPI notices a silent peer through TCP keepalive on its out-of-band connections; its
#        defaults (300 s idle + 9 x 20 s probes) would take 8 minutes, so this script sets
#        oob_tcp_keepalive_time=5, _intvl=2, _probes=3 (about 11 s). Use the same on real
#        clusters where a faster failure matters.
#
# Exit status: 0 passed, 1 failed, 77 skipped (not root, or no ip netns / unshare / mpirun).
# Namespaces, and every process left in them, are removed on exit, also after a failure.
set -uo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$repo"
py=${PYTHON:-$repo/.venv/bin/python}
prefix=${BF_NETNS_PREFIX:-bfmh}
net=10.77.0
nhosts=3
api_tests=${BF_MULTIHOST_TESTS:-tests/python/mpi/test_collectives.py tests/python/mpi/test_gradients.py tests/python/mpi/test_graph_concurrency.py tests/python/mpi/test_reduce_ops.py tests/python/mpi/test_compression.py tests/python/mpi/test_horovod_collectives.py tests/python/mpi/test_process_sets.py tests/python/mpi/test_windows.py tests/python/mpi/test_win_mutex.py tests/python/mpi/test_win_pushsum.py tests/python/mpi/test_horovod_api.py}
api_timeout=${BF_API_TIMEOUT:-900}
cut_bound=${BF_CUT_BOUND:-120}
steps=${*:-all}

log() { echo "[run_netns] $*" >&2; }
now_ms() { date +%s%3N; }
skip() { log "SKIP: $*"; exit 77; }

[ "$(id -u)" = 0 ] || skip "needs root (network namespaces); run as root or skip this test"
command -v ip >/dev/null || skip "the ip command (iproute2) is not installed"
command -v unshare >/dev/null || skip "unshare (util-linux) is not installed"
command -v mpirun >/dev/null || skip "mpirun (Open MPI) is not installed"
ip netns list >/dev/null 2>&1 || skip "ip netns is not usable here"
[ -x "$py" ] || { log "no python at $py (set PYTHON)"; exit 1; }
work=$(mktemp -d /tmp/bluefog-netns.XXXXXX)

source "$repo/tests/multihost/netns_hosts.sh"

cleanup() {
  netns_cleanup
  rm -rf "$work"
}

setup() {
  if netns_exist; then
    log "removing namespaces left by an earlier run"
    cleanup
    work=$(mktemp -d /tmp/bluefog-netns.XXXXXX)
  fi
  netns_make || return 1
  # The remote-shell agent Open MPI uses instead of ssh: HOST COMMAND... -> run COMMAND in the
  # namespace of HOST, with that host's own hostname.
  cat >"$work/agent.sh" <<EOF
#!/bin/sh
host=\$1; shift
case "\$host" in
$(for i in $(seq 1 $nhosts); do echo "  $(host_ip "$i")|$(host_ns "$i")) ns=$(host_ns "$i") ;;"; done)
  *) echo "netns agent: unknown host '\$host'" >&2; exit 255 ;;
esac
exec ip netns exec "\$ns" unshare --uts /bin/sh -c "hostname \$ns; \$*"
EOF
  chmod +x "$work/agent.sh"
  # Wait until the bridge forwards (ports leave the listening state; no STP: immediate).
  for i in $(seq 1 50); do
    if ip netns exec "$(host_ns 1)" "$py" - "$net.2" <<'EOF' 2>/dev/null
import socket, sys
s = socket.socket(); s.settimeout(0.2)
try:
    s.connect((sys.argv[1], 9))
except ConnectionRefusedError:
    sys.exit(0)   # an RST came back: host 2 is reachable
except OSError:
    sys.exit(1)
EOF
    then break; fi
    sleep 0.2
  done
  log "hosts up: $(for i in $(seq 1 $nhosts); do printf '%s=%s ' "$(host_ns "$i")" "$(host_ip "$i")"; done)"
}

hosts_arg() { for i in $(seq 1 $nhosts); do printf '%s:1,' "$(host_ip "$i")"; done | sed 's/,$//'; }

mca_args() {
  echo "--mca plm_rsh_agent $work/agent.sh --mca plm_rsh_no_tree_spawn 1" \
       "--mca pml ob1 --mca btl self,tcp" \
       "--mca btl_tcp_if_include $net.0/24 --mca oob_tcp_if_include $net.0/24" \
       "--mca oob_tcp_keepalive_time 5 --mca oob_tcp_keepalive_intvl 2" \
       "--mca oob_tcp_keepalive_probes 3"
}

# Runs "$@" (the rank command) on every host, launched from host 1. Output to stdout.
launch() {
  local launcher
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
  export TF_CPP_MIN_LOG_LEVEL=${TF_CPP_MIN_LOG_LEVEL:-3} PYTHONUNBUFFERED=1
  export PYTHONPATH=$repo${PYTHONPATH:+:$PYTHONPATH}
  if [ -f "$repo/bluefog/run/bfrun.py" ]; then
    launcher=("$py" -m bluefog.run -np $nhosts -H "$(hosts_arg)" --mpi-args="$(mca_args)" -x PYTHONPATH)
    log "launcher: bfrun -H $(hosts_arg)"
  else
    # shellcheck disable=SC2046
    launcher=(mpirun --allow-run-as-root --bind-to none -np $nhosts -H "$(hosts_arg)" $(mca_args)
              -x PATH -x PYTHONPATH -x TF_CPP_MIN_LOG_LEVEL -x PYTHONUNBUFFERED)
    log "launcher: mpirun -H $(hosts_arg) (bluefog/run/bfrun.py not found)"
  fi
  timeout -k 10 "${launch_timeout:-3600}" \
    ip netns exec "$(host_ns 1)" unshare --uts /bin/sh -c 'hostname "$0"; exec "$@"' \
    "$(host_ns 1)" "${launcher[@]}" "$@"
}

step_api() {
  log "api: $api_tests on $nhosts hosts (timeout ${api_timeout}s)"
  local t0=$SECONDS rc
  # shellcheck disable=SC2086
  launch_timeout=$api_timeout launch tests/mpi_pytest.sh "$py" -p no:cacheprovider $api_tests \
    2>&1 | tee "$work/api.log" | grep -vE "oneDNN|cpu_feature_guard|absl::InitializeLog|AVX" \
    | tail -n 30 >&2
  rc=${PIPESTATUS[0]}
  if [ "$rc" != 0 ]; then
    log "api: FAILED (exit $rc after $((SECONDS - t0)) s)"; return 1
  fi
  grep -qE "[0-9]+ passed" "$work/api.log" || { log "api: no 'N passed' line from pytest"; return 1; }
  log "api: passed in $((SECONDS - t0)) s"
}

step_hello() {
  log "hello: one tiny bluefog job across the hosts"
  launch_timeout=300 launch "$py" -c '
import os, socket, tensorflow as tf
import bluefog.tensorflow as bf
bf.init()
n = int(bf.allreduce(tf.constant(1), average=False).numpy())
line = f"HELLO rank {bf.rank()}/{bf.size()} on {socket.gethostname()} local_size {bf.local_size()} sum {n}\n"
os.write(1, line.encode())
' 2>&1 | grep -vE "oneDNN|cpu_feature_guard|absl::InitializeLog|AVX" | tee "$work/hello.log" >&2
  # mpirun forwards each rank's output as it arrives, so two ranks' lines can share a line
  # of the log (seen in CI): match each report wherever it is, and require distinct ranks
  # and distinct hosts.
  local reports ranks hosts
  reports=$(grep -oE "HELLO rank [0-9]+/$nhosts on [^ ]+ local_size 1 sum $nhosts" "$work/hello.log")
  ranks=$(printf '%s\n' "$reports" | awk 'NF {print $3}' | sort -u | grep -c .)
  hosts=$(printf '%s\n' "$reports" | awk 'NF {print $5}' | sort -u | grep -c .)
  [ "$ranks" = "$nhosts" ] && [ "$hosts" = "$nhosts" ] || {
    log "hello: FAILED (expected $nhosts ranks, each alone on its host; got $ranks ranks on $hosts hosts)"; return 1; }
  log "hello: passed"
}

step_cut() {
  log "cut: loop of allreduces on $nhosts hosts; host $nhosts's link goes down mid-run"
  local out=$work/cut.log t0 pid rc t_cut t_end after_ms
  : >"$out"
  ( launch "$py" tests/faults/rank_fault.py none --steps 100000000 --progress-every 100 \
      >"$out" 2>&1; echo $? >"$work/cut.rc" ) &
  pid=$!
  # Wait until the job is well under way (all hosts exchanging data).
  t0=$SECONDS
  until grep -q "PROGRESS step 300 " "$out"; do
    if ! kill -0 $pid 2>/dev/null || [ $((SECONDS - t0)) -gt 300 ]; then
      log "cut: the job did not get going:"; tail -n 40 "$out" >&2; return 1
    fi
    sleep 0.5
  done
  ip -n "$ns_sw" link set "h${nhosts}p" down
  t_cut=$(now_ms)
  log "cut: $(host_ns $nhosts) ($(host_ip $nhosts)) link down at step $(grep -o 'PROGRESS step [0-9]*' "$out" | tail -1 | cut -d' ' -f3)"
  # The job must end by itself within the bound.
  while kill -0 $pid 2>/dev/null; do
    if [ $(( $(now_ms) - t_cut )) -gt $(( cut_bound * 1000 )) ]; then
      log "cut: FAILED: the job still runs ${cut_bound} s after the link went down (a hang)"
      tail -n 40 "$out" >&2
      return 1
    fi
    sleep 0.5
  done
  wait $pid
  t_end=$(now_ms)
  rc=$(cat "$work/cut.rc" 2>/dev/null || echo "?")
  after_ms=$((t_end - t_cut))
  log "cut: the job ended $((after_ms / 1000)).$(printf '%03d' $((after_ms % 1000))) s after the cut, exit status $rc"
  grep -v "^\s*$" "$out" | grep -vE "oneDNN|absl::InitializeLog|PROGRESS" \
    | grep -iE "lost|daemon|error|abort|exited|node|rank|fail" | head -n 20 | sed 's/^/    | /' >&2
  if [ "$rc" = 0 ]; then
    log "cut: FAILED: exit status 0 although a host was lost"; return 1
  fi
  if ! grep -qE "$(host_ip $nhosts)|$(host_ns $nhosts)" "$out"; then
    log "cut: FAILED: the output does not name the lost host $(host_ip $nhosts)"
    tail -n 40 "$out" >&2
    return 1
  fi
  log "cut: passed"
}

trap cleanup EXIT
trap 'exit 130' INT TERM
[ "$steps" = all ] && steps="hello api cut"
setup || { log "setup failed"; exit 1; }
status=0
for s in $steps; do
  case $s in
    hello) step_hello || status=1 ;;
    api) step_api || status=1 ;;
    cut) step_cut || status=1 ;;
    *) log "unknown step '$s' (api, cut)"; status=1 ;;
  esac
done
[ $status = 0 ] && log "all passed ($steps)" || log "FAILED"
exit $status
