"""Horovod's elastic TF2 examples, ported line by line (examples/horovod/*_elastic.py), launched
as Horovod's elastic docs launch them, on bfrun's in-place elastic mode (Gloo):

* ``bfrun -np 2 --min-np 1 --max-np 3 --host-discovery-script ./discover_hosts.sh python
  tensorflow2_mnist_elastic.py`` with no mpirun on PATH (bfrun then picks the in-place Gloo
  mode by itself), a worker killed with SIGKILL mid-training: the job finishes on the other
  and rank 0 writes the checkpoint;
* the same example's ``bluefog.run(main, num_proc=, min_num_proc=, max_num_proc=, hosts=,
  use_gloo=True, verbose=2)`` branch;
* the Keras example (``KerasState`` and the three state callbacks) under ``bfrun --gloo``,
  and again with one of 3 workers killed with SIGKILL in its second epoch.

The first runs in `make test-nightly` (60-150 s on a 2-core machine; test_elastic_inplace covers
a SIGKILLed in-place worker in `make test`); the others under `make test-gloo`
(BLUEFOG_TEST_GLOO_ELASTIC=1: 50, 70 and 38 s).
"""

import os
import re
import signal
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from gloo_jobs import gloo_built  # noqa: E402
from mpi_jobs import PYTHON, REPO, BackgroundJob, descendants, discovery_script, run_job  # noqa: E402

pytestmark = pytest.mark.skipif(not gloo_built(), reason="bluefog was built without Gloo")

slow = pytest.mark.skipif(os.environ.get("BLUEFOG_TEST_GLOO_ELASTIC") != "1",
                          reason="slow: run by `make test-gloo` (BLUEFOG_TEST_GLOO_ELASTIC=1)")

TIMEOUT_S = 240
EXAMPLES = os.path.join(REPO, "examples", "horovod")
THREADS = {"TF_NUM_INTRAOP_THREADS": "1", "TF_NUM_INTEROP_THREADS": "2",
           "TF_CPP_MIN_LOG_LEVEL": "3"}


def path_without_mpirun(tmp_path):
    """A PATH holding only `python` (this Python): no mpirun."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    wrapper = bin_dir / "python"
    wrapper.write_text(f'#!/bin/sh\nexec {PYTHON} "$@"\n')
    wrapper.chmod(0o755)
    return str(bin_dir)


def worker_pid(job, wid):
    """The PID of elastic worker `wid` (BLUEFOG_ELASTIC_WORKER in its environment)."""
    want = f"BLUEFOG_ELASTIC_WORKER={wid}".encode()
    for pid in descendants(job.proc.pid):
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                if want in f.read().split(b"\0"):
                    return pid
        except OSError:
            continue
    raise AssertionError(f"no worker {wid} among bfrun's processes:\n{job.output[-3000:]}")


def finish(job, timeout=TIMEOUT_S):
    return job.finish(timeout)


def losses(out):
    return [float(v) for v in re.findall(r"Step #\d+\tLoss: ([\d.]+)", out)]


@pytest.mark.nightly
@pytest.mark.timeout(TIMEOUT_S + 60)
def test_mnist_elastic_horovod_command_line_survives_a_sigkill(tmp_path):
    _, script = discovery_script(tmp_path, "localhost:2")
    env = {**THREADS, "HVD_EXAMPLE_STEPS": "60", "PATH": path_without_mpirun(tmp_path)}
    job = BackgroundJob([PYTHON, "-m", "bluefog.run", "-np", "2", "--min-np", "1",
                         "--max-np", "3", "--host-discovery-script", str(script), "python",
                         os.path.join(EXAMPLES, "tensorflow2_mnist_elastic.py")],
                        env=env, cwd=str(tmp_path))
    try:
        job.wait_for(r"^\[0\] Step #10\t", TIMEOUT_S)
        os.kill(worker_pid(job, "1"), signal.SIGKILL)
        out = finish(job)
    finally:
        job.kill()
    assert "mpirun not found on PATH: running the job in place on Gloo" in out, out[-6000:]
    assert job.proc.returncode == 0, out[-6000:]
    assert re.search(r"worker 1 \(rank 1 of round 0, on localhost\) killed by signal SIGKILL",
                     out), out[-6000:]
    assert re.search(r"round 1: 1 worker\(s\) \['0'\] \(lost worker\(s\) \['1'\]\)", out), \
        out[-6000:]
    assert "re-forming the job in place" in out, out[-6000:]
    found = losses(out)
    assert len(found) >= 3 and found[-1] < found[0], found
    assert (tmp_path / "checkpoints-1.index").exists(), sorted(os.listdir(tmp_path))


@slow
@pytest.mark.timeout(TIMEOUT_S + 60)
def test_mnist_elastic_through_bluefog_run(tmp_path):
    # Horovod's horovod.run branch: python tensorflow2_mnist_elastic.py NP MIN MAX HOSTS. The
    # workers unpickle `main`, which imports local_mnist: it must be on their path.
    result = run_job([PYTHON, os.path.join(EXAMPLES, "tensorflow2_mnist_elastic.py"),
                      "2", "1", "3", "localhost:2"], timeout=TIMEOUT_S,
                     env={**THREADS, "HVD_EXAMPLE_STEPS": "22", "PYTHONPATH": EXAMPLES},
                     cwd=str(tmp_path))
    assert not result.timed_out, result.tail()
    assert result.returncode == 0, result.tail()
    assert "Running training through bluefog.run" in result.output, result.tail()
    assert re.search(r"round 0: 2 worker\(s\) \['0', '1'\] \(start\)", result.output), \
        result.tail()
    assert len(losses(result.output)) == 2, result.tail()
    assert (tmp_path / "checkpoints-1.index").exists(), sorted(os.listdir(tmp_path))


@slow
@pytest.mark.timeout(TIMEOUT_S + 60)
def test_keras_mnist_elastic_fits_with_the_state_callbacks(tmp_path):
    result = run_job([PYTHON, "-m", "bluefog.run", "--gloo", "-np", "2", "--min-np", "1",
                      "-H", "localhost:2", PYTHON,
                      os.path.join(EXAMPLES, "tensorflow2_keras_mnist_elastic.py")],
                     timeout=TIMEOUT_S, cwd=str(tmp_path),
                     env={**THREADS, "HVD_EXAMPLE_STEPS": "8", "HVD_EXAMPLE_EPOCHS": "3"})
    assert not result.timed_out, result.tail()
    assert result.returncode == 0, result.tail()
    assert "job done: 2 worker(s) finished" in result.output, result.tail()
    saved = sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("checkpoint-"))
    assert saved == ["checkpoint-1.keras", "checkpoint-2.keras", "checkpoint-3.keras"], saved


@slow
@pytest.mark.timeout(TIMEOUT_S + 60)
def test_keras_mnist_elastic_survives_a_sigkill(tmp_path):
    job = BackgroundJob([PYTHON, "-m", "bluefog.run", "--gloo", "-np", "3", "--min-np", "2",
                         "-H", "localhost:3", PYTHON,
                         os.path.join(EXAMPLES, "tensorflow2_keras_mnist_elastic.py")],
                        env={**THREADS, "HVD_EXAMPLE_STEPS": "30", "HVD_EXAMPLE_EPOCHS": "4"},
                        cwd=str(tmp_path))
    try:
        job.wait_for(r"^\[0\] Epoch 2/", TIMEOUT_S)
        os.kill(worker_pid(job, "2"), signal.SIGKILL)
        out = finish(job)
    finally:
        job.kill()
    assert job.proc.returncode == 0, out[-6000:]
    assert re.search(r"round 1: 2 worker\(s\) \['0', '1'\] \(lost worker\(s\) \['2'\]\)",
                     out), out[-6000:]
    assert "job done: 2 worker(s) finished" in out, out[-6000:]
    # The epochs left after the reset run from 0 (fit(epochs=total - state.epoch)); rank 0's
    # last checkpoint is that fit's last epoch.
    assert any(p.name.startswith("checkpoint-") for p in tmp_path.iterdir()), \
        sorted(os.listdir(tmp_path))
