"""bfrun's elastic driver on this machine (no root needed): plain pytest, each test starts an
elastic bfrun of tests/elastic/worker.py (a counter committed every few steps).

* below --min-np: a rank dies, its host is blacklisted, too few slots remain: the job ends
  with a non-zero status and a message naming the lost host and rank, in bounded time;
* growth: the discovery script goes from 1 slot to 2; the job stops at a commit, is relaunched
  on 2 ranks, and the new rank starts from the committed state (the counter comes out right
  on both ranks);
* --reset-limit 0: the same growth is refused with a clear error;
* --state-dir: a job that is lost as a whole resumes from its last commit when started again
  with the same folder;
* the driver's end: Ctrl-C stops the ranks and removes the temporary folder, a SIGKILLed
  driver takes mpirun and the ranks with it, a failing reset callback ends the job at once.
The multi-host cases (a lost host, a host that comes back) are in test_elastic_netns.py.
"""

import os
import re
import shutil
import signal
import subprocess
import time

import pytest

from mpi_jobs import (
    PYTHON,
    TAG,
    BackgroundJob,
    descendants,
    have_mpirun,
    job_env,
    kill_tree,
    run_job,
)

pytestmark = pytest.mark.skipif(not have_mpirun(), reason="mpirun not installed")

WORKER = "tests/elastic/worker.py"
TIMEOUT_S = 240
# A lost rank ends the launch through mpirun within seconds (tests/python/test_faults.py);
# the driver then gives up at once when too few slots remain.
BELOW_MIN_BOUND_S = 30.0
# docs/elastic.md: the ranks end within a few seconds of their driver's death.
DRIVER_GONE_BOUND_S = 10.0


def bfrun(*args):
    return [PYTHON, "-m", "bluefog.run", *args]


def done_lines(out):
    return [tuple(int(v) for v in m) for m in
            re.findall(r"DONE rank (\d+) size (\d+) step (\d+) counter (\d+)", out)]


@pytest.mark.timeout(TIMEOUT_S + 60)
def test_below_min_np_ends_the_job_naming_what_was_lost(tmp_path):
    result = run_job(bfrun("--min-np", "2", "-H", "localhost:2", "--state-dir",
                           str(tmp_path / "state"), PYTHON, WORKER, "--die-rank", "1",
                           "--die-at", "7"), timeout=TIMEOUT_S)
    out = result.output
    assert not result.timed_out, out[-4000:]
    assert result.returncode == 1, out[-4000:]
    died = float(re.search(r"DYING rank 1 at ([\d.]+)", out).group(1))
    assert re.search(r"giving up: 0 slot\(s\) left, below --min-np 2\. Lost: localhost \(rank 1 "
                     r"exited on signal 9\)", out), out[-4000:]
    # On one host that is the first lost rank: the way out is said.
    hint = re.search(r"^bfrun: elastic: localhost blacklisted for good after a failure.*$", out,
                     re.M)
    assert hint and "--blacklist-cooldown-range MIN MAX" in hint.group(0), out[-4000:]
    assert "run with --gloo" in hint.group(0), hint.group(0)
    assert "DONE" not in out
    assert f"run the job again with --state-dir {tmp_path / 'state'}" in out
    assert result.ended - died <= BELOW_MIN_BOUND_S, result.ended - died
    print(f"ended {result.ended - died:.1f} s after the rank died")


def grow(tmp_path, extra=(), worker_args=()):
    """Starts on 1 slot, switches the discovery script to 2 once the job is under way."""
    hostfile = tmp_path / "hosts.txt"
    hostfile.write_text("localhost:1\n")
    cmd = bfrun("--min-np", "1", "--host-discovery-script", f"cat {hostfile}", *extra,
                PYTHON, WORKER, "--steps", "40", *worker_args)
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=job_env(), errors="replace")
    lines = []
    deadline = time.time() + TIMEOUT_S
    try:
        for line in proc.stdout:
            lines.append(line)
            if re.match(TAG + "STEP launch 0 step 3 ", line):
                hostfile.write_text("localhost:2\n")
            if time.time() > deadline:
                raise AssertionError("the job did not end in time:\n" + "".join(lines)[-4000:])
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            kill_tree(proc)
    return proc.returncode, "".join(lines)


@pytest.mark.timeout(TIMEOUT_S + 60)
def test_a_discovered_slot_joins_at_the_next_commit_with_the_state(tmp_path):
    rc, out = grow(tmp_path)
    assert rc == 0, out[-4000:]
    assert "hosts changed to localhost:2" in out, out[-4000:]
    assert re.search(r"launch 1: 2 rank\(s\) on localhost:2", out), out[-4000:]
    reset = re.search(r"RESET launch 1 size 2 step (\d+)", out)
    assert reset and int(reset.group(1)) % 5 == 0 and int(reset.group(1)) > 0, out[-4000:]
    # Both ranks, the new one included, end with the counter of the whole run.
    assert sorted(done_lines(out)) == [(0, 2, 40, 40), (1, 2, 40, 40)], out[-4000:]
    folder = re.search(r"state of the commits under (\S+) on each host", out).group(1)
    assert not os.path.exists(folder), "the temporary commit folder was left behind"


@pytest.mark.timeout(TIMEOUT_S + 60)
def test_reset_limit_stops_the_job(tmp_path):
    rc, out = grow(tmp_path, ["--reset-limit", "0", "--state-dir", str(tmp_path / "state")])
    assert rc == 1, out[-4000:]
    assert "giving up: --reset-limit 0 reached" in out, out[-4000:]


@pytest.mark.timeout(2 * TIMEOUT_S + 60)
def test_state_dir_resumes_a_job_started_again(tmp_path):
    folder = tmp_path / "state"
    args = ["--min-np", "1", "-H", "localhost:2", "--reset-limit", "0",
            "--state-dir", str(folder)]
    first = run_job(bfrun(*args, PYTHON, WORKER, "--steps", "30", "--stop-at", "12"),
                    timeout=TIMEOUT_S)
    assert first.returncode == 1 and "giving up: --reset-limit 0 reached" in first.output, \
        first.output[-4000:]
    assert list(folder.glob("commit-*.pkl")), "no commit file was kept"
    second = run_job(bfrun(*args, PYTHON, WORKER, "--steps", "30"), timeout=TIMEOUT_S)
    out = second.output
    assert second.returncode == 0, out[-4000:]
    assert re.search(r"RESET launch 0 size 2 step 10\b", out), out[-4000:]
    assert "STEP launch 0 step 11 " in out and "STEP launch 0 step 10 " not in out
    assert sorted(done_lines(out)) == [(0, 2, 30, 30), (1, 2, 30, 30)], out[-4000:]
    assert list(folder.glob("commit-*.pkl")), "--state-dir must keep the commit after success"


@pytest.mark.timeout(120)
def test_a_bad_discovery_script_is_reported_and_the_wait_is_bounded(tmp_path):
    script = tmp_path / "hosts.sh"
    script.write_text("#!/bin/sh\necho 'not a host'\n")
    script.chmod(0o755)
    result = run_job(bfrun("--min-np", "1", "--elastic-timeout", "3", "--host-discovery-script",
                           str(script), PYTHON, WORKER), timeout=60)
    out = result.output
    assert result.returncode == 1 and not result.timed_out, out
    assert out.count("discovery script line 1: 'not a host' is not 'host' or 'host:slots'") == 1
    assert "giving up: 0 slot(s) left, below --min-np 1" in out
    assert result.wall < 30


def job_tree(job):
    """mpirun and the ranks under the driver, once every rank runs."""
    job.wait_for(r"^" + TAG + r"STEP launch 0 step 6 ", TIMEOUT_S)  # after the first commit
    tree = descendants(job.proc.pid)
    argvs = {p: open(f"/proc/{p}/cmdline").read().split("\0") for p in tree}
    ranks = [p for p, argv in argvs.items() if argv[:2] == [PYTHON, WORKER]]
    assert len(ranks) == 2, (tree, job.output[-4000:])
    return tree


@pytest.mark.timeout(TIMEOUT_S + 60)
def test_a_killed_driver_takes_mpirun_and_the_ranks_with_it():
    job = BackgroundJob(bfrun("--min-np", "1", "-H", "localhost:2", PYTHON, WORKER,
                              "--steps", "100000", "--quiet-after", "6"))
    tree = []
    try:
        tree = job_tree(job)
        os.kill(job.proc.pid, signal.SIGKILL)
        left = job.wait_gone(tree, DRIVER_GONE_BOUND_S)
        assert not left, f"still running {DRIVER_GONE_BOUND_S} s after the driver died: {left}"
    finally:
        job.kill(tree)
        # A killed driver cannot remove its temporary commit folder; the test does.
        found = re.search(r"state of the commits under (\S+) on each host", job.output)
        if found:
            shutil.rmtree(found.group(1), ignore_errors=True)


@pytest.mark.timeout(TIMEOUT_S + 60)
@pytest.mark.parametrize("presses", [1, 2])
def test_ctrl_c_says_what_it_does_stops_the_ranks_and_removes_the_folder(presses):
    job = BackgroundJob(bfrun("--min-np", "1", "-H", "localhost:2", PYTHON, WORKER,
                              "--steps", "100000", "--quiet-after", "6"))
    tree = []
    try:
        tree = job_tree(job)
        folder = re.search(r"state of the commits under (\S+) on each host", job.output).group(1)
        assert os.path.isdir(folder)
        for press in range(presses):
            if press:
                time.sleep(0.2)  # signals at once would reach Python's handler as one
            os.killpg(job.proc.pid, signal.SIGINT)  # what a terminal does on Ctrl-C
        job.proc.wait(timeout=DRIVER_GONE_BOUND_S + 30)
        job.reader.join(timeout=10)
        out = job.output
        assert job.proc.returncode == 130, out[-4000:]
        assert "interrupted: stopping the ranks" in out, out[-4000:]
        # A second Ctrl-C does not wait for mpirun: what runs on this host is killed.
        assert ("killing mpirun and the ranks" in out) == (presses == 2), out[-4000:]
        assert not job.wait_gone(tree, DRIVER_GONE_BOUND_S), out[-4000:]
        assert not os.path.exists(folder), "the temporary commit folder was left behind"
        assert "removed " + folder in out, out[-4000:]
    finally:
        job.kill(tree)


@pytest.mark.nightly  # an error path of the reset callbacks the other elastic tests run
@pytest.mark.timeout(TIMEOUT_S + 60)
def test_a_failing_reset_callback_ends_the_job_with_its_traceback(tmp_path):
    rc, out = grow(tmp_path, ["--state-dir", str(tmp_path / "state")], ["--bad-reset"])
    assert rc == 1, out[-4000:]
    assert "ZeroDivisionError" in out and "in <lambda>" in out, out[-4000:]
    assert re.search(r"giving up: a reset callback raised on rank\(s\) \[0, 1\]", out), \
        out[-4000:]
    assert "blacklisted" not in out and "slot(s) available, waiting" not in out, out[-4000:]


@pytest.mark.timeout(120)
def test_a_slow_discovery_script_does_not_hold_back_the_relaunch(tmp_path):
    """The discovery script takes 20 s from its second run on; the first launch's rank stops
    for a relaunch (status 75) meanwhile: the driver notices at once and relaunches on the
    hosts it knows, instead of waiting for the script twice (discovery runs on a thread)."""
    script = tmp_path / "slow_hosts.sh"
    ran = tmp_path / "ran"
    script.write_text(f"#!/bin/sh\n[ -e {ran} ] && sleep 20\n: > {ran}\necho localhost:1\n")
    script.chmod(0o755)
    rank = ('if [ "$BLUEFOG_ELASTIC_RESTART" = 0 ]; then sleep 2; echo "STOPPING t=$(date '
            '+%s.%N)"; exit 75; fi; echo "SECOND LAUNCH"')
    result = run_job(bfrun("--min-np", "1", "--host-discovery-script", str(script),
                           "--discovery-interval", "0.2", "sh", "-c", rank), timeout=100)
    out = result.output
    assert result.returncode == 0 and not result.timed_out, out[-4000:]
    stopped = float(re.search(r"STOPPING t=([\d.]+)", out).group(1))
    relaunched = float(re.search(r"launch 1: 1 rank\(s\) on localhost:1 at ([\d.]+)", out)
                       .group(1))
    assert "SECOND LAUNCH" in out, out[-4000:]
    assert relaunched - stopped < 8, f"relaunched {relaunched - stopped:.1f} s after:\n{out}"
