"""Random launch configurations end in a clear error on every process or a correct job.

Plain pytest: runs a small sample of the launch fuzzer (tests/fuzz/fuzz_launch.py: torchrun's
variables, TF_CONFIG, BLUEFOG_*/HOROVOD_* settings and bfrun's options at 2-3 processes, each
checked by an allreduce, without TensorFlow). The seed changes every day, so the sample
rotates over the case space (`make test-nightly`); `make fuzz-launch` runs 500 cases. A failing
case prints the seed and its number: rerun it with
`python tests/fuzz/fuzz_launch.py --seed S --only N --verbose`.

BLUEFOG_FUZZ_LAUNCH_SEED and BLUEFOG_FUZZ_LAUNCH_CASES change the seed and the number of cases.
"""

import json
import os
import re
import time

import pytest

from gloo_jobs import gloo_built
from mpi_jobs import PYTHON, run_job

pytestmark = pytest.mark.skipif(not gloo_built(), reason="bluefog was built without Gloo")

SEED = int(os.environ.get("BLUEFOG_FUZZ_LAUNCH_SEED", str(int(time.time() // 86400))))
CASES = int(os.environ.get("BLUEFOG_FUZZ_LAUNCH_CASES", "60"))
# A case ends within its own 40 s timeout; most take 1-4 s.
JOB_TIMEOUT_S = 60 + CASES * 45


@pytest.mark.nightly
@pytest.mark.timeout(JOB_TIMEOUT_S + 60)
def test_fuzz_launch_configurations():
    result = run_job([PYTHON, "tests/fuzz/fuzz_launch.py", "--cases", str(CASES), "--seed",
                      str(SEED)], timeout=JOB_TIMEOUT_S)
    out = result.output
    assert not result.timed_out, f"the launch fuzzer hung:\n{result.tail()}"
    failures = re.findall(r"FUZZ LAUNCH FAIL (.*)", out)
    assert not failures, (f"{len(failures)} launch cases misbehaved (seed {SEED}):\n"
                          + "\n".join(f[:600] for f in failures))
    summary = re.search(r"FUZZ LAUNCH SUMMARY (\{.*\})", out)
    assert summary, f"no summary; the fuzzer failed:\n{result.tail()}"
    data = json.loads(summary.group(1))
    assert data["cases"] == CASES and data["ok"] + data["clear"] == CASES, data
    print("launch fuzz:", json.dumps(data))
    assert result.returncode == 0, result.tail()
