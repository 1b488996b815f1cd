"""bluefog.ray.RayExecutor on a real local Ray cluster (head + worker node on this machine).

One driver process (tests/ray/ray_cases.py) starts the cluster and runs every case; each test
here checks one case's report. Ray is in requirements.txt; without it the tests skip, saying so.
"""

import json
import re

import pytest

from mpi_jobs import PYTHON, run_job

ray = pytest.importorskip("ray", reason="Ray is not installed (pip install ray)")

DRIVER_TIMEOUT_S = 420  # ~50 s measured: cluster start, 4 jobs, TensorFlow imports on 2 cores
# The driver runs inside the first test's setup: its own timeout must fire first, so that a slow
# or stuck case fails that test with the driver's output (each case prints its time), instead of
# pytest-timeout's default ending the whole session with a stack dump.
pytestmark = pytest.mark.timeout(2 * DRIVER_TIMEOUT_S + 60)


CLUSTER_DID_NOT_START = 75  # ray_cases.py's exit status when Ray's own start-up stalled


def drive(*names):
    """Runs the driver over the named cases. A Ray cluster that never came up (Ray's start-up,
    before any bluefog code runs) is tried once more, saying so."""
    cmd = [PYTHON, "tests/ray/ray_cases.py", *names]
    env = {"RAY_USAGE_STATS_ENABLED": "0"}
    result = run_job(cmd, timeout=DRIVER_TIMEOUT_S, env=env)
    if result.returncode == CLUSTER_DID_NOT_START:
        print(f"the Ray cluster did not start; once more:\n{result.tail()}")
        result = run_job(cmd, timeout=DRIVER_TIMEOUT_S, env=env)
    assert not result.timed_out, result.tail()
    return result


@pytest.fixture(scope="module")
def cases():
    result = drive("sums", "digits_2", "digits_3", "failure")
    found = {}
    for line in result.output.splitlines():
        if line.startswith("CASE "):
            case = json.loads(line[5:])
            found[case["case"]] = case
    assert found, result.tail()
    return found


def case(cases, name):
    assert name in cases, f"case {name} did not report"
    assert "error" not in cases[name], cases[name]["error"]
    return cases[name]


def test_run_returns_each_rank_result_in_rank_order(cases):
    c = case(cases, "sums")
    # 2 hosts x 1 worker: one worker on each Ray node; an allreduce over both.
    assert c["nodes"] == 2
    assert c["sums"] == [[0, 2, 3.0], [1, 2, 3.0]]


def test_execute_runs_on_each_worker_executable(cases):
    c = case(cases, "sums")
    assert c["bumps"] == [11, 11]
    assert c["single"] == 12  # rank 0's counter, bumped once more


@pytest.mark.parametrize("workers", [2, 3])
def test_digits_trains_on_ray_workers(cases, workers):
    c = case(cases, f"digits_{workers}")
    assert c["ranks"] == list(range(workers))
    assert c["backends"] == ["gloo"] * workers
    assert c["identical"], "the ranks ended with different weights"
    assert c["accuracy"] >= 0.9, c
    # 2 workers: one per node, asked for; 3 workers of 1 CPU cannot fit on one 2-CPU node.
    assert c["nodes"] == 2


def test_failure_on_one_rank_ends_the_run_at_once(cases):
    c = case(cases, "failure")
    assert c["raised"]
    assert 1 in c["failed"]
    assert "rank 1: ValueError: rank 1 gives up" in c["message"]
    assert "first on rank 1" in c["message"]
    # The others were blocked in a collective with rank 1: they fail because it shut down,
    # well before the 120 s timeout.
    assert c["seconds"] < 60, c
    assert c["unfinished"] == []
    assert "call start() again" in c["again"]


@pytest.fixture(scope="module")
def room_cases():
    result = drive("no_room", "busy")
    found = {"output": result.output}
    for line in result.output.splitlines():
        if line.startswith("CASE "):
            case = json.loads(line[5:])
            found[case["case"]] = case
    return found


@pytest.mark.nightly  # placement's error paths: a Ray cluster of their own (~20 s)
def test_no_room_on_the_cluster_fails_at_once(room_cases):
    c = case(room_cases, "no_room")
    assert c["raised"]
    assert "no room for 9 workers" in c["message"] and "never will" in c["message"], c
    assert "2 nodes: {'CPU': 2.0}, {'CPU': 2.0}" in c["message"], c
    assert "autoscaling=True" in c["message"], c
    assert c["seconds"] < 10, c  # not the 60 s of placement_group_timeout_s


@pytest.mark.nightly
def test_a_busy_cluster_is_waited_for_saying_so(room_cases):
    c = case(room_cases, "busy")
    assert c["raised"] and "within 12 s" in c["message"], c
    waits = re.findall(r"bluefog.ray: waiting for Ray to find room for 2 workers "
                       r".*\((\d+) s of 12\)", room_cases["output"])
    assert len(waits) >= 2, room_cases["output"][-3000:]


def test_fits_counts_whole_bundles_per_node():
    from bluefog.ray.executor import fits

    nodes = [{"CPU": 2.0, "memory": 1e9}, {"CPU": 2.0}]
    assert fits([{"CPU": 1}] * 4, "PACK", nodes)
    assert not fits([{"CPU": 1}] * 5, "PACK", nodes)
    assert not fits([{"CPU": 1.5}] * 3, "PACK", nodes)  # one per node
    assert fits([{"CPU": 2}] * 2, "STRICT_SPREAD", nodes)
    assert not fits([{"CPU": 1}] * 3, "STRICT_SPREAD", nodes)
    assert not fits([{"CPU": 1, "GPU": 1}], "PACK", nodes)


def test_bad_arguments_are_refused():
    from bluefog.ray import RayExecutor

    with pytest.raises(ValueError, match="num_workers, or num_hosts"):
        RayExecutor(None)
    with pytest.raises(ValueError, match="not both"):
        RayExecutor(None, num_workers=2, num_hosts=2, num_workers_per_host=1)
    with pytest.raises(ValueError, match="int >= 1"):
        RayExecutor(None, num_workers=0)
    with pytest.raises(ValueError, match="use_gpu"):
        RayExecutor(None, num_workers=2, gpus_per_worker=1)
    with pytest.raises(RuntimeError, match="before start"):
        RayExecutor(None, num_workers=2).run(print)
