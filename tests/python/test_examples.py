"""The examples, run as the README and docs/quickstart.md show them: bfrun -np 2, short settings.

They are what a new user copies first, so each must still run and reach its documented
result: the digits models learn (test accuracy well above chance) and stay identical across
ranks, and the synthetic benchmark reports a throughput with and without compression. The
second variant of an example (another schedule, optimizer or compression) and the digits
examples other than Keras' (their APIs have suites of their own) run in `make test-nightly`.
"""

import re

import pytest

from mpi_jobs import PYTHON, bfrun_available, have_mpirun, mpirun_prefix, run_job

pytestmark = [
    pytest.mark.skipif(not have_mpirun(), reason="mpirun not installed"),
    pytest.mark.skipif(not bfrun_available(), reason="bluefog/run/bfrun.py missing"),
]

TIMEOUT_S = 300


def run_example(args):
    result = run_job(mpirun_prefix(2, launcher="bfrun") + [PYTHON] + args, timeout=TIMEOUT_S,
                     env={"TF_CPP_MIN_LOG_LEVEL": "3"})
    assert not result.timed_out, f"{args[0]} hung:\n{result.tail()}"
    assert result.returncode == 0, f"{args[0]} failed:\n{result.tail()}"
    return result.output


def accuracy(output, pattern):
    found = re.search(pattern, output)
    assert found, output[-3000:]
    return float(found.group(1))


@pytest.mark.timeout(TIMEOUT_S + 60)
def test_collectives_demo():
    out = run_example(["examples/collectives_demo.py"])
    assert len(re.findall(r"rank \d/2: sum", out)) == 2, out[-3000:]


@pytest.mark.timeout(TIMEOUT_S + 60)
@pytest.mark.parametrize("script", ["keras_digits.py"] + [
    pytest.param(s, marks=pytest.mark.nightly)
    for s in ("tape_digits.py", "elastic_digits.py", "diloco_digits.py")])
def test_digits_examples_learn_and_stay_in_agreement(script):
    out = run_example([f"examples/{script}", "--epochs", "3"])
    assert "weights identical on all ranks" in out, out[-3000:]
    assert accuracy(out, r"test accuracy=([\d.]+)") > 0.85


@pytest.mark.timeout(TIMEOUT_S + 60)
@pytest.mark.parametrize("flags", [[], pytest.param(
    ["--schedule", "one_peer", "--topology", "exponential"], marks=pytest.mark.nightly)])
def test_decentralized_example_learns(flags):
    out = run_example(["examples/decentralized_digits.py", "--epochs", "5"] + flags)
    assert accuracy(out, r"test accuracy rank 0: ([\d.]+)") > 0.85


@pytest.mark.timeout(TIMEOUT_S + 60)
@pytest.mark.parametrize("optimizer", [pytest.param("winput", marks=pytest.mark.nightly),
                                       "pushsum"])
def test_async_example_learns_with_a_straggler(optimizer):
    out = run_example(["examples/async_digits.py", "--optimizer", optimizer, "--epochs", "5",
                       "--straggler-ms", "2"])
    assert accuracy(out, r"test accuracy rank 0: ([\d.]+)") > 0.85


@pytest.mark.timeout(TIMEOUT_S + 60)
@pytest.mark.parametrize("compression", ["none", pytest.param("bf16", marks=pytest.mark.nightly)])
def test_synthetic_benchmark_reports_throughput(compression):
    out = run_example(["examples/synthetic_benchmark.py", "--num-iters", "2",
                       "--num-batches-per-iter", "3", "--compression", compression])
    assert f"compression {compression}" in out
    assert accuracy(out, r"total img/sec on 2 rank\(s\): ([\d.]+)") > 0
