"""bf.Compression.int8, .int4, .topk and .powersgd: compressed allreduces with error feedback.

Inputs are rank r's (r + 1) times a fixed pattern, so the mean is (n + 1) / 2 times it and each
block's quantization step is known in closed form. Every check also compares the result across
ranks (an allgather of it): all ranks must end with identical values.
"""

import numpy as np
import pytest
import tensorflow as tf

import bluefog.tensorflow as bf

from conftest import needs_ranks

BLOCK = 256


def pattern(count, seed=0):
    """Values of varied magnitude per block, the same on every rank."""
    i = np.arange(count, dtype=np.float64)
    return (np.sin(i * 0.37 + seed) * 10.0 ** ((i // BLOCK) % 3 - 1)).astype(np.float32)


def same_on_every_rank(value, name):
    rows = bf.allgather(tf.reshape(value, [1, -1]), name=name).numpy()
    for r in range(1, rows.shape[0]):
        np.testing.assert_array_equal(rows[r], rows[0], err_msg=f"rank {r} differs from rank 0")


def block_bound(base, size, levels):
    """Per element: the error bound of a mean of (r + 1) * base over ranks, quantized per
    rank and again after the sum (half a step each, steps from each block's largest value)."""
    amax = np.repeat([np.abs(base[i:i + BLOCK]).max() for i in range(0, base.size, BLOCK)],
                     BLOCK)[:base.size]
    mean = (size + 1) / 2
    return mean * amax / levels * 1.01 + 1e-6


@pytest.mark.parametrize("mode", ["eager", "function"])
@pytest.mark.parametrize("bits", [8, 4])
def test_quantized_mean_within_the_bound_and_identical(bits, mode, rank, size):
    compression = bf.Compression.int8() if bits == 8 else bf.Compression.int4()
    base = pattern(1000 + 3)  # not a multiple of the block, nor of the ranks

    def reduce(a, b):
        return bf.grouped_allreduce([a, b], name=f"ef.q{bits}.{mode}", compression=compression)

    if mode == "function":  # autograph off: converting bluefog's code costs seconds per rank
        reduce = tf.function(reduce, autograph=False)
    ints = tf.constant([rank, 7], tf.int32)  # an integer tensor passes uncompressed
    a = tf.constant(base * (rank + 1))
    out = bf.grouped_allreduce([a, ints], name=f"ef.q{bits}.{mode}.mixed",
                               compression=compression)
    np.testing.assert_array_equal(out[1].numpy(), [size * (size - 1) // 2 // size, 7])
    got_a, got_b = reduce(a, tf.constant(base[:10].reshape(2, 5) * (rank + 1)))
    levels = 127 if bits == 8 else 7
    err = np.abs(got_a.numpy() - base * (size + 1) / 2)
    assert np.all(err <= block_bound(base, size, levels)), err.max()
    assert got_b.shape == (2, 5)
    np.testing.assert_allclose(got_b.numpy().ravel(), base[:10] * (size + 1) / 2,
                               atol=float(block_bound(base[:10], size, levels).max()))
    same_on_every_rank(got_a, f"ef.q{bits}.{mode}.same")


def test_float64_and_sum_come_back_in_their_dtype(rank, size):
    base = pattern(300)
    got = bf.allreduce(tf.constant(base * (rank + 1), tf.float64), average=False,
                       name="ef.f64.sum", compression=bf.Compression.int8())
    assert got.dtype == tf.float64
    err = np.abs(got.numpy() - base * size * (size + 1) / 2)
    assert np.all(err <= size * block_bound(base, size, 127))
    # IndexedSlices are gathered uncompressed: exact.
    rows = tf.IndexedSlices(tf.constant([[0.1 * (rank + 1)] * 3]), tf.constant([rank % 2]),
                            tf.constant([2, 3]))
    dense = tf.convert_to_tensor(bf.allreduce(rows, name="ef.slices",
                                              compression=bf.Compression.int4()))
    want = np.zeros((2, 3))
    for r in range(size):
        want[r % 2] += 0.1 * (r + 1) / size
    np.testing.assert_allclose(dense.numpy(), want, rtol=1e-6)


def test_topk_all_values_and_powersgd_rank_one_are_exact(rank, size):
    base = pattern(500)
    got = bf.allreduce(tf.constant(base * (rank + 1)), name="ef.topk.all",
                       compression=bf.Compression.topk(1.0))
    np.testing.assert_allclose(got.numpy(), base * (size + 1) / 2, rtol=1e-5, atol=1e-6)
    u, v = np.arange(1, 13, dtype=np.float32), np.cos(np.arange(9, dtype=np.float32))
    matrix = np.outer(u, v) * (rank + 1)  # rank 1 on every rank: rank-1 PowerSGD is exact
    vec = np.arange(4, dtype=np.float32) * (rank + 1)  # a vector is sent uncompressed
    m, w = bf.grouped_allreduce([tf.constant(matrix), tf.constant(vec)], name="ef.psgd",
                                compression=bf.Compression.powersgd(rank=1))
    np.testing.assert_allclose(m.numpy(), np.outer(u, v) * (size + 1) / 2, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(w.numpy(), np.arange(4) * (size + 1) / 2, rtol=1e-6)
    same_on_every_rank(m, "ef.psgd.same")


@pytest.mark.parametrize("kind", ["int8", "int4", "topk"])
def test_error_feedback_conserves_the_sum_over_steps(kind, rank, size):
    # sum over steps of n * mean + what is still held back (every rank's residual, and for
    # int8/int4 the chunk owners' residuals of the requantized sums) == sum of every input.
    compression = {"int8": bf.Compression.int8(), "int4": bf.Compression.int4(),
                   "topk": bf.Compression.topk(0.05)}[kind]
    count, steps, name = 700, 4, f"ef.conserve.{kind}"
    step = tf.function(lambda x: bf.allreduce(x, name=name, compression=compression),
                       autograph=False)
    sent = np.zeros(count)
    inputs = np.zeros(count)
    for k in range(steps):
        x = pattern(count, seed=k) * (rank + 1)
        sent += step(tf.constant(x)).numpy().astype(np.float64) * size
        inputs += np.asarray([pattern(count, seed=k) * (r + 1) for r in range(size)],
                             np.float64).sum(axis=0)
    residuals = compression.residuals()
    held = bf.allreduce(tf.constant(residuals[f"{name}.0"]), average=False,
                        name=f"{name}.held").numpy()
    if kind != "topk":
        owners = bf.allgather(tf.constant(residuals[f"{name}.owner"]), name=f"{name}.owners")
        held = held + size * owners.numpy()[:count]
    scale = np.abs(inputs).max()
    np.testing.assert_allclose(sent + held, inputs, atol=1e-5 * scale * steps)
    assert np.abs(held).max() > 0  # something was held back: the test is not vacuous


def test_stats_count_fewer_bytes_than_float32(rank, size):
    bf.reset_compression_stats()
    compression = bf.Compression.int8()
    bf.allreduce(tf.constant(pattern(1 << 16) * (rank + 1)), name="ef.stats",
                 compression=compression)
    stats = bf.compression_stats()[compression.describe()]
    if size == 1:
        assert stats["sent_bytes"] == 0 and stats["ratio"] is None
    else:
        assert stats["uncompressed_bytes"] == 2 * (size - 1) * 4 * (1 << 16) // size
        assert 0.24 < stats["ratio"] < 0.27


def test_nan_on_one_rank_is_an_error_on_every_rank(rank, size):
    x = pattern(600) * (rank + 1)
    if rank == size - 1:
        x[300] = np.nan
    with pytest.raises(tf.errors.InvalidArgumentError, match="NaN or an infinity"):
        bf.allreduce(tf.constant(x), name="ef.nan", compression=bf.Compression.int8())


@needs_ranks(2)
def test_ranks_with_other_compressions_get_an_error(rank, size):
    mine = bf.Compression.int8() if rank == 0 else bf.Compression.int4()
    with pytest.raises(ValueError, match=r"rank 0 int8\(block=256\), rank 1 int4\(block=256\)"):
        bf.allreduce(tf.constant(pattern(64)), name="ef.disagree", compression=mine)
    other = bf.Compression.int8() if rank == 0 else bf.Compression.none
    with pytest.raises(tf.errors.FailedPreconditionError, match="same compression="):
        bf.allreduce(tf.constant(pattern(64)), name="ef.disagree.none", compression=other)
    # The runtime goes on.
    assert bf.allreduce(tf.constant([1.0]), name="ef.after").numpy()[0] == 1.0


@pytest.mark.parametrize("kind", ["none", "int8"])
def test_tape_with_int8_trains_a_tiny_model(kind, rank, size):
    # Linear regression towards known weights, each rank on its own slice of the data.
    rng = np.random.default_rng(rank)
    w_true = np.linspace(-1, 1, 16).astype(np.float32).reshape(16, 1)
    x = rng.normal(size=(64, 16)).astype(np.float32)
    y = x @ w_true
    w = tf.Variable(tf.zeros([16, 1]))
    b = tf.Variable(tf.zeros([1]))
    compression = bf.Compression.int8() if kind == "int8" else bf.Compression.none

    @tf.function(autograph=False)
    def step():
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean((tf.matmul(x, w) + b - y) ** 2)
        tape = bf.DistributedGradientTape(tape, compression=compression)
        grads = tape.gradient(loss, [w, b])
        for v, g in zip([w, b], grads):
            v.assign_sub(0.1 * g)
        return loss

    first = float(step())
    for _ in range(30):
        last = float(step())
    assert last < 1e-3 * first, (first, last)
    same_on_every_rank(w.read_value(), f"ef.tape.{kind}.same")
