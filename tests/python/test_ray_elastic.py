"""bluefog.ray.ElasticRayExecutor on a real local Ray cluster (tests/ray/elastic_ray_case.py):
3 workers, one kills its own process mid-training; the other two finish in place (same
processes, the committed counter right). About 40 s here: under `make test-gloo`
(BLUEFOG_TEST_GLOO_ELASTIC=1)."""

import json
import os

import pytest

from mpi_jobs import PYTHON, run_job

ray = pytest.importorskip("ray", reason="Ray is not installed (pip install 'bluefog-tf[ray]')")

TIMEOUT_S = 300


@pytest.mark.skipif(os.environ.get("BLUEFOG_TEST_GLOO_ELASTIC") != "1",
                    reason="40 s: run by `make test-gloo` (BLUEFOG_TEST_GLOO_ELASTIC=1)")
@pytest.mark.timeout(TIMEOUT_S + 60)
def test_elastic_ray_job_survives_a_lost_worker():
    result = run_job([PYTHON, "tests/ray/elastic_ray_case.py"], timeout=TIMEOUT_S)
    assert not result.timed_out, result.tail()
    lines = [json.loads(line[5:]) for line in result.output.splitlines()
             if line.startswith("CASE ")]
    assert lines, result.tail()
    case = lines[0]
    assert "error" not in case, case["error"]
    assert "worker 2 (rank 2 of round 0" in result.output and "killed by signal SIGKILL" in \
        result.output, result.tail()
    results = case["results"]
    assert [r["worker"] for r in results] == ["0", "1"], results
    for rank, r in enumerate(results):
        assert (r["rank"], r["size"], r["step"], r["counter"]) == (rank, 2, 24, 24.0), r
