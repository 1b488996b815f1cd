"""In-place elastic training on Gloo (``bfrun --gloo --min-np``), local processes, plain pytest.

Each test runs examples/elastic_digits.py (digits, a KerasState committed every few steps):

* a worker of 3 is killed with SIGKILL mid-training: the 2 survivors, the same processes
  (their PIDs do not change), finish with identical weights and the accuracy of an
  uninterrupted run (run beside it) within 1 pp, redoing at most the commit interval;
* the discovery script adds a slot: a new worker joins at the next commit and ends with the
  same weights as the others;
* below --min-np: the job ends with status 1 and a line naming the lost worker;
* two failures in a row, the first while the others are inside a commit
  (tests/elastic/inplace_worker.py, a committed counter): the job finishes on the 2 left, with
  the counter equal to the number of steps on both;
* a failure while the state goes to a joining worker: the root of the sync dies between
  broadcasting the variables and the step; the survivor and the newcomer re-form and finish
  with the counter equal to the number of steps;
* --reset-limit 1: the first failure re-forms the job, the second ends it with a clear line;
* the blacklist: the host of a failed worker gets no new worker until its
  --blacklist-cooldown-range has passed, then the discovery script's free slot is filled again.

The last six run under `make test-gloo` (BLUEFOG_TEST_GLOO_ELASTIC=1: 20-40 s each here).
"""

import os
import re
import signal
import sys
import time

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from gloo_jobs import gloo_built  # noqa: E402
from mpi_jobs import PYTHON, BackgroundJob, discovery_script  # noqa: E402

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
    return job.finish(timeout)


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


@pytest.mark.nightly  # a flood, as test_flood's job floods (make flood)
@pytest.mark.timeout(TIMEOUT_S + 60)
def test_store_flood_then_a_lost_worker_still_reforms():
    """A stranger holds 200 idle connections to the store bfrun serves while bfrun has 30
    descriptors to spare (its accept fails with EMFILE), then lets go; a worker killed after
    that still re-forms the job (the survivors reconnect to the store) and bfrun's descriptors
    come back to what they were."""
    import resource
    import socket

    from gloo_jobs import free_port

    port = free_port()
    job = BackgroundJob(bfrun("-np", "3", "--min-np", "2", "-H", "localhost:3", "--gloo-port",
                              str(port), PYTHON, "tests/elastic/inplace_worker.py", "--steps",
                              "150", "--step-ms", "60"))

    def descriptors():
        return len(os.listdir(f"/proc/{job.proc.pid}/fd"))

    try:
        pids = {}
        for w in ("0", "1", "2"):
            pids[w] = int(job.wait_for(rf"^\[{w}\] START worker {w} pid (\d+)", 90).group(1))
        job.wait_for(r"STEP 5 size 3", 60)
        before = descriptors()
        resource.prlimit(job.proc.pid, resource.RLIMIT_NOFILE,
                         (before + 30, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
        idle = []
        try:
            for _ in range(200):
                idle.append(socket.create_connection(("127.0.0.1", port), timeout=5))
        except OSError:
            pass  # the store stopped accepting: the job's outcome below says what it cost
        time.sleep(3)
        for c in idle:
            c.close()
        deadline = time.time() + 20
        while descriptors() > before + 5 and time.time() < deadline:
            time.sleep(0.1)
        after = descriptors()
        os.kill(pids["2"], signal.SIGKILL)
        out = finish(job)
    finally:
        job.kill()
    assert job.proc.returncode == 0, out[-6000:]
    assert after <= before + 5, (before, after)
    assert "cannot accept" in out, out[-6000:]
    assert re.search(r"round 1: 2 worker\(s\) \['0', '1'\]", out), out[-6000:]
    done = re.findall(r"^\[(\d)\] DONE worker \d+ rank \d size (\d) step (\d+) counter (\d+)",
                      out, re.M)
    assert sorted(done) == [("0", "2", "150", "150"), ("1", "2", "150", "150")], out[-6000:]


@pytest.mark.timeout(TIMEOUT_S + 60)
def test_a_handled_loss_prints_one_calm_line_per_survivor():
    """A recovery the job survives is not an error: each survivor says once, in one line,
    which rank left; no ERROR line, no TensorFlow message cut to 'Graph execution error:'."""
    job = BackgroundJob(bfrun("-np", "3", "--min-np", "2", "-H", "localhost:3", PYTHON,
                              "tests/elastic/inplace_worker.py", "--steps", "20", "--graph",
                              "--die", "2:8:step"))
    try:
        out = finish(job)
    finally:
        job.kill()
    assert job.proc.returncode == 0, out[-6000:]
    assert "DYING worker 2 at step 8" in out, out[-6000:]
    # The cause, then its effect.
    cause = out.index("bfrun: elastic: worker 2 (rank 2 of round 0, on localhost) killed by "
                      "signal SIGKILL")
    assert cause < out.index("bfrun: elastic: host localhost blacklisted for good"), out[-6000:]
    for w in ("0", "1"):
        lines = [line for line in out.splitlines() if line.startswith(f"[{w}] ")]
        calm = [line for line in lines if "re-forming the job in place" in line]
        assert len(calm) == 1, lines
        assert re.fullmatch(rf"\[{w}\] bluefog elastic: worker {w} \(rank {w}\): a rank was "
                            r"lost \(rank\(s\) [0-9, ]*2[0-9, ]* left the job\); re-forming the "
                            r"job in place", calm[0]), calm[0]
        assert not [line for line in lines if "ERROR" in line], lines
        assert "Graph execution error" not in out, out[-6000:]


@slow
@pytest.mark.timeout(TIMEOUT_S + 60)
def test_discovered_slot_joins_at_the_next_commit(tmp_path):
    hosts, script = discovery_script(tmp_path, "localhost:2")
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


@slow
@pytest.mark.timeout(TIMEOUT_S + 60)
def test_failure_in_a_commit_then_another():
    job = BackgroundJob(bfrun("-np", "4", "--min-np", "2", "-H", "localhost:4", PYTHON,
                              "tests/elastic/inplace_worker.py", "--steps", "30",
                              "--die", "3:10:commit", "--die", "1:17:step"))
    try:
        out = finish(job)
    finally:
        job.kill()
    assert job.proc.returncode == 0, out[-6000:]
    assert "DYING worker 3 at step 10 (commit)" in out and "DYING worker 1 at step 17" in out
    assert re.search(r"round 1: 3 worker\(s\) \['0', '1', '2'\]", out), out[-6000:]
    assert re.search(r"round 2: 2 worker\(s\) \['0', '2'\]", out), out[-6000:]
    pids = dict(re.findall(r"^\[(\d+)\] START worker \d+ pid (\d+)", out, re.M))
    done = re.findall(r"^\[(\d+)\] DONE worker \d+ rank \d size (\d) step (\d+) counter (\d+) "
                      r"pid (\d+)", out, re.M)
    assert sorted(d[0] for d in done) == ["0", "2"], out[-6000:]
    for w, size, step, counter, pid in done:
        assert (size, step, counter, pid) == ("2", "30", "30", pids[w]), (w, done)


@slow
@pytest.mark.timeout(TIMEOUT_S + 60)
def test_failure_while_the_state_goes_to_a_joining_worker(tmp_path):
    hosts, script = discovery_script(tmp_path, "localhost:2")
    steps = "600"  # 40 ms each: long enough for the newcomer to import TensorFlow and join
    job = BackgroundJob(bfrun("--min-np", "2", "--host-discovery-script", str(script), PYTHON,
                              "tests/elastic/inplace_worker.py", "--steps", steps,
                              "--step-ms", "40", "--die", "0:3:sync"))
    try:
        job.wait_for(r"^\[0\] STEP 5 size 2", TIMEOUT_S)
        hosts.write_text("localhost:3\n")
        out = finish(job)
    finally:
        job.kill()
    assert job.proc.returncode == 0, out[-6000:]
    assert "started worker 2 on localhost (new slot)" in out, out[-6000:]
    assert re.search(r"round 1: 3 worker\(s\) \['0', '1', '2'\] \(worker\(s\) \['2'\] joining\)",
                     out), out[-6000:]
    assert "DYING worker 0 in a sync at size 3" in out, out[-6000:]
    # It died inside the broadcasts that give the newcomer the state; the newcomer says so.
    assert re.search(r"^\[2\] bluefog elastic: worker 2 \(rank 2\): a rank was lost \(rank\(s\) "
                     r"0 left the job\)", out, re.M), out[-6000:]
    assert re.search(r"round 2: \d worker\(s\) \['1', '2'", out), out[-6000:]
    pids = dict(re.findall(r"^\[(\d+)\] START worker \d+ pid (\d+)", out, re.M))
    done = re.findall(r"^\[(\d+)\] DONE worker \d+ rank \d size (\d) step (\d+) counter (\d+) "
                      r"pid (\d+)", out, re.M)
    assert {"1", "2"} <= {d[0] for d in done}, out[-6000:]
    sizes = {d[1] for d in done}
    assert len(sizes) == 1 and int(sizes.pop()) == len(done), done
    for w, _, step, counter, pid in done:
        assert (step, counter, pid) == (steps, steps, pids[w]), (w, done)


def inplace_job(*options, steps="30", step_ms="30", die=(), extra=(), env=None):
    dies = [a for d in die for a in ("--die", d)]
    return BackgroundJob(bfrun(*options, PYTHON, "tests/elastic/inplace_worker.py", "--steps",
                               steps, "--step-ms", step_ms, *dies, *extra), env=env)


@pytest.mark.timeout(TIMEOUT_S + 60)
def test_a_hung_worker_is_lost_not_the_workers_that_wait_for_it():
    """Worker 2 is stopped (SIGSTOP): the others wait in their next collective, without an
    error. Its heartbeat stops, so 5 s later (half of BLUEFOG_GLOO_TIMEOUT 10 s) bfrun kills
    it, and the two others re-form the job and finish it."""
    job = inplace_job("-np", "3", "--min-np", "2", "-H", "localhost:3", steps="300",
                      step_ms="30", env={"BLUEFOG_GLOO_TIMEOUT": "10"})
    victim = None
    try:
        for w in ("0", "1", "2"):
            pid = int(job.wait_for(rf"^\[{w}\] START worker {w} pid (\d+)", 120).group(1))
        victim = pid
        job.wait_for(r"STEP 10 size 3", 60)
        os.kill(victim, signal.SIGSTOP)
        stopped = time.time()
        job.wait_for(r"round 1: ", 60)
        reformed = time.time() - stopped
        out = finish(job)
    finally:
        if victim is not None:
            try:
                os.kill(victim, signal.SIGKILL)
            except OSError:
                pass
        job.kill()
    assert job.proc.returncode == 0, out[-6000:]
    assert re.search(r"worker 2 \(rank 2 of round 0, on localhost\) has not been heard from "
                     r"for 5 s \(half of BLUEFOG_GLOO_TIMEOUT\): it is taken for hung and "
                     r"killed", out), out[-6000:]
    assert "killed by signal SIGKILL by bfrun: it hung" in out, out[-6000:]
    assert re.search(r"round 1: 2 worker\(s\) \['0', '1'\] \(lost worker\(s\) \['2'\]\)",
                     out), out[-6000:]
    done = re.findall(r"^\[(\d)\] DONE worker \d+ rank \d size (\d) step (\d+) counter (\d+)",
                      out, re.M)
    assert sorted(done) == [("0", "2", "300", "300"), ("1", "2", "300", "300")], out[-6000:]
    assert not re.search(r"bfrun: elastic: worker [01] \(", out), out[-6000:]
    assert reformed < 20, f"re-formed {reformed:.1f} s after the stop"


@pytest.mark.timeout(TIMEOUT_S + 60)
def test_a_worker_that_returns_early_ends_the_job():
    """Worker 1 trains 10 steps, the others 300 (uneven shards): once they find it gone, bfrun
    ends the job within seconds, naming the worker that returned, instead of leaving them to
    wait for a round for 600 s."""
    job = inplace_job("-np", "3", "--min-np", "2", "-H", "localhost:3", steps="300",
                      extra=("--steps-of", "1:10"))
    try:
        job.wait_for(r"^\[1\] DONE worker 1 ", 120)
        returned = time.time()
        out = finish(job, 60)
        ended = time.time() - returned
    finally:
        job.kill()
    assert job.proc.returncode == 1, out[-6000:]
    assert re.search(r"bfrun: elastic: job failed: worker 1 \(rank 1 of round 0\) returned from "
                     r"the training function while worker\(s\) \['0', '2'\] had not; a worker "
                     r"that returns ends the job\. Give every worker the same number of steps",
                     out), out[-6000:]
    assert ended < 20, f"the job ended {ended:.1f} s after worker 1 returned:\n{out[-6000:]}"
    assert "round 1" not in out and "blacklisted" not in out, out[-6000:]


@slow
@pytest.mark.timeout(TIMEOUT_S + 60)
def test_reset_limit_ends_the_job_at_the_next_reset():
    job = inplace_job("-np", "4", "--min-np", "2", "-H", "localhost:4", "--reset-limit", "1",
                      die=("3:10:step", "1:17:step"))
    try:
        out = finish(job)
    finally:
        job.kill()
    assert job.proc.returncode == 1, out[-6000:]
    assert re.search(r"round 1: 3 worker\(s\) \['0', '1', '2'\]", out), out[-6000:]
    assert re.search(r"giving up: --reset-limit 1 reached: the job re-formed 1 time\(s\) and "
                     r"would again \(lost worker\(s\) \['1'\]\)\. Lost: worker 3 on localhost "
                     r"\(killed by signal SIGKILL\); worker 1 on localhost", out), out[-6000:]
    assert "round 2" not in out and "DONE" not in out, out[-6000:]


@slow
@pytest.mark.timeout(TIMEOUT_S + 60)
def test_blacklisted_host_gets_workers_again_after_its_cooldown(tmp_path):
    _, script = discovery_script(tmp_path, "localhost:3")
    job = inplace_job("--min-np", "2", "--host-discovery-script", str(script),
                      "--blacklist-cooldown-range", "4", "4", steps="500", step_ms="40",
                      die=("2:20:step",))
    try:
        job.wait_for(r"started worker 3 on localhost \(new slot\)", TIMEOUT_S)
        started = time.time()
        out = finish(job)
    finally:
        job.kill()
    assert job.proc.returncode == 0, out[-6000:]
    assert "host localhost blacklisted for 4 s: no new worker starts there" in out, out[-6000:]
    # The lost slot is filled again only once the cooldown is over.
    lost = re.search(r"DYING worker 2 at step 20 \(step\) t=([\d.]+)", out)
    assert lost and started - float(lost.group(1)) >= 3.9, (started, out[-6000:])
    assert re.search(r"round 2: 3 worker\(s\) \['0', '1', '3'\] \(worker\(s\) \['3'\] joining\)",
                     out), out[-6000:]
    done = re.findall(r"^\[(\d+)\] DONE worker \d+ rank \d size (\d) step (\d+) counter (\d+)",
                      out, re.M)
    assert sorted(d[0] for d in done) == ["0", "1", "3"], out[-6000:]
    assert all(d[1:] == ("3", "500", "500") for d in done), done


@pytest.mark.timeout(TIMEOUT_S + 60)
def test_slow_discovery_script_does_not_delay_reforming(tmp_path):
    """The discovery script takes 60 s from its second run on: a worker lost meanwhile still
    gets the job re-formed at once (discovery runs beside the driver's loop)."""
    hosts, _ = discovery_script(tmp_path, "localhost:3")
    script = tmp_path / "slow_discover.sh"
    ran = tmp_path / "ran"
    script.write_text(f"#!/bin/sh\n[ -e {ran} ] && sleep 60\n: > {ran}\n"
                      f"while IFS= read -r line; do echo \"$line\"; done < {hosts}\n")
    script.chmod(0o755)
    job = inplace_job("--min-np", "2", "--host-discovery-script", str(script),
                      "--discovery-interval", "0.5", steps="400", step_ms="30",
                      die=("2:30:step",))
    try:
        job.wait_for(r"DYING worker 2 at step 30", TIMEOUT_S)
        died = time.time()
        job.wait_for(r"round 1: 2 worker\(s\)", TIMEOUT_S)
        reformed = time.time() - died
    finally:
        job.kill()
    assert reformed < 8, f"re-formed {reformed:.1f} s after the loss:\n{job.output[-6000:]}"
