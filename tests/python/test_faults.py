"""A rank that dies mid-training ends the whole job with an error that names it, in bounded time.

Plain pytest (not under mpirun): each test starts a 3-rank job of tests/faults/rank_fault.py in
which rank 1 fails at step 20 of a loop of allreduces (killed with SIGKILL, crashed with SIGSEGV,
sys.exit(3), sys.exit(0), os._exit(3), an uncaught exception). Asserted:

* the launcher (mpirun, or bfrun, which execs mpirun) exits non-zero;
* the job ends within FAULT_BOUND_S seconds of the fault (measured from the victim's
  "FAULT ... at <time>" line to the launcher's exit; about 1 s for signals and os._exit, 2-6 s
  for the exits that run Python's shutdown, on 2 busy cores);
* the output names rank 1: Open MPI's "process rank 1 ... exited on signal N" or
  "Process name: [[job,1],1] Exit code: N", and/or, for the exits during which bluefog shuts
  down cleanly, the survivors' error "bluefog has been shut down (rank 1 shut down: ...)".

What ends the survivors: when a rank dies from a signal or exits without MPI_Finalize, mpirun
notices (its child ended) and kills the other ranks. When a rank exits through Python
(sys.exit, an uncaught exception), bluefog's atexit shutdown tells the other ranks in the next
negotiation round: their pending collective fails with AbortedError, they raise, and mpirun
reports the first non-zero exit status.
"""

import os
import re

import pytest

from mpi_jobs import PYTHON, bfrun_available, have_mpirun, mpirun_prefix, run_job

pytestmark = pytest.mark.skipif(not have_mpirun(), reason="mpirun not installed")

JOB = "tests/faults/rank_fault.py"
NP = 3
VICTIM = 1
# The documented bound: a lost rank ends the job within this many seconds.
FAULT_BOUND_S = 30.0
# The whole job, start-up included (3 TensorFlow imports on 2 cores take ~10-20 s).
JOB_TIMEOUT_S = 240
# A job's own timeout fires before pytest-timeout's: a hang fails its test with the output.
pytestmark = [pytestmark, pytest.mark.timeout(JOB_TIMEOUT_S + 60)]

SIGNAL_RE = r"process rank {r} with PID \d+ on node \S+ exited on signal {sig}"
EXIT_RE = r"Process name: \[\[\d+,\d+\],{r}\]\s+Exit code:\s+{code}"
BLUEFOG_RE = r"bluefog has been shut down \(rank {r} shut down"

# mode -> (patterns naming the victim, of which at least one must appear; survivors must
# report the bluefog error naming the victim)
MODES = {
    "sigkill": ([SIGNAL_RE.format(r=VICTIM, sig=9)], False),
    "segfault": ([SIGNAL_RE.format(r=VICTIM, sig=11)], False),
    "os_exit3": ([EXIT_RE.format(r=VICTIM, code=3)], False),
    "exit3": ([EXIT_RE.format(r=VICTIM, code=3), BLUEFOG_RE.format(r=VICTIM)], True),
    "exit0": ([BLUEFOG_RE.format(r=VICTIM)], True),
    "raise": ([BLUEFOG_RE.format(r=VICTIM)], True),
}


def run_fault(mode: str, launcher: str = "mpirun"):
    cmd = mpirun_prefix(NP, launcher) + [PYTHON, JOB, mode, "--victim", str(VICTIM),
                                         "--step", "20"]
    result = run_job(cmd, timeout=JOB_TIMEOUT_S)
    assert not result.timed_out, f"the job hung after the fault:\n{result.tail()}"
    return result


def check_fault(mode: str, result) -> float:
    out = result.output
    fault = re.search(rf"FAULT {mode} rank {VICTIM} at (\d+\.\d+)", out)
    assert fault, f"the victim never reached the fault:\n{result.tail()}"
    assert result.returncode != 0, f"the launcher exited 0 after rank {VICTIM} failed:\n" + \
        result.tail()
    assert "finished all" not in out, result.tail()
    latency = result.ended - float(fault.group(1))
    assert latency <= FAULT_BOUND_S, (
        f"the job took {latency:.1f} s after the fault to end (bound {FAULT_BOUND_S} s)")
    patterns, survivors_report = MODES[mode]
    assert any(re.search(p, out) for p in patterns), (
        f"no message names the lost rank {VICTIM}; expected one of {patterns}:\n{result.tail()}")
    if survivors_report:
        survivors = re.findall(r"SURVIVOR rank (\d+) failed after [\d.]+ s: (.*)", out)
        assert survivors, f"no surviving rank reported an error:\n{result.tail()}"
        for r, message in survivors:
            assert int(r) != VICTIM
            assert re.search(BLUEFOG_RE.format(r=VICTIM), message), message
    print(f"{mode}: launcher exit {result.returncode}, ended {latency:.2f} s after the fault")
    return latency


# One of each way to die runs in `make test`: a signal (sigkill), an exit through Python's
# shutdown (exit3) and an exception (raise); their twins (~14 s each) run nightly.
TWINS = {"segfault", "os_exit3", "exit0"}


@pytest.mark.timeout(JOB_TIMEOUT_S + 60)
@pytest.mark.parametrize("mode", [pytest.param(m, marks=pytest.mark.nightly) if m in TWINS else m
                                  for m in MODES])
def test_lost_rank_fails_the_job(mode):
    shm_before = set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()
    check_fault(mode, run_fault(mode))
    # bluefog's shared memory (the rounds on one host) is a memfd: nothing named is left behind.
    if os.path.isdir("/dev/shm"):
        left = [n for n in set(os.listdir("/dev/shm")) - shm_before if "bluefog" in n]
        assert not left, f"the killed job left shared memory behind: {left}"



@pytest.mark.timeout(JOB_TIMEOUT_S + 60)
@pytest.mark.skipif(not bfrun_available(), reason="bluefog/run/bfrun.py is not there yet")
@pytest.mark.parametrize("mode", ["sigkill", pytest.param("exit3", marks=pytest.mark.nightly)])
def test_bfrun_propagates_the_failure(mode):
    check_fault(mode, run_fault(mode, launcher="bfrun"))
