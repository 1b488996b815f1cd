"""A stranger's flood against every listener of a running job (tests/flood/stranger_flood.py:
garbage, idle, slow-drip and wrong-token connections), plain pytest, local processes.

* A 3-rank ``bfrun --gloo`` job: its one listener is rank 0's rendezvous server (C++). The ranks
  allreduce through the flood, checking every sum; afterwards a process set forms (new Gloo
  connections through the flooded store).
* A 2-rank ``bluefog.run`` job whose rank 0 has 48 descriptors to spare: 1,100 garbage and
  200 idle connections from rank 1 leave it able to form a process set.
* An in-place elastic job (``bfrun --gloo --min-np 2``): its one listener is the store bfrun
  serves (Python). A worker killed after the flood still re-forms the job; the survivors'
  committed counters equal their steps.

For each listener, its process's descriptors and threads return to within 5 of their count
before the flood, and no wrong-token connection is let in. The number of connections is
BLUEFOG_FLOOD_COUNT (400 here; ``make flood`` runs 10,000 and prints the counts). The two job
floods are marked nightly (``make test-nightly``); ``make test`` runs the descriptor-limit one.
"""

import json
import os
import re
import signal
import sys
import time
from dataclasses import asdict

import cloudpickle
import pytest

import bluefog

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "flood"))

from stranger_flood import flood  # noqa: E402

from gloo_jobs import free_port, gloo_built  # noqa: E402
from mpi_jobs import PYTHON, BackgroundJob, job_env  # noqa: E402

pytestmark = pytest.mark.skipif(not gloo_built(), reason="bluefog was built without Gloo")

COUNT = int(os.environ.get("BLUEFOG_FLOOD_COUNT", "400"))
# Long enough for 10,000 connections on a busy two-core machine.
TIMEOUT_S = 180 + COUNT // 40
pytestmark = [pytestmark, pytest.mark.timeout(TIMEOUT_S + 60)]  # the job's timeout first


# The functions below travel to the ranks by value (this file is not importable there).
cloudpickle.register_pickle_by_value(sys.modules[__name__])


def _check(name, report):
    print(f"\n{name}: {json.dumps(asdict(report))}")
    fds, threads = report.fds, report.threads
    assert report.accepted_token == 0, report
    assert report.refused_token >= report.kinds["wrong-token"] - report.connect_failed, report
    assert fds[2] <= fds[0] + 5 and threads[2] <= threads[0] + 5, report


@pytest.mark.nightly
@pytest.mark.timeout(TIMEOUT_S + 60)
def test_flood_against_rank0s_store_during_a_gloo_job(tmp_path):
    stop = tmp_path / "stop"
    job = BackgroundJob([PYTHON, "-m", "bluefog.run", "--gloo", "-np", "3", PYTHON,
                         "tests/flood/gloo_job.py", str(stop)])
    try:
        ready = job.wait_for(r"^\[0\]<stdout>:READY (\d+) (\S+) (\d+)", 120)
        pid, addr, port = int(ready.group(1)), ready.group(2), int(ready.group(3))
        report = flood(addr, port, COUNT, pid=pid)
        stop.write_text("")
        out = job.finish(TIMEOUT_S)
    finally:
        job.kill()
    assert job.proc.returncode == 0, out[-6000:]
    done = re.findall(r"^\[(\d)\]<stdout>:DONE rank \d steps (\d+) process-set (\d+)", out, re.M)
    assert sorted(r for r, _, _ in done) == ["0", "1", "2"], out[-6000:]
    assert {s for _, _, s in done} == {"4"}, done
    assert "WRONG" not in out
    _check("rank 0's rendezvous server", report)


@pytest.mark.nightly
@pytest.mark.timeout(TIMEOUT_S + 60)
def test_flood_against_the_elastic_store_then_a_lost_worker_reforms(tmp_path):
    stop = tmp_path / "stop"
    port = free_port()
    job = BackgroundJob([PYTHON, "-m", "bluefog.run", "--gloo", "-np", "3", "--min-np", "2",
                         "-H", "localhost:3", "--gloo-port", str(port), PYTHON,
                         "tests/flood/elastic_job.py", str(stop)])
    try:
        pids = {w: int(job.wait_for(rf"^\[{w}\] START worker {w} pid (\d+)", 120).group(1))
                for w in ("0", "1", "2")}
        job.wait_for(r"STEP 10 size 3", 60)
        report = flood("127.0.0.1", port, COUNT, pid=job.proc.pid)
        os.kill(pids["2"], signal.SIGKILL)
        job.wait_for(r"round 1: 2 worker\(s\) \['0', '1'\]", 60)
        job.wait_for(r"STEP \d+ size 2", 60)
        time.sleep(0.5)
        stop.write_text("")
        out = job.finish(TIMEOUT_S)
    finally:
        job.kill()
    assert job.proc.returncode == 0, out[-6000:]
    done = re.findall(r"^\[(\d)\] DONE worker \d rank \d size (\d) step (\d+) counter (\d+)",
                      out, re.M)
    assert sorted(w for w, _, _, _ in done) == ["0", "1"], out[-6000:]
    assert all(size == "2" and step == counter for _, size, step, counter in done), done
    assert len({step for _, _, step, _ in done}) == 1, done
    assert "WRONG" not in out
    _check("the elastic job's store (bfrun)", report)


def _flood_then_process_set():
    """Rank 0 runs with 48 descriptors to spare. Rank 1 sends its rendezvous server 1,100
    garbage connections, then holds 200 idle ones and closes them: rank 0's descriptors and
    threads come back to what they were, and a process set (new Gloo connections on every rank)
    still forms after the flood."""
    import os
    import resource
    import socket
    import time

    import tensorflow as tf

    import bluefog.tensorflow as bf

    def counts(pid):
        return len(os.listdir(f"/proc/{pid}/fd")), len(os.listdir(f"/proc/{pid}/task"))

    bf.init()
    rank = bf.rank()
    pid0 = int(bf.allreduce(tf.constant([os.getpid() if rank == 0 else 0], tf.int64),
                            average=False).numpy()[0])
    if rank == 0:
        hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
        resource.setrlimit(resource.RLIMIT_NOFILE, (counts(pid0)[0] + 48, hard))
    bf.allreduce(tf.constant([0.0]))  # the limit is in place
    report = None
    if rank == 1:
        addr = (os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]))
        before = counts(pid0)
        failed = 0
        for _ in range(1100):
            try:
                with socket.create_connection(addr, timeout=2) as s:
                    s.sendall(b"GET / HTTP/1.1\r\n\r\n")
            except OSError:
                failed += 1
                if failed == 5:  # the server stopped accepting: no use waiting for each
                    break
        idle = []
        for _ in range(200 if failed < 5 else 0):
            try:
                idle.append(socket.create_connection(addr, timeout=2))
            except OSError:
                failed += 1
        for s in idle:
            s.close()
        deadline = time.time() + 20
        while time.time() < deadline:
            after = counts(pid0)
            if after[0] <= before[0] + 5 and after[1] <= before[1] + 5:
                break
            time.sleep(0.1)
        report = (before, after, failed)
    bf.allreduce(tf.constant([0.0]))  # the flood is over
    ps = bf.add_process_set([0, 1])
    x = bf.allreduce(tf.constant([float(rank + 1)]), average=False, process_set=ps)
    return float(x.numpy()[0]), report


def test_rendezvous_server_survives_a_flood_at_its_descriptor_limit():
    env = job_env({"BLUEFOG_GLOO_TIMEOUT": "60", "TF_NUM_INTRAOP_THREADS": "1",
                   "TF_NUM_INTEROP_THREADS": "1"})
    env = {k: v for k, v in env.items() if not k.startswith(("OMPI_", "PMIX_", "PMI_"))}
    results = bluefog.run(_flood_then_process_set, np=2, env=env, timeout=TIMEOUT_S)
    assert [r[0] for r in results] == [3.0, 3.0], results
    (fds, threads), (fds_after, threads_after), failed = results[1][1]
    assert fds_after <= fds + 5 and threads_after <= threads + 5, results[1][1]
    assert failed == 0, results[1][1]
