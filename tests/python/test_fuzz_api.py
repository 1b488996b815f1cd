"""Bad and odd input to the public API ends in a clear exception on every rank, or the right value.

Plain pytest (not under mpirun): runs the seeded fuzzer tests/fuzz/fuzz_api.py under mpirun at
1, 2 and 3 ranks, and its stateful family (windows, process sets, join, alltoall splits,
elastic states) at 2 and 3 ranks. Every rank draws the same cases from the seed; the fuzzer
checks each case on every rank (clear exception, or the right value), that all ranks agree on
the outcome, and that a collective still works afterwards. A hang fails through the fuzzer's
per-case watchdog and this test's timeout.

BLUEFOG_FUZZ_SEED, BLUEFOG_FUZZ_CASES and BLUEFOG_FUZZ_STATE_CASES change the seed and the
numbers of cases (e.g. to search longer: BLUEFOG_FUZZ_CASES=3000 BLUEFOG_FUZZ_SEED=$RANDOM).
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


STATE_CASES = int(os.environ.get("BLUEFOG_FUZZ_STATE_CASES", "150"))


@pytest.mark.timeout(JOB_TIMEOUT_S + 60)
@pytest.mark.parametrize("np_", [pytest.param(n, marks=pytest.mark.nightly) if n != 2 else n
                                 for n in (1, 2, 3)])
def test_fuzz_public_api(np_):
    check_fuzz_job(np_, "api", CASES)


@pytest.mark.timeout(JOB_TIMEOUT_S + 60)
@pytest.mark.parametrize("np_", [2, 3])
def test_fuzz_stateful_api(np_):
    """Windows and their mutexes, process sets, join, alltoall splits, elastic states."""
    check_fuzz_job(np_, "state", STATE_CASES)


def check_fuzz_job(np_, family, cases):
    cmd = mpirun_prefix(np_) + [PYTHON, "tests/fuzz/fuzz_api.py", "--cases", str(cases),
                                "--seed", str(SEED), "--case-timeout", "60",
                                "--family", family]
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
    assert data["clear_error_on_every_rank"] + data["right_value_on_every_rank"] == cases, data
    print(f"fuzz {family} at {np_} ranks:", json.dumps(data))
    assert result.returncode == 0, result.tail()
