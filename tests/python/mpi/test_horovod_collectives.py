"""alltoall, reducescatter, grouped_reducescatter, grouped_allgather and allreduce's scale
factors (Horovod's collective API beyond the seed), checked in closed form on every rank, in
eager mode, inside a tf.function and in a tf.compat.v1 graph, with their gradients.
"""

import numpy as np
import pytest
import tensorflow as tf

import bluefog.tensorflow as bf

MODES = ["eager", "function", "graph"]
DTYPES = [tf.uint8, tf.int32, tf.int64, tf.float16, tf.bfloat16, tf.float32, tf.float64]


@pytest.fixture
def op_name(request):
    return "hc." + request.node.name


def _run(mode, fn, *arrays):
    """fn on constants made from `arrays`, eagerly, in a tf.function or in a Session."""
    if mode == "eager":
        return tf.nest.map_structure(lambda t: t.numpy(), fn(*[tf.constant(a) for a in arrays]))
    if mode == "function":
        return tf.nest.map_structure(lambda t: t.numpy(),
                                     tf.function(fn)(*[tf.constant(a) for a in arrays]))
    graph = tf.Graph()
    with graph.as_default():
        out = fn(*[tf.constant(a) for a in arrays])
    with tf.compat.v1.Session(graph=graph) as sess:
        return sess.run(out)


def _rows(rank, count, width, dtype):
    """`count` rows of `width`, row k of rank r holding 10 * r + k (exact in every dtype)."""
    values = np.repeat((10 * rank + np.arange(count))[:, None], width, axis=1)
    return values.astype(dtype.as_numpy_dtype)


# ------------------------------------------------------------------------------------ alltoall


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", DTYPES + [tf.bool], ids=lambda d: d.name)
def test_alltoall_equal_splits(mode, dtype, rank, size, op_name):
    if dtype == tf.bool:
        x = (np.arange(2 * size)[:, None] % 2 == rank % 2).repeat(3, axis=1)
    else:
        x = _rows(rank, 2 * size, 3, dtype)
    out = _run(mode, lambda t: bf.alltoall(t, name=op_name), x)  # without splits: the tensor
    # Rank r receives rows 2r, 2r+1 of every rank j, in rank order.
    for j in range(size):
        if dtype == tf.bool:
            want = (np.arange(2 * rank, 2 * rank + 2)[:, None] % 2 == j % 2).repeat(3, axis=1)
        else:
            want = _rows(j, 2 * size, 3, dtype)[2 * rank:2 * rank + 2]
        np.testing.assert_array_equal(out[2 * j:2 * j + 2], want)


@pytest.mark.parametrize("mode", MODES)
def test_alltoall_uneven_splits(mode, rank, size, op_name):
    # Rank r sends (r + j) % 3 rows to rank j; row k holds 100 * r + k.
    splits = [(rank + j) % 3 for j in range(size)]
    x = ((100 * rank + np.arange(sum(splits), dtype=np.float32))[:, None]
         * np.ones([1, 2], np.float32))
    out, received = _run(mode, lambda t: bf.alltoall(t, splits=splits, name=op_name), x)
    want_rows, want_splits = [], []
    for j in range(size):
        their = [(j + k) % 3 for k in range(size)]
        start = sum(their[:rank])
        want_rows += [100 * j + start + k for k in range(their[rank])]
        want_splits.append(their[rank])
    np.testing.assert_array_equal(received, want_splits)
    np.testing.assert_array_equal(out, np.array(want_rows, np.float32)[:, None] * np.ones([1, 2]))


def test_alltoall_splits_as_tensor_and_zero_rows(rank, size, op_name):
    splits = tf.constant([0] * size, tf.int32)
    out, received = bf.alltoall(tf.zeros([0, 4]), splits=splits, name=op_name)
    assert out.shape == (0, 4)
    np.testing.assert_array_equal(received.numpy(), [0] * size)


def test_alltoall_gradient_is_the_reverse_alltoall(rank, size, op_name):
    splits = [(rank + j) % 2 + 1 for j in range(size)]
    x = tf.Variable(tf.ones([sum(splits), 2]) * (rank + 1))
    with tf.GradientTape() as tape:
        out, received = bf.alltoall(x, splits=splits, name=op_name)
        # Weight each received row by the rank it came from + 1.
        weights = np.concatenate([[j + 1.0] * int(n) for j, n in enumerate(received.numpy())])
        loss = tf.reduce_sum(out * weights[:, None])
    grad = tape.gradient(loss, x).numpy()
    # A row this rank sent to rank j comes back with the weight rank j gave it: this rank + 1.
    np.testing.assert_allclose(grad, np.full([sum(splits), 2], rank + 1.0))


def test_alltoall_mistakes(rank, size, op_name):
    if size > 1:  # Horovod's error type, and a ValueError
        for error in (ValueError, tf.errors.InvalidArgumentError):
            with pytest.raises(error, match="splits"):
                bf.alltoall(tf.ones([2 * size + 1, 2]), name=op_name + ".uneven")
    with pytest.raises(tf.errors.FailedPreconditionError, match="rank 0's splits .* add up to"):
        bf.alltoall(tf.ones([3, 2]), splits=[5] * size, name=op_name + ".sum")
    with pytest.raises((ValueError, tf.errors.InvalidArgumentError), match="rank >= 1"):
        bf.alltoall(tf.constant(1.0), name=op_name + ".scalar")
    out = bf.allreduce(tf.constant([1.0]), average=False, name=op_name + ".after")
    np.testing.assert_allclose(out.numpy(), [size])


@pytest.mark.parametrize("mode", ["eager", "function"])
@pytest.mark.parametrize("bad, problem", [
    ([2**63 - 1, 2**63 - 1, 2], "add up to more than an int64 holds"),  # wraps around to 0
    ([-1, 1, 0], "has a negative entry"),
    ([1, 1, 1], "add up to 3 rows, but the tensor has 0 rows"),
])
def test_alltoall_one_ranks_bad_splits_fail_on_every_rank(mode, bad, problem, rank, size,
                                                          op_name):
    if size < 3:
        pytest.skip("the wrapped-around sum needs 3 entries")
    last = rank == size - 1
    splits = tf.constant(bad + [0] * (size - 3) if last else [1] * size, tf.int64)
    x = tf.zeros([0 if last else size, 2])

    def run(x, splits):
        return bf.alltoall(x, splits=splits, name=op_name)[0]

    if mode == "function":  # the splits are unknown until run: only the runtime sees them
        run = tf.function(run, input_signature=[tf.TensorSpec([None, 2]),
                                                tf.TensorSpec([None], tf.int64)])
    with pytest.raises(tf.errors.FailedPreconditionError,
                       match=f"rank {size - 1}'s splits .*{problem}.*Pass splits"):
        run(x, splits)
    out = bf.allreduce(tf.constant([1.0]), average=False, name=op_name + ".after")
    np.testing.assert_allclose(out.numpy(), [size])


# ------------------------------------------------------------------------------- reducescatter


def _split_rows(rows, size, rank):
    """Horovod's split of dimension 0: rows // size each, one more on the first rows % size."""
    counts = [rows // size + (1 if r < rows % size else 0) for r in range(size)]
    start = sum(counts[:rank])
    return start, counts[rank]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("op", [bf.Sum, bf.Average], ids=["sum", "avg"])
def test_reducescatter(mode, dtype, op, rank, size, op_name):
    rows = 2 * size + 1  # uneven whenever size > 1
    x = _rows(rank, rows, 2, dtype)
    out = _run(mode, lambda t: bf.reducescatter(t, op=op, name=op_name), x)
    start, count = _split_rows(rows, size, rank)
    # sum over ranks of 10 r + k = 10 n(n-1)/2 + n k
    total = np.array([10 * size * (size - 1) // 2 + size * k for k in range(start, start + count)])
    want = total / size if op == bf.Average else total
    if not dtype.is_floating and op == bf.Average:
        want = np.trunc(want)
    assert out.shape == (count, 2)
    rtol = {tf.float16: 1e-3, tf.bfloat16: 1e-2}.get(dtype, 1e-6)
    np.testing.assert_allclose(out.astype(np.float64), np.repeat(want[:, None], 2, axis=1),
                               rtol=rtol)


def test_reducescatter_default_is_average_and_fewer_rows_than_ranks(rank, size, op_name):
    out = bf.reducescatter(tf.ones([1, 3]) * (rank + 1), name=op_name)
    if rank == 0:
        np.testing.assert_allclose(out.numpy(), [[(size + 1) / 2] * 3])
    else:
        assert out.shape == (0, 3)


@pytest.mark.parametrize("op", [bf.Sum, bf.Average], ids=["sum", "avg"])
def test_reducescatter_gradient_is_an_allgather(op, rank, size, op_name):
    rows = size + 1
    x = tf.Variable(tf.ones([rows, 2]))
    with tf.GradientTape() as tape:
        out = bf.reducescatter(x, op=op, name=op_name)
        loss = tf.reduce_sum(out * float(rank + 1))
    grad = tape.gradient(loss, x).numpy()
    # d loss / d x[row] = (owner of row + 1), divided by size for the average.
    want = np.concatenate([[r + 1.0] * _split_rows(rows, size, r)[1] for r in range(size)])
    if op == bf.Average:
        want = want / size
    np.testing.assert_allclose(grad, np.repeat(want[:, None], 2, axis=1), rtol=1e-6)


def test_reducescatter_mistakes(rank, size, op_name):
    with pytest.raises(ValueError, match="rank >= 1|scalar"):
        bf.reducescatter(tf.constant(1.0), name=op_name + ".scalar")
    with pytest.raises((ValueError, TypeError)):
        bf.reducescatter(tf.constant([True]), name=op_name + ".bool")
    with pytest.raises(ValueError, match="op"):
        bf.reducescatter(tf.ones([2]), op=bf.Max, name=op_name + ".max")


@pytest.mark.parametrize("mode", MODES)
def test_grouped_reducescatter(mode, rank, size, op_name):
    a = _rows(rank, size, 2, tf.float32)
    b = _rows(rank, 3 * size + 2, 1, tf.float64)
    out = _run(mode, lambda x, y: bf.grouped_reducescatter([x, y], op=bf.Sum, name=op_name), a, b)
    for value, rows, width in ((out[0], size, 2), (out[1], 3 * size + 2, 1)):
        start, count = _split_rows(rows, size, rank)
        total = [10 * size * (size - 1) // 2 + size * k for k in range(start, start + count)]
        np.testing.assert_allclose(value, np.repeat(np.array(total, float)[:, None], width, axis=1))


# ---------------------------------------------------------------------------- grouped_allgather


@pytest.mark.parametrize("mode", MODES)
def test_grouped_allgather(mode, rank, size, op_name):
    a = _rows(rank, rank + 1, 2, tf.float32)
    b = _rows(rank, 1, 3, tf.int64)
    out = _run(mode, lambda x, y: bf.grouped_allgather([x, y], name=op_name), a, b)
    np.testing.assert_array_equal(out[0], np.concatenate([_rows(r, r + 1, 2, tf.float32)
                                                          for r in range(size)]))
    np.testing.assert_array_equal(out[1], np.concatenate([_rows(r, 1, 3, tf.int64)
                                                          for r in range(size)]))


@pytest.mark.skipif(bf.size() < 2, reason="needs ranks that disagree")
@pytest.mark.parametrize("mode", MODES)
def test_grouped_allgather_with_different_numbers_of_tensors_fails_everywhere(mode, rank, size,
                                                                               op_name):
    """Rank 0 passes one tensor more than the others: an error on every rank instead of the
    others never sending the name rank 0 waits for; the next grouped_allgather works."""
    n = 3 if rank == 0 else 2
    arrays = [_rows(rank, 1, 2, tf.float32) for _ in range(n)]
    errors = (tf.errors.FailedPreconditionError, tf.errors.InvalidArgumentError)
    with pytest.raises(errors, match="disagree on the number of tensors") as info:
        _run(mode, lambda *xs: bf.grouped_allgather(list(xs), name=op_name), *arrays)
    assert f"rank {rank}: bluefog grouped_allgather" in str(info.value)
    if mode == "eager":
        assert "rank 0 has 3" in str(info.value) and "rank 1 has 2" in str(info.value)
    out = _run(mode, lambda x: bf.grouped_allgather([x], name=op_name + ".ok"),
               _rows(rank, 1, 2, tf.float32))
    assert out[0].shape == (size, 2)


# ------------------------------------------------------------------------------- scale factors


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("average", [False, True], ids=["sum", "avg"])
def test_allreduce_scale_factors(mode, average, rank, size, op_name):
    x = np.full([4], rank + 1.0, np.float32)
    out = _run(mode, lambda t: bf.allreduce(t, average=average, name=op_name,
                                            prescale_factor=2.0, postscale_factor=0.25), x)
    total = size * (size + 1) / 2 * 0.5
    np.testing.assert_allclose(out, [total / size if average else total] * 4, rtol=1e-6)


def test_grouped_allreduce_scale_factors_and_gradient(rank, size, op_name):
    xs = [tf.Variable(tf.ones([2]) * (rank + 1)), tf.Variable(tf.ones([3]))]
    with tf.GradientTape() as tape:
        outs = bf.grouped_allreduce(xs, average=False, name=op_name, prescale_factor=3.0)
        loss = tf.reduce_sum(outs[0]) + tf.reduce_sum(outs[1])
    np.testing.assert_allclose(outs[0].numpy(), [3 * size * (size + 1) / 2] * 2)
    np.testing.assert_allclose(outs[1].numpy(), [3 * size] * 3)
    # The gradient of a scaled sum is the scaled sum of the upstream gradients.
    grads = tape.gradient(loss, xs)
    np.testing.assert_allclose(grads[0].numpy(), [3 * size] * 2)


@pytest.mark.parametrize("mode", MODES)
def test_float64_scale_factors_are_exact(mode, rank, size, op_name):
    """A factor such as 1/3 keeps float64 precision (the op's attributes are float32), for
    allreduce, grouped_allreduce and their gradients."""
    x = np.full([3], rank + 1.0, np.float64)
    out = _run(mode, lambda t: bf.allreduce(t, average=False, name=op_name,
                                            prescale_factor=1 / 3, postscale_factor=0.1), x)
    np.testing.assert_allclose(out, [size * (size + 1) / 2 / 30] * 3, rtol=1e-14)
    v = tf.Variable(x)
    with tf.GradientTape() as tape:
        outs = bf.grouped_allreduce([v, tf.constant(x, tf.float32)], average=True,
                                    name=op_name + ".g", prescale_factor=1 / 3)
        loss = tf.reduce_sum(outs[0])
    np.testing.assert_allclose(outs[0].numpy(), [(size + 1) / 2 / 3] * 3, rtol=1e-14)
    np.testing.assert_allclose(outs[1].numpy(), [(size + 1) / 2 / 3] * 3, rtol=1e-6)
    np.testing.assert_allclose(tape.gradient(loss, v).numpy(), [1 / 3] * 3, rtol=1e-14)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", [tf.uint8, tf.int8, tf.int32, tf.int64], ids=lambda d: d.name)
def test_integer_scale_factors_as_horovod(mode, dtype, rank, size, op_name):
    """Integers are scaled in float64 and truncated: before the sum each rank's input, after it
    the sum (Horovod's rule)."""
    x = (np.arange(7) * (rank + 1) % 5 + 1).astype(dtype.as_numpy_dtype)
    pre, post = _run(mode, lambda t: (
        bf.allreduce(t, op=bf.Sum, prescale_factor=0.7, name=op_name + ".pre"),
        bf.allreduce(t, op=bf.Sum, postscale_factor=0.7, name=op_name + ".post")), x)
    xs = [(np.arange(7) * (r + 1) % 5 + 1).astype(np.float64) for r in range(size)]
    np.testing.assert_array_equal(pre, sum(np.trunc(v * 0.7) for v in xs))
    np.testing.assert_array_equal(post, np.trunc(sum(xs) * 0.7))
    assert pre.dtype == dtype.as_numpy_dtype
    grouped = _run(mode, lambda t: bf.grouped_allreduce([t], op=bf.Sum, postscale_factor=0.7,
                                                        name=op_name + ".g"), x)
    np.testing.assert_array_equal(grouped[0], np.trunc(sum(xs) * 0.7))


def test_scale_factors_refuse_min_max(rank, size, op_name):
    with pytest.raises((ValueError, tf.errors.InvalidArgumentError), match="prescale_factor"):
        bf.allreduce(tf.ones([2], tf.int32), op=bf.Max, prescale_factor=2.0, name=op_name)


@pytest.mark.parametrize("mode", MODES)
def test_reducescatter_horovod_arguments(mode, rank, size, op_name):
    """prescale/postscale factors, compression, device_dense and ignore_name_scope; the
    gradient includes the factors."""
    x = _rows(rank, 2 * size, 2, tf.float32)
    ints = _rows(rank, 2 * size, 1, tf.int32)
    out, grouped, scaled_int = _run(mode, lambda t, i: (
        bf.reducescatter(t, op=bf.Sum, prescale_factor=2.0, postscale_factor=0.5,
                         compression=bf.Compression.fp16, device_dense="/cpu:0",
                         ignore_name_scope=True, name=op_name),
        bf.grouped_reducescatter([t], op=bf.Average, postscale_factor=3.0,
                                 ignore_name_scope=True, name=op_name + ".g")[0],
        bf.reducescatter(i, op=bf.Sum, postscale_factor=0.3, name=op_name + ".i")), x, ints)
    start, count = _split_rows(2 * size, size, rank)
    total = np.array([10 * size * (size - 1) // 2 + size * k for k in range(start, start + count)],
                     np.float64)
    np.testing.assert_allclose(out, np.repeat(total[:, None], 2, axis=1), rtol=1e-3)
    np.testing.assert_allclose(grouped, np.repeat(3 * total[:, None] / size, 2, axis=1),
                               rtol=1e-6)
    np.testing.assert_array_equal(scaled_int[:, 0], np.trunc(total * 0.3))
    v = tf.Variable(tf.ones([size, 2]))
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(bf.reducescatter(v, op=bf.Sum, prescale_factor=3.0,
                                              name=op_name + ".grad"))
    np.testing.assert_allclose(tape.gradient(loss, v).numpy(), np.full([size, 2], 3.0))
