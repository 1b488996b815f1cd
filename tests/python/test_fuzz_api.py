"""Bad and odd input to the public API ends in a clear exception on every rank, or the right value.

Plain pytest (not under mpirun): runs the seeded fuzzer tests/fuzz/fuzz_api.py under mpirun at
1, 2 and 3 ranks. Every rank draws the same cases from the seed; the fuzzer checks each case on
every rank (clear exception, or the right value), that all ranks agree on the outcome, and that
a collective still works afterwards. A hang fails through the fuzzer's per-case watchdog and this
test's timeout.

BLUEFOG_FUZZ_SEED and BLUEFOG_FUZZ_CASES change the seed and the number of cases (e.g. to search
longer: BLUEFOG_FUZZ_CASES=3000 BLUEFOG_FUZZ_SEED=$RANDOM).
"""

import json
import os
import re

import pytest

from mpi_jobs import PYTHON, have_mpirun, mpirun_prefix, run_job

pytestmark = pytest.mark.skipif(not have_mpirun(), reason="mpirun not installed")

SEED = int(os.environ.get("BLUEFOG_FUZZ_SEED", "7"))
CASES = int(os.environ.get("BLUEFOG_FUZZ_CASES", "250"))
JOB_TIMEOUT_S = 120 + CASES * 0.5


@pytest.mark.timeout(JOB_TIMEOUT_S + 60)
@pytest.mark.parametrize("np_", [1, 2, 3])
def test_fuzz_public_api(np_):
    cmd = mpirun_prefix(np_) + [PYTHON, "tests/fuzz/fuzz_api.py", "--cases", str(CASES),
                                "--seed", str(SEED), "--case-timeout", "60"]
    result = run_job(cmd, timeout=JOB_TIMEOUT_S)
    assert not result.timed_out, f"the fuzz job hung:\n{result.tail()}"
    hangs = re.findall(r"FUZZ rank \d+: HANG: (.*)", result.output)
    assert not hangs, "cases hung (no exception within the case timeout):\n" + "\n".join(hangs)
    failures = sorted(set(re.findall(r"FUZZ rank \d+: FAIL (.*)", result.output)))
    assert not failures, (f"{len(failures)} fuzz cases misbehaved (seed {SEED}, {np_} ranks):\n"
                          + "\n".join(f[:400] for f in failures[:30]))
    summary = result.output.find("FUZZ SUMMARY {")
    assert summary >= 0, f"no summary; the job failed:\n{result.tail()}"
    # Decode just the object: mpirun may join another rank's output onto the same line.
    data, _ = json.JSONDecoder().raw_decode(result.output, summary + len("FUZZ SUMMARY "))
    assert data["ok"] and data["failures_all_ranks"] == 0, data
    assert result.returncode == 0, result.tail()
