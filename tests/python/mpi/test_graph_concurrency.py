"""Many independent collectives in one graph, started by TensorFlow in a different order per rank.

The ops are built in a rank-dependent order (natural, reversed, or shuffled with the rank as seed)
and run with inter-op parallelism, so each rank's runtime receives the requests in its own order
and in its own batches; matching by name must still pair them up, and every result must be right.
"""

import random

import numpy as np
import pytest
import tensorflow as tf

import bluefog.tensorflow as bf

from conftest import rank_values

NUM_OPS = 40
NUM_RUNS = 5

_DTYPES = [tf.float32, tf.int32, tf.float64, tf.int64, tf.float16]
_SHAPES = [[3], [2, 2], [], [5, 1], [0, 2], [7], [1, 2, 3]]


def _specs():
    """The collectives, identical on every rank: (kind, dtype, shape, root_rank or None)."""
    specs = []
    for i in range(NUM_OPS):
        kind = ("allreduce", "allreduce_avg", "allgather", "broadcast")[i % 4]
        dtype = _DTYPES[i % len(_DTYPES)]
        shape = _SHAPES[i % len(_SHAPES)]
        if kind == "allgather" and not shape:
            shape = [2]
        if kind == "allreduce_avg" and not dtype.is_floating:
            dtype = tf.float32
        specs.append((kind, dtype, shape, i % 3))
    return specs


def _input(i, spec, rank, step):
    kind, dtype, shape, _ = spec
    if kind == "allgather":
        shape = [rank % 3] + shape[1:]  # dimension 0 differs per rank, 0 on some ranks
    return rank_values(shape, rank, np.float64, offset=i + step).astype(dtype.as_numpy_dtype)


def _expected(i, spec, rank, size, step):
    kind, dtype, shape, root = spec
    if kind == "broadcast":
        return _input(i, spec, root % size, step).astype(np.float64)
    inputs = [_input(i, spec, r, step).astype(np.float64) for r in range(size)]
    if kind == "allgather":
        return np.concatenate(inputs)
    total = sum(inputs)
    return total / size if kind == "allreduce_avg" else total


def _build_order(rank, n=NUM_OPS):
    """A permutation of range(n): natural, reversed, or shuffled with the rank as seed."""
    order = list(range(n))
    if rank % 3 == 1:
        order.reverse()
    elif rank % 3 == 2:
        random.Random(rank).shuffle(order)
    return order


def _check(results, specs, rank, size, step):
    for i, (spec, result) in enumerate(zip(specs, results)):
        expected = _expected(i, spec, rank, size, step)
        dtype = spec[1]
        assert result.dtype == dtype.as_numpy_dtype, (i, spec, result.dtype)
        assert result.shape == expected.shape, (i, spec, result.shape, expected.shape)
        rtol = 1e-3 if dtype == tf.float16 else 1e-6
        np.testing.assert_allclose(result.astype(np.float64), expected, rtol=rtol,
                                   err_msg=f"op {i} {spec} step {step}")


def test_many_collectives_in_one_session_run(rank, size):
    specs = _specs()
    graph = tf.Graph()
    with graph.as_default():
        step = tf.compat.v1.placeholder(tf.int32, [], name="step")
        outputs = [None] * NUM_OPS
        for i in _build_order(rank):
            kind, dtype, shape, root = specs[i]
            # The input depends on the fed step, so every run sends new values.
            base = tf.constant(_input(i, specs[i], rank, 0))
            t = base + tf.cast(step, dtype)
            name = f"conc.graph.{i}"
            if kind == "allreduce":
                outputs[i] = bf.allreduce(t, average=False, name=name)
            elif kind == "allreduce_avg":
                outputs[i] = bf.allreduce(t, average=True, name=name)
            elif kind == "allgather":
                outputs[i] = bf.allgather(t, name=name)
            else:
                outputs[i] = bf.broadcast(t, root_rank=root % size, name=name)
    config = tf.compat.v1.ConfigProto(inter_op_parallelism_threads=4,
                                      intra_op_parallelism_threads=1)
    with tf.compat.v1.Session(graph=graph, config=config) as sess:
        for run in range(NUM_RUNS):
            results = sess.run(outputs, feed_dict={step: run})
            _check(results, specs, rank, size, run)


def test_many_collectives_in_one_function(rank, size):
    """The same in a tf.function, which also runs independent ops concurrently."""
    specs = _specs()
    order = _build_order(rank)

    @tf.function
    def fn(step):
        outputs = [None] * NUM_OPS
        for i in order:
            kind, dtype, shape, root = specs[i]
            t = tf.constant(_input(i, specs[i], rank, 0)) + tf.cast(step, dtype)
            name = f"conc.function.{i}"
            if kind == "allgather":
                outputs[i] = bf.allgather(t, name=name)
            elif kind == "broadcast":
                outputs[i] = bf.broadcast(t, root_rank=root % size, name=name)
            else:
                outputs[i] = bf.allreduce(t, average=kind == "allreduce_avg", name=name)
        return outputs

    for run in range(NUM_RUNS):
        results = [r.numpy() for r in fn(tf.constant(run))]
        _check(results, specs, rank, size, run)


def test_dependent_collectives_in_one_session_run(rank, size):
    """Chains of collectives (each feeding the next) next to independent ones, in one run."""
    graph = tf.Graph()
    with graph.as_default():
        x = tf.constant(rank_values([2], rank, np.float32))
        chains = []  # the same 8 chains on every rank, built in a rank-dependent order
        for c in _build_order(rank, 8):
            gathered = bf.allgather(x + c, name=f"conc.chain{c}.gather")  # [2 * size]
            summed = bf.allreduce(gathered, average=False, name=f"conc.chain{c}.sum")
            chains.append((c, bf.broadcast(summed * (rank + 1), root_rank=c % size,
                                           name=f"conc.chain{c}.bcast")))
    config = tf.compat.v1.ConfigProto(inter_op_parallelism_threads=4,
                                      intra_op_parallelism_threads=1)
    with tf.compat.v1.Session(graph=graph, config=config) as sess:
        results = sess.run([out for _, out in chains])
    gathered = np.concatenate([rank_values([2], r, np.float64) for r in range(size)])
    assert sorted(c for c, _ in chains) == list(range(8))
    for (c, _), result in zip(chains, results):
        expected = size * (gathered + c) * (c % size + 1)
        np.testing.assert_allclose(result, expected, rtol=1e-6, err_msg=f"chain {c}")


@pytest.mark.parametrize("repeat", range(3))
def test_eager_named_collectives_after_concurrent_runs(repeat, rank, size):
    """Eager collectives with reused names still work after the concurrent runs above."""
    out = bf.allreduce(tf.constant([float(rank)]), average=False, name="conc.after")
    np.testing.assert_allclose(out.numpy(), [size * (size - 1) / 2])
