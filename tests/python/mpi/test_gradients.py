"""Gradients of allreduce, allgather and broadcast, in closed form.

Three modes: tf.GradientTape eagerly, a tape inside a tf.function, and tf.compat.v1.gradients in
a graph run by a Session.

Each rank weights the collective's output with its own upstream gradient, so the expected input
gradient is a sum over ranks that every rank can compute from (rank, size). The backward pass
runs collectives too (named "<forward name>.grad..."), so every rank computes the same gradients.
"""

import numpy as np
import pytest
import tensorflow as tf

import bluefog.tensorflow as bf

MODES = ["eager", "function", "graph"]
DTYPES = [tf.float32, tf.float64]


def _tri(n: int) -> int:
    """1 + 2 + ... + n."""
    return n * (n + 1) // 2


def _grad(mode, forward, x):
    """(forward(x), d forward(x) / dx) as numpy: eagerly with a GradientTape, with a tape inside
    a tf.function, or with tf.compat.v1.gradients in a graph run by a Session."""
    if mode == "graph":
        graph = tf.Graph()
        with graph.as_default():
            t = tf.constant(x)
            y = forward(t)
            (g,) = tf.compat.v1.gradients(y, [t])
        config = tf.compat.v1.ConfigProto(inter_op_parallelism_threads=4,
                                          intra_op_parallelism_threads=1)
        with tf.compat.v1.Session(graph=graph, config=config) as sess:
            return tuple(sess.run([y, g]))

    def fn(x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = forward(x)
        return y, tape.gradient(y, x)

    if mode == "function":
        fn = tf.function(fn)
    y, g = fn(tf.constant(x))
    return y.numpy(), g.numpy()


@pytest.fixture
def op_name(request):
    return "tg." + request.node.name


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("average", [False, True], ids=["sum", "avg"])
@pytest.mark.parametrize("mode", MODES)
def test_allreduce_gradient(mode, average, dtype, rank, size, op_name):
    shape = [2, 3]
    x = (np.arange(6).reshape(shape) + rank).astype(dtype.as_numpy_dtype)
    upstream = (rank + 1) * (np.arange(6).reshape(shape) + 1)  # differs per rank

    def forward(t):
        y = bf.allreduce(t, average=average, name=op_name)
        return tf.reduce_sum(y * tf.constant(upstream, dtype))

    loss, grad = _grad(mode, forward, x)
    # d loss_r / d x_r = allreduce over ranks of upstream_q: sum_q (q + 1) * (i + 1).
    expected = _tri(size) * (np.arange(6).reshape(shape) + 1.0)
    if average:
        expected /= size
    assert grad.dtype == dtype.as_numpy_dtype and grad.shape == tuple(shape)
    np.testing.assert_allclose(grad, expected, rtol=1e-6)
    total = sum(np.arange(6).reshape(shape) + q for q in range(size))
    np.testing.assert_allclose(loss, np.sum((total / size if average else total) * upstream),
                               rtol=1e-6)


@pytest.mark.parametrize("empty_ranks", [False, True], ids=["rows", "emptyrows"])
@pytest.mark.parametrize("mode", MODES)
def test_allgather_gradient(mode, empty_ranks, rank, size, op_name):
    """Rank q contributes rows(q) rows; its gradient is its slice of the summed upstream."""
    def rows(q):
        return 0 if empty_ranks and q % 2 == 0 else q + 1

    x = np.full([rows(rank), 2], float(rank), np.float32)
    total_rows = sum(rows(q) for q in range(size))
    i = np.arange(total_rows)[:, None]
    j = np.arange(2)[None, :]
    upstream = ((rank + 1) * (i + 1) + j).astype(np.float32)

    def forward(t):
        y = bf.allgather(t, name=op_name)
        return tf.reduce_sum(y * upstream)

    _, grad = _grad(mode, forward, x)
    summed = _tri(size) * (i + 1) + size * j  # sum over q of (q + 1) * (i + 1) + j
    start = sum(rows(q) for q in range(rank))
    expected = summed[start:start + rows(rank)]
    assert grad.shape == (rows(rank), 2)
    np.testing.assert_allclose(grad, expected, rtol=1e-6)


@pytest.mark.parametrize("mode", MODES)
def test_allgather_gradient_through_square(mode, rank, size, op_name):
    """Chain rule through the collective: loss = sum(allgather(x * x) * w)."""
    x = (np.arange(4).reshape([2, 2]) + rank + 1).astype(np.float64)

    def forward(t):
        y = bf.allgather(t * t, name=op_name)
        return tf.reduce_sum(y * (rank + 1.0))

    _, grad = _grad(mode, forward, x)
    np.testing.assert_allclose(grad, 2 * x * _tri(size), rtol=1e-12)


@pytest.mark.parametrize("mode,dtype", [
    pytest.param("eager", tf.float32, id="eager-float32"),
    pytest.param("eager", tf.float64, id="eager-float64"),
    pytest.param("function", tf.float32, id="function-float32"),
    pytest.param("graph", tf.float64, id="graph-float64"),
])
def test_broadcast_gradient(mode, dtype, rank, size, op_name):
    """One broadcast from every root; the loss weights root q's result by q + 1.

    Only the root's input influences a broadcast, so rank r's gradient comes from root r only:
    (r + 1) times the upstream summed over ranks.
    """
    x = (np.arange(5) + 10 * rank).astype(dtype.as_numpy_dtype)
    upstream = (rank + 1) * (np.arange(5) + 1.0)

    def forward(t):
        loss = tf.constant(0, dtype)
        for root in range(size):
            y = bf.broadcast(t, root_rank=root, name=f"{op_name}.root{root}")
            loss += (root + 1) * tf.reduce_sum(y * tf.constant(upstream, dtype))
        return loss

    loss, grad = _grad(mode, forward, x)
    expected = (rank + 1) * _tri(size) * (np.arange(5) + 1.0)
    assert grad.dtype == dtype.as_numpy_dtype
    np.testing.assert_allclose(grad, expected, rtol=1e-6)
    expected_loss = sum((root + 1) * np.sum((np.arange(5) + 10 * root) * upstream)
                        for root in range(size))
    np.testing.assert_allclose(loss, expected_loss, rtol=1e-6)


@pytest.mark.parametrize("mode", [
    "eager", "function"])
def test_gradient_of_variable_through_all_three(mode, rank, size, op_name):
    """A variable feeding all three ops; the gradients add up."""
    var = tf.Variable((np.arange(3) + rank).astype(np.float32))

    def step():
        with tf.GradientTape() as tape:
            a = bf.allreduce(var, average=True, name=op_name + ".ar")
            g = bf.allgather(var, name=op_name + ".ag")
            b = bf.broadcast(var, root_rank=0, name=op_name + ".bc")
            loss = (tf.reduce_sum(a) + tf.reduce_sum(g[:3]) * (rank + 1) +
                    tf.reduce_sum(b) * (rank + 1))
        return tape.gradient(loss, var)

    grad = (step() if mode == "eager" else tf.function(step)()).numpy()
    # allreduce (average) of ones: 1. allgather: only rank 0's rows get upstream (q + 1) from
    # every rank q; broadcast: root 0 gets the sum over q of (q + 1).
    expected = np.ones(3) + (2 * _tri(size) if rank == 0 else 0)
    np.testing.assert_allclose(grad, expected, rtol=1e-6)


@pytest.mark.parametrize("mode", MODES)
def test_unnamed_gradients(mode, rank, size):
    """Unnamed forward ops get unnamed backward ops; the call order is the same on every rank."""
    x = (np.arange(4) + rank).astype(np.float32)

    def forward(t):
        return tf.reduce_sum(bf.allreduce(t, average=False) * (rank + 1.0))

    _, grad = _grad(mode, forward, x)
    np.testing.assert_allclose(grad, np.full(4, float(_tri(size))), rtol=1e-6)
