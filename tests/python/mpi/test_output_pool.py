"""Large allreduce outputs from bluefog's pool (csrc/tensorflow/output_pool.cc), on every rank
under mpirun (tests/mpi_pytest.sh)."""

import resource

import numpy as np
import pytest
import tensorflow as tf

import bluefog.tensorflow as bf
from bluefog.common import basics


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
    # Warm-up: each process faults in the pages of an output block the first time it writes
    # there through its own mapping, and while the one-host paths are still being timed in
    # turns (a size class's first 48 calls: 16 on the shared path, then both paths in turns;
    # 3 calls per iteration here) some blocks are first written so late in that window
    # (docs/benchmarks.md). Steady state starts after it.
    for _ in range(17):
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


def test_eager_outputs_take_the_shared_path(rank, size, op_name):
    """On one host an eager allreduce's large output is a block of the shared heap on every
    rank, so each rank pushes its reduced part straight into its peers' outputs (the shared
    path); an output TensorFlow forwards from the input (a temporary in a tf.function) is not
    in the heap, and such a call takes another path. Exact either way."""
    x = tf.fill([(1 << 20) + 3], float(rank + 1))  # 4 MiB + 12 bytes: uneven segments
    want = size * (size + 1) / 2
    before = basics._tuning("shared_calls")
    for _ in range(3):
        assert np.all(bf.allreduce(x, average=False, name=op_name).numpy() == want)
    taken = basics._tuning("shared_calls") - before
    # On one host, on either backend (the one-host transport runs under both).
    if size > 1 and bf.local_size() == size:
        assert taken == 3, f"rank {rank}: {taken} of 3 eager allreduces took the shared path"
    else:
        assert taken == 0
    fn = tf.function(lambda t: bf.allreduce(t * 2.0, average=False, name=op_name + ".t"))
    before = basics._tuning("shared_calls")
    assert np.all(fn(x).numpy() == 2 * want)
    assert basics._tuning("shared_calls") == before
    # Switched off on one rank only: no rank takes it (each call's ranks agree on the path).
    basics._tune("shared", 0 if rank == size - 1 else 1)
    try:
        before = basics._tuning("shared_calls")
        assert np.all(bf.allreduce(x, average=False, name=op_name + ".off").numpy() == want)
        assert basics._tuning("shared_calls") == before
    finally:
        basics._tune("shared", 1)


def test_fused_allreduces_take_the_shared_path(rank, size, op_name):
    """Allreduces fused into one collective run on the executor's fusion buffer, a block of the
    shared heap on one host: in place on the shared path. Which requests fuse depends on when
    they reach the background thread, so this asserts only that some of 5 grouped calls of 8
    tensors did, and that every result is exact."""
    xs = [tf.fill([1 << 16], float(rank + k)) for k in range(8)]  # 256 KiB each
    fn = tf.function(lambda ts: bf.grouped_allreduce(ts, average=False, name=op_name))
    before = basics._tuning("shared_calls")
    for _ in range(5):
        out = fn(xs)
        for k, o in enumerate(out):
            assert np.all(o.numpy() == size * (size - 1) / 2 + size * k)
    taken = basics._tuning("shared_calls") - before
    if size > 1 and bf.local_size() == size:
        assert taken >= 1, f"rank {rank}: no fused allreduce of 5 x 8 tensors took the shared path"
    else:
        assert taken == 0


@pytest.mark.parametrize("average", [False, True])
def test_streamed_outputs_are_exact_whoever_streams(average, rank, size, op_name):
    """Large out-of-place outputs are written with streaming stores from
    BLUEFOG_STREAMING_STORES bytes (8 MiB); each rank decides alone, so ranks that disagree
    (here rank 0 streams every size, the others none, then the default everywhere) still get
    the exact sum or average, element by element, over uneven segments."""
    n = (2 << 20) + 5  # 8 MiB + 20 bytes
    x = tf.constant(np.arange(n, dtype=np.float32) % 251 + rank)
    want = size * (np.arange(n, dtype=np.float32) % 251) + size * (size - 1) / 2
    if average:
        want = want / size
    before = basics._tune("streaming_stores", 1 if rank == 0 else 0)
    assert before == 8 << 20
    try:
        for _ in range(3):
            got = bf.allreduce(x, average=average, name=op_name).numpy()
            np.testing.assert_array_equal(got, want.astype(np.float32))
    finally:
        assert basics._tune("streaming_stores", before) == (1 if rank == 0 else 0)
    for _ in range(3):
        got = bf.allreduce(x, average=average, name=op_name).numpy()
        np.testing.assert_array_equal(got, want.astype(np.float32))
    assert np.array_equal(x.numpy(), np.arange(n, dtype=np.float32) % 251 + rank)
