"""Multi-host over TCP, on one machine: 3 network-namespace hosts (tests/multihost/run_netns.sh).

Plain pytest (not under mpirun). Runs the seed API tests with one rank per "host" through
`bfrun -H` (or `mpirun -H` while bfrun is missing; `make test` the collectives, process sets and
windows, `make test-nightly` every API test of the script's list), then cuts one host's link
mid-run and checks that the job ends with an error naming the lost host instead of hanging.
Needs root and `ip netns`; skipped with the reason otherwise. The script removes its namespaces
on exit.
"""

import os
import subprocess
import sys

import pytest

from mpi_jobs import REPO, kill_tree, netns_skip_reason

SCRIPT = os.path.join(REPO, "tests", "multihost", "run_netns.sh")
TIMEOUT_S = 1500


def _skip_reason():
    return netns_skip_reason()


# What `make test` runs across the 3 hosts: the collectives, process sets and windows (the
# nightly run takes run_netns.sh's whole list of API tests).
QUICK_API = ("tests/python/mpi/test_collectives.py tests/python/mpi/test_process_sets.py "
             "tests/python/mpi/test_windows.py")


@pytest.mark.nightly
@pytest.mark.timeout(TIMEOUT_S + 120)
@pytest.mark.skipif(_skip_reason() is not None, reason=str(_skip_reason()))
def test_three_netns_hosts_api_and_link_cut():
    _run_netns(dict(os.environ, BF_MULTIHOST_TESTS=QUICK_API))


@pytest.mark.nightly
@pytest.mark.timeout(TIMEOUT_S + 120)
@pytest.mark.skipif(_skip_reason() is not None, reason=str(_skip_reason()))
def test_three_netns_hosts_every_api_test_and_link_cut():
    env = {k: v for k, v in os.environ.items() if k != "BF_MULTIHOST_TESTS"}
    _run_netns(env)


def _run_netns(env):
    proc = subprocess.Popen([SCRIPT], cwd=REPO, stdout=subprocess.PIPE, env=env,
                            stderr=subprocess.STDOUT, text=True, errors="replace")
    try:
        out, _ = proc.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        # SIGTERM first: the script's trap then deletes its namespaces and their processes.
        kill_tree(proc)
        out, _ = proc.communicate()
        pytest.fail(f"run_netns.sh did not finish within {TIMEOUT_S} s:\n{out[-6000:]}")
    lines = [line for line in out.splitlines() if line.startswith("[run_netns]") or "| " in line]
    print("\n".join(lines))
    if proc.returncode == 77:
        pytest.skip(next((line for line in lines if "SKIP" in line), "run_netns.sh skipped"))
    assert proc.returncode == 0, out[-8000:]
    assert "[run_netns] all passed" in out


PHASED_TIMEOUT_S = 300


@pytest.mark.timeout(PHASED_TIMEOUT_S + 60)
@pytest.mark.skipif(_skip_reason() is not None, reason=str(_skip_reason()))
def test_two_netns_hosts_two_ranks_each_phased_exchange():
    """tests/multihost/phased_job.py on 2 pretend hosts x 2 ranks (bench/netns/hosts.sh,
    prefix bfpx, unshaped): the exchanges with one peer on the other host, run in two phases,
    give the closed-form results, also beside ranks that post all at once and with the phased
    exchange off on rank 0 only."""
    env = dict(os.environ, BF_NETNS_PREFIX="bfpx", BF_NETNS_NET="10.213.83",
               OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    hosts_sh = os.path.join(REPO, "bench", "netns", "hosts.sh")
    subprocess.run([hosts_sh, "down", "2"], env=env, capture_output=True)
    subprocess.run([hosts_sh, "up", "2", "none"], env=env, check=True)
    try:
        net = "10.213.83.0/24"
        cmd = ["mpirun", "--allow-run-as-root", "--oversubscribe", "--bind-to", "none", "-np",
               "4", "-H", "10.213.83.1:2,10.213.83.2:2", "--mca", "plm_rsh_agent",
               os.path.join(REPO, "bench", "netns", "rsh.sh"), "--mca", "plm_rsh_no_tree_spawn",
               "1", "--mca", "btl", "self,vader,tcp", "--mca", "btl_tcp_if_include", net,
               "--mca", "oob_tcp_if_include", net, "-x", "PATH", "-x", "PYTHONPATH",
               sys.executable, os.path.join(REPO, "tests", "multihost", "phased_job.py")]
        env["PYTHONPATH"] = REPO
        proc = subprocess.run(cmd, env=env, cwd=REPO, capture_output=True, text=True,
                              timeout=PHASED_TIMEOUT_S)
        out = proc.stdout + proc.stderr
        assert proc.returncode == 0, out[-6000:]
        for rank in range(4):
            assert f"PHASED OK rank {rank}" in out, out[-6000:]
    finally:
        subprocess.run([hosts_sh, "down", "2"], env=env, capture_output=True)
