"""Horovod's TF2 examples, ported line by line (examples/horovod/), launched as Horovod's docs
launch them: ``bfrun -np 2 -H localhost:2 python <example>`` (horovodrun's command line).

Short runs through the ports' own knobs (HVD_EXAMPLE_STEPS / HVD_EXAMPLE_EPOCHS, the
benchmark's flags); each must finish, learn (the loss falls) or report a throughput, and write
rank 0's checkpoint.
"""

import os
import re

import pytest

from mpi_jobs import PYTHON, REPO, bfrun_available, have_mpirun, run_job

pytestmark = [
    pytest.mark.skipif(not have_mpirun(), reason="mpirun not installed"),
    pytest.mark.skipif(not bfrun_available(), reason="bluefog/run/bfrun.py missing"),
]

TIMEOUT_S = 300
EXAMPLES = os.path.join(REPO, "examples", "horovod")
# One compute thread per rank: the two ranks share this machine's cores.
THREADS = {"TF_NUM_INTRAOP_THREADS": "1", "TF_NUM_INTEROP_THREADS": "2",
           "TF_CPP_MIN_LOG_LEVEL": "3"}


def run_example(tmp_path, script, args=(), env=None):
    cmd = [PYTHON, "-m", "bluefog.run", "-np", "2", "-H", "localhost:2", PYTHON,
           os.path.join(EXAMPLES, script), *args]
    result = run_job(cmd, timeout=TIMEOUT_S, env={**THREADS, **(env or {})}, cwd=str(tmp_path))
    assert not result.timed_out, f"{script} hung:\n{result.tail()}"
    assert result.returncode == 0, f"{script} failed:\n{result.tail()}"
    return result.output


@pytest.mark.nightly  # the Keras MNIST example runs in make test; this one's tape is tested apart
@pytest.mark.timeout(TIMEOUT_S + 60)
def test_tensorflow2_mnist_learns_and_checkpoints(tmp_path):
    # 22 steps over 2 ranks: 11 per rank, printed at steps 0 and 10.
    out = run_example(tmp_path, "tensorflow2_mnist.py", env={"HVD_EXAMPLE_STEPS": "22"})
    losses = [float(v) for v in re.findall(r"Step #\d+\tLoss: ([\d.]+)", out)]
    assert len(losses) == 2, out[-3000:]
    assert losses[1] < 0.8 * losses[0], f"the loss did not fall: {losses}"
    assert (tmp_path / "checkpoints-1.index").exists(), sorted(os.listdir(tmp_path))


@pytest.mark.timeout(TIMEOUT_S + 60)
def test_tensorflow2_keras_mnist_learns_warms_up_and_checkpoints(tmp_path):
    out = run_example(tmp_path, "tensorflow2_keras_mnist.py",
                      env={"HVD_EXAMPLE_STEPS": "8", "HVD_EXAMPLE_EPOCHS": "3"})
    # Keras' progress bar ends each epoch with the epoch's (rank-averaged) loss.
    epochs = re.split(r"Epoch \d+/3", out)[1:]
    assert len(epochs) == 3, out[-3000:]
    losses = [float(re.findall(r"loss: ([\d.]+)", e)[-1]) for e in epochs]
    assert losses[0] > losses[1] > losses[2], f"the loss did not fall: {losses}"
    assert "Epoch 3: finished gradual learning rate warmup to 0.002." in out, out[-3000:]
    saved = sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("checkpoint-"))
    assert saved == ["checkpoint-1.h5", "checkpoint-2.h5", "checkpoint-3.h5"], saved


@pytest.mark.timeout(TIMEOUT_S + 60)
def test_tensorflow2_synthetic_benchmark_reports_img_per_sec(tmp_path):
    out = run_example(tmp_path, "tensorflow2_synthetic_benchmark.py",
                      ["--fp16-allreduce", "--no-cuda", "--model", "MobileNet",
                       "--batch-size", "1", "--num-warmup-batches", "1",
                       "--num-batches-per-iter", "2", "--num-iters", "2"])
    # (mpirun may tag the newline of an unbuffered print apart from its text)
    assert "Model: MobileNet" in out and "Number of CPUs: 2" in out, out[-3000:]
    iters = [float(v) for v in re.findall(r"Iter #\d: ([\d.]+) img/sec per CPU", out)]
    assert len(iters) == 2 and min(iters) > 0, out[-3000:]
    total = re.search(r"Total img/sec on 2 CPU\(s\): ([\d.]+) \+-([\d.]+)", out)
    assert total and float(total.group(1)) > 0, out[-3000:]
