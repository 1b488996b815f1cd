"""Large allreduce outputs from bluefog's pool (csrc/tensorflow/output_pool.cc), on every rank
under mpirun (tests/mpi_pytest.sh)."""

import resource

import numpy as np
import pytest
import tensorflow as tf

import bluefog.tensorflow as bf


@pytest.fixture
def op_name(request):
    """A request name unique to this test and parameter set, identical on every rank."""
    return "pool." + request.node.name


@pytest.mark.parametrize("mode", ["eager", "function"])
def test_large_allreduce_outputs_reuse_touched_memory(mode, rank, size, op_name):
    """A large output TensorFlow cannot take from the input comes from bluefog's pool: in
    steady state no call maps fresh pages (TensorFlow's allocator maps a 64 MiB output afresh
    on every call, 16384 page faults), results exact, grouped outputs too."""
    x = tf.fill([16 << 20], float(rank + 1))  # 64 MiB, kept by the caller (not forwarded)

    def fn(t):
        return bf.allreduce(t, average=False, name=op_name)

    def grouped(t):
        return bf.grouped_allreduce([t, t], average=False, name=op_name + ".g")

    if mode == "function":
        fn, grouped = tf.function(fn), tf.function(grouped)
    for _ in range(3):
        fn(x)
        grouped(x)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(5):
        fn(x)
        grouped(x)
    faults = (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 5
    assert faults < 1000, f"rank {rank}: {faults} page faults per call"
    want = size * (size + 1) / 2
    assert np.all(fn(x).numpy() == want)
    assert all(np.all(g.numpy() == want) for g in grouped(x))
