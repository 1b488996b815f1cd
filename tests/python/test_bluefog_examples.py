"""Bluefog's own examples ported to TensorFlow (examples/bluefog/), run at 4 ranks: their
printed results must be what Bluefog's examples promise.

- average consensus: every rank ends at the mean of the ranks' starting vectors (relative
  distance ``MSE at last iteration`` at rounding level), with neighbor_allreduce on a static
  and on the one-peer dynamic topology, on the weighted star, and with push-sum over windows
  (win_accumulate), whose push-sum weights must average 1;
- decentralized optimization: exact diffusion, gradient tracking and push-DIGing reach the
  solution of distributed gradient descent, where the global gradient is 0 and every rank's
  local gradient is not;
- MNIST (on the digits), with BLUEFOG_SLOW_EXAMPLES=1 only (``make test-bluefog-examples``;
  about 100 s more on a loaded machine): the window optimizer with Bluefog's per-step
  ``dst_weights`` and the neighbour optimizer with the one-peer knobs learn (test loss down
  every epoch, accuracy well above chance).

All run in one job (tests/python/bluefog_examples_driver.py) so TensorFlow and bluefog start
once; `pytest -s` prints each example's seconds.
"""

import os
import re

import pytest

from mpi_jobs import PYTHON, REPO, have_mpirun, job_env, mpirun_prefix, run_job

# One 4-rank job running every example (81 s on a 2-core machine): `make test-nightly`, and
# `make test-bluefog-examples` with the slow MNIST runs.
pytestmark = [pytest.mark.nightly,
              pytest.mark.skipif(not have_mpirun(), reason="mpirun not installed")]

TIMEOUT_S = 300
RANKS = 4
SECONDS = r"seconds: (\S+)"
RUNS = [
    "average_consensus.py --max-iters 50",
    "average_consensus.py --max-iters 50 --enable-dynamic-topology",
    "average_consensus.py --max-iters 100 --virtual-topology star",
    "average_consensus.py --max-iters 50 --asynchronous-mode",
    "optimization.py --method exact_diffusion --max-iter 200 --lr 1.0",
    "optimization.py --method gradient_tracking --max-iter 400 --lr 0.5",
    "optimization.py --method push_diging --max-iter 200 --lr 1.0",
]
MNIST = [
    "mnist.py --epochs 3 --batch-size 16 --lr 0.003 --log-interval 100",
    "mnist.py --epochs 3 --batch-size 16 --lr 0.003 --log-interval 100 --dist-optimizer win_put",
]
if os.environ.get("BLUEFOG_SLOW_EXAMPLES") == "1":
    RUNS = RUNS + MNIST


@pytest.fixture(scope="module")
def outputs(tmp_path_factory):
    """{run: that example's output, every rank's lines in rank order}."""
    out_dir = tmp_path_factory.mktemp("bluefog_examples")
    driver = os.path.join(REPO, "tests", "python", "bluefog_examples_driver.py")
    result = run_job(mpirun_prefix(RANKS) + [PYTHON, driver, str(out_dir)] + RUNS,
                     timeout=TIMEOUT_S, env=job_env({"TF_CPP_MIN_LOG_LEVEL": "3"}))
    assert not result.timed_out, f"the examples hung:\n{result.tail()}"
    assert result.returncode == 0, f"the examples failed:\n{result.tail()}"
    texts = {}
    for k, run in enumerate(RUNS):
        texts[run] = "\n".join((out_dir / f"{r}.{k}.txt").read_text() for r in range(RANKS))
        seconds = numbers(texts[run], SECONDS)
        print(f"{run}: {seconds} s per rank")
    return texts


def numbers(text, pattern):
    return [float(x) for x in re.findall(pattern, text)]


@pytest.mark.timeout(TIMEOUT_S + 60)
@pytest.mark.parametrize("run", [r for r in RUNS if r.startswith("average_consensus")])
def test_average_consensus_reaches_the_mean(outputs, run):
    out = outputs.get(run, "")
    mse = numbers(out, r"MSE at last iteration:\s+(\S+)")
    assert len(mse) == RANKS, out[-3000:]
    assert max(mse) < 1e-10, mse  # rounding level: ~1e-15 on the static graphs
    if "--asynchronous-mode" in run:
        p = numbers(out, r"Actuall value is\s+\[(\S+)\]")
        assert len(p) == 1 and abs(p[0] - 1.0) < 1e-12, out[-3000:]


@pytest.mark.timeout(TIMEOUT_S + 60)
@pytest.mark.parametrize("run", [r for r in RUNS if r.startswith("optimization")])
def test_decentralized_optimization_reaches_the_optimum(outputs, run):
    out = outputs.get(run, "")
    method = re.search(r"--method (\S+)", run).group(1)
    for who in ("DG", method):
        found = numbers(out, rf"\[{who}\] Rank \d+: global gradient norm: (\S+)")
        local = numbers(out, rf"\[{who}\] Rank \d+: local gradient norm: (\S+)")
        assert len(found) == RANKS and len(local) == RANKS, out[-3000:]
        # The global gradient vanishes at the solution; each rank's own does not.
        assert max(found) < 1e-6, (who, found)
        assert min(local) > 1e-3, (who, local)


@pytest.mark.timeout(TIMEOUT_S + 60)
@pytest.mark.skipif(os.environ.get("BLUEFOG_SLOW_EXAMPLES") != "1",
                    reason="slow: BLUEFOG_SLOW_EXAMPLES=1 (make test-bluefog-examples)")
@pytest.mark.parametrize("run", MNIST)
def test_mnist_learns_with_per_step_knobs(outputs, run):
    out = outputs.get(run, "")
    accuracy = numbers(out, r"Accuracy: ([\d.]+)%")
    loss = numbers(out, r"Test set: Average loss: ([\d.]+)")
    assert len(accuracy) == 3 and len(loss) == 3, out[-3000:]
    assert loss[0] > loss[1] > loss[2], loss
    assert accuracy[-1] > 60.0, accuracy  # chance: 10%
