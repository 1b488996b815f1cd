"""A rank's shutdown while the others still put into its window: bounded, and the putters get a
clear error.

Plain pytest (not under mpirun): 2- and 3-rank jobs of tests/faults/win_shutdown.py. Rank 0
shuts down while every other rank puts into it in a loop. Asserted: rank 0's shutdown returns
within SHUTDOWN_BOUND_S (it waits only for the others to learn of it: their next put fails, and
they shut down too), and each putter's error names itself, win_put, the window, rank 0 as the
target and that it shut down.
"""

import re

import pytest

from mpi_jobs import PYTHON, have_mpirun, mpirun_prefix, run_job

JOB_TIMEOUT_S = 180
# The job's own timeout fires first, failing the test with the job's output.
pytestmark = [pytest.mark.skipif(not have_mpirun(), reason="mpirun not installed"),
              pytest.mark.timeout(JOB_TIMEOUT_S + 60)]

SHUTDOWN_BOUND_S = 5.0
# How long a putter keeps putting if no put fails: well past the bound, so a shutdown that
# waits for the putters to stop shows.
PUT_CAP_S = 20.0


@pytest.mark.parametrize("np_", [2, 3])
def test_shutdown_refuses_puts_and_returns(np_):
    cmd = mpirun_prefix(np_) + [PYTHON, "tests/faults/win_shutdown.py", "--cap", str(PUT_CAP_S)]
    result = run_job(cmd, timeout=JOB_TIMEOUT_S)
    assert not result.timed_out, f"the job hung:\n{result.tail()}"
    assert result.returncode == 0, result.tail()
    took = re.search(r"SHUTDOWN rank 0 took ([\d.]+) s", result.output)
    assert took, f"rank 0 never finished its shutdown:\n{result.tail()}"
    assert float(took.group(1)) < SHUTDOWN_BOUND_S, (
        f"rank 0's shutdown took {took.group(1)} s while the others put into it "
        f"(bound {SHUTDOWN_BOUND_S} s):\n{result.tail()}")
    # Ranks print concurrently to one pipe, so two reports can share a line: each report runs
    # until the next one starts or the line ends.
    putters = dict(re.findall(r"PUTTER rank (\d+): \d+ puts, then: (.*?)(?=PUTTER rank \d+:|$)",
                              result.output, re.M))
    assert sorted(putters) == [str(r) for r in range(1, np_)], result.tail()
    for r, message in putters.items():
        for part in (f"rank {r}: bluefog win_put of window 'w': rank 0 refused: window 'w' on "
                     "rank 0 is shut down (rank 0 shut down: bf.shutdown() was called",
                     "call bf.shutdown() on this rank too"):
            assert part in message, f"rank {r}: {part!r} not in {message!r}"
