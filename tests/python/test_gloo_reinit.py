"""bf.init() again in the same process on the Gloo backend: after bf.shutdown(), and after a
rank of the job died (its peers' collectives fail at once, then they start a new job
without it). Plain pytest; each rank is a process of tests/elastic/reinit_worker.py."""

import os
import re
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from gloo_jobs import free_port, gloo_built, run_gloo_job  # noqa: E402
from mpi_jobs import PYTHON  # noqa: E402

pytestmark = pytest.mark.skipif(not gloo_built(), reason="bluefog was built without Gloo")

WORKER = "tests/elastic/reinit_worker.py"
TIMEOUT_S = 120
# The survivors' next allreduce after a rank's abrupt exit fails through TCP errors, not after
# BLUEFOG_GLOO_TIMEOUT (60 s in these jobs).
PROMPT_S = 5.0


@pytest.mark.timeout(TIMEOUT_S + 30)
def test_init_again_after_shutdown_and_after_a_lost_rank():
    result = run_gloo_job([PYTHON, WORKER, "--die", "2"], 3, TIMEOUT_S,
                          env={"SECOND_PORT": str(free_port()), "THIRD_PORT": str(free_port())})
    out = result.output
    assert not result.timed_out, out[-6000:]
    assert len(re.findall(r"SECOND JOB OK rank \d", out)) == 3, out[-6000:]
    assert "exit 3" in out, out[-6000:]  # rank 2
    failed = [float(s) for s in re.findall(r"FAILED rank \d after ([\d.]+) s", out)]
    assert len(failed) == 2 and max(failed) < PROMPT_S, out[-6000:]
    assert len(re.findall(r"REINIT OK rank \d of 2 \(was \d of 3\)", out)) == 2, out[-6000:]
