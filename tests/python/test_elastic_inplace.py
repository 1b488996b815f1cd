"""In-place elastic training on Gloo (``bfrun --gloo --min-np``), local processes, plain pytest.

Each test runs examples/elastic_digits.py (digits, a KerasState committed every few steps):

* a worker of 3 is killed with SIGKILL mid-training: the 2 survivors, the same processes
  (their PIDs do not change), finish with identical weights and the accuracy of an
  uninterrupted run (run beside it) within 1 pp, redoing at most the commit interval;
* the discovery script adds a slot: a new worker joins at the next commit and ends with the
  same weights as the others;
* below --min-np: the job ends with status 1 and a line naming the lost worker.

The last two run under `make test-gloo` (BLUEFOG_TEST_GLOO_ELASTIC=1: 40 s and 20 s here).
"""

import os
import re
import signal
import sys
import time

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from gloo_jobs import gloo_built  # noqa: E402
from mpi_jobs import PYTHON, BackgroundJob  # noqa: E402

pytestmark = pytest.mark.skipif(not gloo_built(), reason="bluefog was built without Gloo")

slow = pytest.mark.skipif(os.environ.get("BLUEFOG_TEST_GLOO_ELASTIC") != "1",
                          reason="60 s: run by `make test-gloo` (BLUEFOG_TEST_GLOO_ELASTIC=1)")

EXAMPLE = "examples/elastic_digits.py"
TIMEOUT_S = 150
COMMIT_EVERY = 4
EPOCHS = 4
BATCH = 32
TRAIN_SAMPLES = 1437  # digits' training split (80 %)


def bfrun(*args):
    return [PYTHON, "-m", "bluefog.run", "--gloo", *args]


def example(*extra, epochs=EPOCHS):
    return [PYTHON, EXAMPLE, "--epochs", str(epochs), "--batch-size", str(BATCH),
            "--commit-every", str(COMMIT_EVERY), "--log-steps", *extra]


def finish(job, timeout=TIMEOUT_S):
    try:
        job.proc.wait(timeout=timeout)
    except Exception:  # noqa: BLE001 - a hang: fail with the output
        job.kill()
        raise AssertionError(f"the job did not finish in {timeout} s:\n{job.output[-6000:]}") \
            from None
    job.reader.join(timeout=10)
    return job.output


def starts(out):
    return {w: int(p) for w, p in re.findall(r"^\[(\d+)\] START rank \d+ size \d+ pid (\d+)",
                                             out, re.M)}


def dones(out):
    return {w: (int(s), int(p), float(a)) for w, s, p, a in re.findall(
        r"^\[(\d+)\] DONE rank \d+ size (\d+) pid (\d+) accuracy=([\d.]+)", out, re.M)}


def accuracy(out):
    return float(re.search(r"test accuracy=([\d.]+)", out).group(1))


@pytest.mark.timeout(TIMEOUT_S + 60)
def test_killed_worker_survivors_continue_in_place():
    reference = BackgroundJob(bfrun("-np", "3", *example()))
    job = BackgroundJob(bfrun("-np", "3", "--min-np", "2", "-H", "localhost:3", *example()))
    try:
        job.wait_for(r"^\[0\] STEP launch 0 epoch 1 batch 5 ", TIMEOUT_S)
        victim = starts(job.output)["2"]
        os.kill(victim, signal.SIGKILL)
        killed_at = time.time()
        out = finish(job)
        ref = finish(reference)
    finally:
        job.kill()
        reference.kill()
    assert job.proc.returncode == 0, out[-6000:]
    assert reference.proc.returncode == 0, ref[-6000:]
    assert "weights identical on all ranks" in out, out[-6000:]
    assert "worker 2 (rank 2 of round 0, on localhost) killed by signal SIGKILL" in out
    pids, done = starts(out), dones(out)
    # The survivors are the processes that started: nothing was relaunched.
    assert sorted(done) == ["0", "1"], out[-6000:]
    for w in ("0", "1"):
        assert done[w][0] == 2 and done[w][1] == pids[w], (w, done, pids)
    assert abs(accuracy(out) - accuracy(ref)) <= 0.01, (accuracy(out), accuracy(ref))
    # At most the commit interval redone: the last step before the failure against the commit
    # the survivors resumed from (both counted in the 3-rank job's steps).
    per_epoch = TRAIN_SAMPLES // (3 * BATCH)
    steps = [(int(e), int(b)) for e, b, s in re.findall(
        r"^\[0\] STEP launch 0 epoch (\d+) batch (\d+) size (\d+)", out, re.M) if s == "3"]
    reset = re.search(r"RESET launch 0: 2 ranks from epoch (\d+) batch (\d+)", out)
    assert reset, out[-6000:]
    last = steps[-1][0] * per_epoch + steps[-1][1] + 1  # steps done before the failure
    resumed = int(reset.group(1)) * per_epoch + int(reset.group(2))
    assert 0 <= last - resumed <= COMMIT_EVERY, (steps[-1], reset.groups())
    first_after = re.search(r"^\[0\] STEP launch 0 epoch \d+ batch \d+ size 2 t=([\d.]+)", out,
                            re.M)
    print(f"recovery (SIGKILL to the first step after it): "
          f"{float(first_after.group(1)) - killed_at:.2f} s; accuracy {accuracy(out):.4f}, "
          f"uninterrupted {accuracy(ref):.4f}")


@slow
@pytest.mark.timeout(TIMEOUT_S + 60)
def test_discovered_slot_joins_at_the_next_commit(tmp_path):
    hosts = tmp_path / "hosts.txt"
    hosts.write_text("localhost:2\n")
    script = tmp_path / "discover.sh"
    script.write_text(f"#!/bin/sh\ncat {hosts}\n")
    script.chmod(0o755)
    # Long enough for the new worker to start (TensorFlow's import) while the others train.
    job = BackgroundJob(bfrun("--min-np", "2", "--host-discovery-script", str(script),
                              *example("--step-sleep", "0.03", epochs=8)))
    try:
        job.wait_for(r"^\[0\] START ", TIMEOUT_S)
        hosts.write_text("localhost:3\n")
        out = finish(job)
    finally:
        job.kill()
    assert job.proc.returncode == 0, out[-6000:]
    assert "started worker 2 on localhost (new slot)" in out, out[-6000:]
    assert re.search(r"round 1: 3 worker\(s\) \['0', '1', '2'\] \(worker\(s\) \['2'\] joining\)",
                     out), out[-6000:]
    assert "weights identical on all ranks" in out, out[-6000:]
    pids, done = starts(out), dones(out)
    assert sorted(done) == ["0", "1", "2"], out[-6000:]
    for w in ("0", "1", "2"):
        assert done[w][0] == 3 and done[w][1] == pids[w], (w, done, pids)
    # The newcomer took the committed state: training went on from a commit, not from scratch.
    reset = re.search(r"RESET launch 0: 3 ranks from epoch (\d+) batch (\d+) \(commit (\d+)\)",
                      out)
    assert reset and int(reset.group(3)) >= 1, out[-6000:]


@slow
@pytest.mark.timeout(TIMEOUT_S + 60)
def test_below_min_np_ends_the_job_with_a_clear_message():
    job = BackgroundJob(bfrun("-np", "2", "--min-np", "2", "-H", "localhost:2", *example()))
    try:
        job.wait_for(r"^\[0\] STEP launch 0 epoch 0 batch 2 ", TIMEOUT_S)
        os.kill(starts(job.output)["1"], signal.SIGKILL)
        out = finish(job, 60)
    finally:
        job.kill()
    assert job.proc.returncode == 1, out[-6000:]
    assert re.search(r"bfrun: elastic: giving up: 1 worker\(s\) left, below --min-np 2\. "
                     r"Lost: worker 1 on localhost \(killed by signal SIGKILL\)", out), out[-6000:]
    assert "DONE" not in out
