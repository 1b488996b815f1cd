"""Short mode of the randomized stress run: tests/stress/stress_collectives.py --count 500.

Plain pytest (not under mpirun): 3 ranks, 500 random collectives (allreduce, allgather,
broadcast, grouped_allreduce, neighbor_allreduce; random dtypes, shapes, names; eager,
threaded and tf.function batches), every result checked against numpy on every rank. The long
run is the same script with --count 10000 (see its docstring); BLUEFOG_STRESS_COUNT changes the
count here.
"""

import json
import os

import pytest

from mpi_jobs import PYTHON, have_mpirun, mpirun_prefix, run_job

pytestmark = pytest.mark.skipif(not have_mpirun(), reason="mpirun not installed")

COUNT = int(os.environ.get("BLUEFOG_STRESS_COUNT", "500"))


JOB_TIMEOUT_S = 180 + COUNT * 0.1


@pytest.mark.nightly  # (make stress: 10,000)
@pytest.mark.timeout(JOB_TIMEOUT_S + 60)
def test_stress_short(tmp_path):
    summary_file = tmp_path / "summary.json"
    # Memory is reported but not judged on a short run: TensorFlow's caches are still filling.
    cmd = mpirun_prefix(3) + [PYTHON, "tests/stress/stress_collectives.py", "--count", str(COUNT),
                              "--seed", "2024", "--stall-timeout", "60",
                              "--max-rss-growth-mb", "1e9", "--json", str(summary_file)]
    result = run_job(cmd, timeout=JOB_TIMEOUT_S)
    assert not result.timed_out, f"the stress job hung:\n{result.tail()}"
    assert summary_file.exists(), f"no summary; the job failed:\n{result.tail()}"
    summary = json.loads(summary_file.read_text())
    print("stress summary:", json.dumps(summary))
    assert summary["completed_per_rank"] == [COUNT] * 3, summary
    assert summary["mismatches"] == 0 and summary["errors"] == 0, result.tail()
    assert summary["ok"], summary
    assert result.returncode == 0, result.tail()


SOAK_S = float(os.environ.get("BLUEFOG_SOAK_SECONDS", "45"))


# A fixed 45 s plus start-up, and its growth per cycle is judged over fewer cycles on a busy
# machine: `make test-nightly` (and `make soak`, 300 s).
@pytest.mark.nightly
@pytest.mark.timeout(SOAK_S + 240)
def test_soak_state_short(tmp_path):
    """tests/stress/soak_state.py for SOAK_S seconds at 3 ranks (make soak: 300 s): process
    sets, windows and elastic commits cycled, memory, descriptors, threads and state files
    checked against the warm-up."""
    summary_file = tmp_path / "soak.json"
    cmd = mpirun_prefix(3) + [PYTHON, "tests/stress/soak_state.py", "--seconds", str(SOAK_S),
                              "--json", str(summary_file)]
    result = run_job(cmd, timeout=SOAK_S + 180)
    assert not result.timed_out, f"the soak hung:\n{result.tail()}"
    assert summary_file.exists(), f"no summary; the soak failed:\n{result.tail()}"
    summary = json.loads(summary_file.read_text())
    print("soak summary:", json.dumps(summary))
    assert summary["ok"] and summary["problems_all_ranks"] == 0, result.tail()
    assert summary["cycles"] > 50, summary
    assert result.returncode == 0, result.tail()
