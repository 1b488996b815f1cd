"""op=bf.Adasum: allreduce, grouped_allreduce, the tape and DistributedOptimizer against a numpy
model of the same recursion (pairwise at distance 1, 2, 4, ..., per tensor, the lower rank's
tensor first), and its errors. Power-of-two jobs check results; a 3-rank job checks the error.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

import bluefog.tensorflow as bf

from conftest import needs_ranks

POW2 = bf.size() & (bf.size() - 1) == 0
pow2_only = pytest.mark.skipif(not POW2, reason="Adasum needs a power-of-two rank count")
SHAPES = [(5,), (3, 4), (), (2, 1, 3)]


def np_combine(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    dot, an, bn = float((a64 * b64).sum()), float((a64 * a64).sum()), float((b64 * b64).sum())
    ac = 1.0 - dot / (2 * an) if an >= 1e-8 else 1.0
    bc = 1.0 - dot / (2 * bn) if bn >= 1e-8 else 1.0
    return ac * a64 + bc * b64


def np_adasum(per_rank: list) -> list:
    """per_rank[r] is rank r's list of arrays; returns every rank's result (all equal)."""
    n, cur, d = len(per_rank), [list(v) for v in per_rank], 1
    while d < n:
        cur = [[np_combine(x, y) for x, y in zip(cur[min(r, r ^ d)], cur[max(r, r ^ d)])]
               for r in range(n)]
        d *= 2
    return cur


def rank_arrays(r: int, dtype=np.float32) -> list:
    rng = np.random.default_rng(1000 + r)
    return [rng.normal(size=s).astype(dtype) for s in SHAPES]


def expected(dtype=np.float32) -> list:
    return np_adasum([rank_arrays(r, dtype) for r in range(bf.size())])[bf.rank()]


@pow2_only
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_grouped_allreduce_adasum_matches_numpy(dtype):
    mine = [tf.constant(a) for a in rank_arrays(bf.rank(), dtype)]
    out = bf.grouped_allreduce(mine, op=bf.Adasum, name=f"adasum.grouped.{dtype.__name__}")
    tol = 1e-5 if dtype == np.float32 else 1e-12
    for got, want in zip(out, expected(dtype)):
        assert got.dtype == tf.as_dtype(dtype) and got.shape == want.shape
        np.testing.assert_allclose(got.numpy(), want, rtol=tol, atol=tol)


@pow2_only
def test_allreduce_adasum_per_tensor_and_in_tf_function():
    want = expected()

    @tf.function
    def f(x):
        return bf.allreduce(x, op=bf.Adasum, name="adasum.single")

    for j, a in enumerate(rank_arrays(bf.rank())):
        got = bf.allreduce(tf.constant(a), op=bf.Adasum, name=f"adasum.eager.{j}")
        np.testing.assert_allclose(got.numpy(), want[j], rtol=1e-5, atol=1e-5)
    got = f(tf.constant(rank_arrays(bf.rank())[1]))
    np.testing.assert_allclose(got.numpy(), want[1], rtol=1e-5, atol=1e-5)


@pow2_only
def test_adasum_closed_forms():
    n, r = bf.size(), bf.rank()
    # Orthogonal tensors are summed; equal tensors come back unchanged (not multiplied by n).
    basis = np.zeros(max(n, 2), np.float64)
    basis[r] = r + 1.0
    got = bf.allreduce(tf.constant(basis), op=bf.Adasum, name="adasum.orthogonal").numpy()
    want = np.zeros_like(basis)
    want[:n] = np.arange(1, n + 1)
    np.testing.assert_allclose(got, want, rtol=1e-12)
    same = np.array([3.0, -4.0, 12.0])
    got = bf.allreduce(tf.constant(same), op=bf.Adasum, name="adasum.equal").numpy()
    np.testing.assert_allclose(got, same, rtol=1e-12)
    # A zero tensor (below the norm guard) leaves the other one's coefficient at 1.
    z = np.ones(4) * (r % 2)
    got = bf.allreduce(tf.constant(z), op=bf.Adasum, name="adasum.zero").numpy()
    np.testing.assert_allclose(got, np.ones(4) if n > 1 else z, rtol=1e-12)


@pow2_only
def test_tape_and_optimizer_with_adasum():
    x = tf.constant(rank_arrays(bf.rank())[1])  # (3, 4), different on every rank
    w0 = np.arange(4, dtype=np.float32).reshape(4, 1) / 10
    # loss = sum(x @ w)^2 / 2 -> gradient x^T (x w) summed; computed per rank in numpy
    grads = []
    for q in range(bf.size()):
        xq = rank_arrays(q)[1].astype(np.float64)
        grads.append([xq.T @ (xq @ w0.astype(np.float64))])
    want = np_adasum(grads)[bf.rank()][0]

    w = tf.Variable(w0)
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(tf.square(x @ w)) / 2
    g = bf.DistributedGradientTape(tape, op=bf.Adasum).gradient(loss, [w])[0]
    np.testing.assert_allclose(g.numpy(), want, rtol=1e-4, atol=1e-5)

    v = keras.Variable(w0)
    opt = bf.DistributedOptimizer(keras.optimizers.SGD(0.5), op=bf.Adasum)
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(tf.square(x @ v)) / 2
    opt.apply_gradients(zip(tape.gradient(loss, [v]), [v]))
    np.testing.assert_allclose(np.asarray(v), w0 - 0.5 * want, rtol=1e-4, atol=1e-5)


@pow2_only
def test_adasum_errors():
    with pytest.raises(TypeError, match="needs float tensors"):
        bf.allreduce(tf.constant([1, 2]), op=bf.Adasum, name="adasum.int")
    sl = tf.IndexedSlices(tf.ones([1, 2]), tf.constant([0]), tf.constant([3, 2]))
    with pytest.raises(bf.UnsupportedReductionError, match="sparse_as_dense"):
        bf.allreduce(sl, op=bf.Adasum, name="adasum.sparse")
    with pytest.raises(ValueError, match="compression"):
        bf.allreduce(tf.ones([2]), op=bf.Adasum, compression=bf.Compression.fp16)
    with pytest.raises(ValueError, match="compression"):
        bf.DistributedGradientTape(tf.GradientTape(), op=bf.Adasum,
                                   compression=bf.Compression.bf16)
    with pytest.raises(ValueError, match="gradient_predivide_factor"):
        bf.DistributedOptimizer(keras.optimizers.SGD(0.1), op=bf.Adasum,
                                gradient_predivide_factor=2.0)
    with pytest.raises(ValueError, match="average_aggregated_gradients"):
        bf.DistributedOptimizer(keras.optimizers.SGD(0.1), op=bf.Adasum,
                                backward_passes_per_step=2, average_aggregated_gradients=True)
    with pytest.raises(ValueError, match="Keras optimizer"):
        bf.DistributedOptimizer(tf.compat.v1.train.GradientDescentOptimizer(0.1), op=bf.Adasum)


@needs_ranks(3)
def test_adasum_needs_power_of_two_ranks():
    if POW2:
        pytest.skip("the job has a power-of-two rank count")
    with pytest.raises(ValueError, match=r"rank \d+: bluefog allreduce.*power-of-two.*3 ranks"):
        bf.allreduce(tf.ones([3]), op=bf.Adasum, name="adasum.np3")
    with pytest.raises(ValueError, match="power-of-two"):
        bf.grouped_allreduce([tf.ones([3])], op=bf.Adasum, name="adasum.np3.grouped")


@pow2_only
def test_optimizer_adasum_with_gradient_accumulation():
    """Two passes summed locally (Horovod: no averaging with Adasum), then Adasum over ranks."""
    a = rank_arrays(bf.rank())[0]
    b = rank_arrays(bf.rank())[0][::-1].copy()
    want = np_adasum([[rank_arrays(q)[0] + rank_arrays(q)[0][::-1]]
                      for q in range(bf.size())])[bf.rank()][0]
    v = keras.Variable(np.zeros(5, np.float32))
    opt = bf.DistributedOptimizer(keras.optimizers.SGD(1.0), op=bf.Adasum,
                                  backward_passes_per_step=2)
    opt.apply_gradients([(tf.constant(a), v)])
    opt.apply_gradients([(tf.constant(b), v)])
    np.testing.assert_allclose(v.numpy(), -want, rtol=1e-5, atol=1e-6)
