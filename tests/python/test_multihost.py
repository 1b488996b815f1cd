"""Multi-host over TCP, on one machine: 3 network-namespace hosts (tests/multihost/run_netns.sh).

Plain pytest (not under mpirun). Runs the seed API tests with one rank per "host" through
`bfrun -H` (or `mpirun -H` while bfrun is missing), then cuts one host's link mid-run and checks
that the job ends with an error naming the lost host instead of hanging. Needs root and
`ip netns`; skipped with the reason otherwise. The script removes its namespaces on exit.
"""

import os
import subprocess

import pytest

from mpi_jobs import REPO, kill_tree, netns_skip_reason

SCRIPT = os.path.join(REPO, "tests", "multihost", "run_netns.sh")
TIMEOUT_S = 1500


def _skip_reason():
    return netns_skip_reason()


@pytest.mark.timeout(TIMEOUT_S + 120)
@pytest.mark.skipif(_skip_reason() is not None, reason=str(_skip_reason()))
def test_three_netns_hosts_api_and_link_cut():
    proc = subprocess.Popen([SCRIPT], cwd=REPO, stdout=subprocess.PIPE,
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
