"""Results of allreduce, allgather and broadcast on every rank, checked in closed form.

Each collective runs in three modes: eagerly, inside a ``tf.function``, and in a TF1-style graph
run by a ``tf.compat.v1.Session``. Every rank runs the same tests in the same order, and every
request has an explicit name derived from the test id, so one failing test cannot leave a request
behind that a later test would match.
"""

import threading

import numpy as np
import pytest
import tensorflow as tf

import bluefog.tensorflow as bf
from bluefog.common import basics

from conftest import needs_ranks, rank_values

NUMERIC_DTYPES = [tf.uint8, tf.int8, tf.uint16, tf.int16, tf.int32, tf.int64,
                  tf.float16, tf.bfloat16, tf.float32, tf.float64]
ALL_DTYPES = NUMERIC_DTYPES + [tf.bool]
MODES = ["eager", "function", "graph"]

# Eager mode: every dtype with a scalar and a rank-3 shape, plus a few more shapes (rank 1 and 2,
# and zero-element tensors) for some dtypes.
EAGER_CASES = ([(dt, shape) for dt in NUMERIC_DTYPES for shape in ([], [2, 3, 2])] +
               [(tf.float32, [5]), (tf.float32, [0, 3]), (tf.int32, [2, 3]), (tf.int64, [0]),
                (tf.float16, [4, 0, 2])])
# tf.function and graph mode: a subset that still covers every rank 0..3 and an empty tensor.
SUBSET_CASES = [(tf.float32, []), (tf.int32, [2, 3]), (tf.float16, [5]),
                (tf.bfloat16, [2, 3, 2]), (tf.uint8, [0, 3]), (tf.float64, [7]),
                (tf.int8, [3, 1]), (tf.int64, [2, 2])]

# Allgather: the trailing dimensions (dimension 0 is chosen per rank); "empty" cases give the
# even ranks (rank 0 included) zero rows.
GATHER_EAGER_CASES = ([(dt, rest) for dt in ALL_DTYPES for rest in ([], [2, 3])] +
                      [(tf.float32, [3, 1, 2]), (tf.int32, [0]), (tf.float32, "empty"),
                       (tf.int8, "empty"), (tf.bool, "empty"), (tf.float64, "empty-2x2")])
GATHER_SUBSET_CASES = [(tf.float32, [2]), (tf.int64, []), (tf.float16, [2, 2]),
                       (tf.bfloat16, [3]), (tf.bool, [2]), (tf.uint16, [0, 2]),
                       (tf.int32, "empty"), (tf.float32, "empty-2x2")]

BROADCAST_EAGER_CASES = ([(dt, shape) for dt in ALL_DTYPES for shape in ([], [2, 3, 2])] +
                         [(tf.float32, [0, 3]), (tf.int32, [4])])
BROADCAST_SUBSET_CASES = [(tf.float32, [3]), (tf.int64, []), (tf.bfloat16, [2, 2]),
                          (tf.bool, [2, 1, 2]), (tf.uint8, [0, 3]), (tf.float16, [5])]


def _cases(eager_cases, subset_cases):
    """(mode, dtype, shape) parameters with readable ids."""
    params = []
    for mode in MODES:
        for dt, shape in (eager_cases if mode == "eager" else subset_cases):
            if isinstance(shape, str):
                shape_id = shape
            else:
                shape_id = "x".join(map(str, shape)) if shape else "scalar"
            params.append(pytest.param(mode, dt, shape, id=f"{mode}-{dt.name}-{shape_id}"))
    return params


def _np_dtype(dtype):
    return dtype.as_numpy_dtype


def _values(shape, rank, dtype, offset=0):
    """Per-rank input: small integers, exactly representable in every dtype, bool included.

    Signed dtypes get negative values as well, so that averages exercise truncation toward zero.
    """
    if dtype == tf.bool:
        return (rank_values(shape, rank) % 2 == 0)
    if offset == 0 and (dtype.is_floating or not dtype.is_unsigned):
        offset = -4
    return rank_values(shape, rank, np.float64, offset).astype(_np_dtype(dtype))


def _run(mode, fn, *arrays):
    """Calls fn on constant tensors made from `arrays` in the given mode; returns numpy values."""
    if mode == "eager":
        inputs = [tf.constant(a) for a in arrays]
        out = fn(*inputs)
        for a, t in zip(arrays, inputs):  # a collective must not write into its input
            np.testing.assert_array_equal(t.numpy(), a)
        return tf.nest.map_structure(lambda t: t.numpy(), out)
    if mode == "function":
        return tf.nest.map_structure(lambda t: t.numpy(),
                                     tf.function(fn)(*[tf.constant(a) for a in arrays]))
    assert mode == "graph"
    graph = tf.Graph()
    with graph.as_default():
        out = fn(*[tf.constant(a) for a in arrays])
    config = tf.compat.v1.ConfigProto(inter_op_parallelism_threads=4,
                                      intra_op_parallelism_threads=1)
    with tf.compat.v1.Session(graph=graph, config=config) as sess:
        return sess.run(out)


def _assert_matches(result, expected, dtype):
    """Exact for integers and bool; float tolerances fit the dtype's precision."""
    result = np.asarray(result)
    assert result.dtype == _np_dtype(dtype), (result.dtype, dtype)
    assert result.shape == tuple(np.shape(expected)), (result.shape, np.shape(expected))
    if dtype.is_floating:
        rtol = {tf.float16: 1e-3, tf.bfloat16: 1e-2, tf.float32: 1e-6}.get(dtype, 1e-12)
        np.testing.assert_allclose(result.astype(np.float64), expected, rtol=rtol, atol=0)
    else:
        np.testing.assert_array_equal(result, np.asarray(expected).astype(result.dtype))


@pytest.fixture
def op_name(request):
    """A request name unique to this test and parameter set, identical on every rank."""
    return "tc." + request.node.name


# ----------------------------------------------------------------------------------- allreduce


@pytest.mark.parametrize("average", [False, True], ids=["sum", "avg"])
@pytest.mark.parametrize("mode,dtype,shape", _cases(EAGER_CASES, SUBSET_CASES))
def test_allreduce(mode, dtype, shape, average, rank, size, op_name):
    mine = _values(shape, rank, dtype)
    total = sum(_values(shape, r, dtype).astype(np.float64) for r in range(size))
    if not average:
        expected = total
    elif dtype.is_floating:
        expected = total / size
    else:
        expected = np.trunc(total / size)  # C++ integer division truncates toward zero

    result = _run(mode, lambda t: bf.allreduce(t, average=average, name=op_name), mine)
    _assert_matches(result, expected, dtype)


@pytest.mark.parametrize("mode", MODES)
def test_allreduce_several_in_one_call(mode, rank, size, op_name):
    """Several allreduces of mixed dtypes and sizes in one function/graph (fused or not)."""
    specs = [(tf.float32, [3]), (tf.float32, [2, 2]), (tf.int32, [5]), (tf.float32, []),
             (tf.float64, [4]), (tf.int32, [0]), (tf.float32, [6])]
    arrays = [_values(shape, rank, dt, offset=i) for i, (dt, shape) in enumerate(specs)]

    def fn(*tensors):
        return [bf.allreduce(t, average=False, name=f"{op_name}.{i}")
                for i, t in enumerate(tensors)]

    results = _run(mode, fn, *arrays)
    for i, ((dt, shape), result) in enumerate(zip(specs, results)):
        expected = sum(_values(shape, r, dt, offset=i).astype(np.float64) for r in range(size))
        _assert_matches(result, expected, dt)


# Above BLUEFOG_RING_THRESHOLD (1 MiB by default) allreduces take the ring algorithm; odd element
# counts make the per-rank chunks uneven.
@pytest.mark.parametrize("average", [False, True], ids=["sum", "avg"])
@pytest.mark.parametrize("dtype", [tf.float32, tf.float16, tf.bfloat16, tf.int32, tf.float64,
                                   tf.uint8], ids=lambda d: d.name)
def test_allreduce_large(dtype, average, rank, size, op_name):
    n = (1 << 20) // dtype.size + 1001
    mine = _values([n], rank, dtype)
    total = sum(_values([n], r, dtype).astype(np.float64) for r in range(size))
    if not average:
        expected = total
    elif dtype.is_floating:
        expected = total / size
    else:
        expected = np.trunc(total / size)
    result = bf.allreduce(tf.constant(mine), average=average, name=op_name).numpy()
    _assert_matches(result, expected, dtype)


# From BLUEFOG_ONE_HOST_THRESHOLD (16 KiB) up to the ring threshold, allreduces on one host
# with the rounds' data areas take the one-host paths instead of MPI_Allreduce; under it, and
# with the threshold at 0, they do not. On Gloo they take every size (Gloo's own allreduce goes
# through TCP loopback, slower at every size), whatever the threshold. Exact either way.
@pytest.mark.parametrize("mode", ["eager", "function"])
@pytest.mark.parametrize("dtype", [tf.float32, tf.float16, tf.int32, tf.float64],
                         ids=lambda d: d.name)
def test_allreduce_mid_size_paths(mode, dtype, rank, size, op_name):
    on_one_host = size > 1 and bf.local_size() == size
    every_size = on_one_host and bf.backend() == "gloo"
    one_host = every_size or (on_one_host and basics._tuning("one_host_threshold") > 0)

    def check(n, name, expect_one_host):
        mine = _values([n], rank, dtype)
        expected = sum(_values([n], r, dtype).astype(np.float64) for r in range(size))
        fn = lambda t: bf.allreduce(t * 1, average=False, name=name)  # noqa: E731
        before = basics._tuning("one_host_calls")
        result = (fn(tf.constant(mine)) if mode == "eager" else
                  tf.function(fn)(tf.constant(mine))).numpy()
        taken = basics._tuning("one_host_calls") - before
        _assert_matches(result, expected, dtype)
        assert taken == (1 if expect_one_host else 0), (
            f"rank {rank}: {n} elements of {dtype.name}: {taken} one-host calls")

    threshold = basics._tuning("one_host_threshold")
    big = (64 << 10) // dtype.size + 7  # 64 KiB and a few elements: uneven segments
    check(big, op_name + ".big", one_host)
    check(max(size, threshold // dtype.size - 1), op_name + ".under", every_size)
    before = basics._tune("one_host_threshold", 0)
    try:
        check(big, op_name + ".off", every_size)
    finally:
        basics._tune("one_host_threshold", before)


@pytest.mark.parametrize("mode", ["function", "graph"])
def test_allreduce_large_fused(mode, rank, size, op_name):
    """Several allreduces that fit one fusion buffer and together exceed the ring threshold."""
    shapes = [[100003], [300, 301], [150001], [7]]
    arrays = [_values(shape, rank, tf.float32, offset=i + 1) for i, shape in enumerate(shapes)]

    def fn(*tensors):
        return [bf.allreduce(t, average=False, name=f"{op_name}.{i}")
                for i, t in enumerate(tensors)]

    results = _run(mode, fn, *arrays)
    for i, (shape, result) in enumerate(zip(shapes, results)):
        expected = sum(_values(shape, r, tf.float32, offset=i + 1).astype(np.float64)
                       for r in range(size))
        _assert_matches(result, expected, tf.float32)


@pytest.mark.parametrize("mode", ["eager", "function"])
def test_allreduce_variable(mode, rank, size, op_name):
    initial = _values([2, 3], rank, tf.float32)
    var = tf.Variable(initial)

    def fn():
        return bf.allreduce(var, average=True, name=op_name)

    result = (fn() if mode == "eager" else tf.function(fn)()).numpy()
    expected = sum(_values([2, 3], r, tf.float32).astype(np.float64) for r in range(size)) / size
    _assert_matches(result, expected, tf.float32)
    np.testing.assert_array_equal(var.numpy(), initial)  # the variable itself is not changed


@pytest.mark.parametrize("mode", ["eager", "function"])
def test_broadcast_assigns_variable(mode, rank, size, op_name):
    var = tf.Variable(_values([4], rank, tf.int64))
    root = size - 1

    def fn():
        var.assign(bf.broadcast(var, root_rank=root, name=op_name))

    fn() if mode == "eager" else tf.function(fn)()
    np.testing.assert_array_equal(var.numpy(), _values([4], root, tf.int64))


@pytest.mark.parametrize("mode", ["eager", "function"])
@pytest.mark.parametrize("average", [False, True], ids=["sum", "avg"])
def test_allreduce_indexed_slices(mode, average, rank, size, op_name):
    """Each rank contributes rows to a sparse [6, 3] tensor; ranks overlap on some rows."""
    dense_shape = [6, 3]
    num_rows = rank % 3 + 1
    indices = np.array([(rank + 2 * i) % 6 for i in range(num_rows)], np.int64)
    values = rank_values([num_rows, 3], rank, np.float32, offset=1)

    def fn(v, i):
        out = bf.allreduce(tf.IndexedSlices(v, i, dense_shape=tf.constant(dense_shape, tf.int64)),
                           average=average, name=op_name)
        assert isinstance(out, tf.IndexedSlices)
        return out.values, out.indices, tf.convert_to_tensor(out)

    out_values, out_indices, dense = (fn if mode == "eager" else tf.function(fn))(
        tf.constant(values), tf.constant(indices))

    expected = np.zeros(dense_shape)
    all_indices = []
    for r in range(size):
        n = r % 3 + 1
        idx = [(r + 2 * i) % 6 for i in range(n)]
        all_indices += idx
        np.add.at(expected, idx, rank_values([n, 3], r, np.float64, offset=1))
    if average:
        expected /= size
    np.testing.assert_array_equal(out_indices.numpy(), all_indices)  # gathered in rank order
    assert out_values.shape == (len(all_indices), 3)
    _assert_matches(dense.numpy(), expected, tf.float32)


@pytest.mark.parametrize("mode", ["eager", "function"])
@pytest.mark.parametrize("dtype", [tf.int32, tf.int64, tf.float32, tf.float64], ids=str)
@pytest.mark.parametrize("average", [False, True], ids=["sum", "avg"])
def test_allreduce_indexed_slices_with_duplicate_indices_matches_dense(mode, dtype, average, rank,
                                                                       size, op_name):
    """Rows repeat across ranks and within a rank; the sum must equal the dense allreduce,
    the average the dense sum over size (for integers: as floats, Horovod's values / size).

    Rank r sends rows r and r + 1 (so ranks overlap), plus row r a second time.
    """
    dense_shape = [size + 2, 2]
    indices = np.array([rank, rank + 1, rank], np.int64)
    values = np.array([[5, 5 + rank], [5, 7], [3 * rank + 1, 2]]).astype(dtype.as_numpy_dtype)
    dense_in = np.zeros(dense_shape, dtype.as_numpy_dtype)
    np.add.at(dense_in, indices, values)

    def fn(v, i, d):
        sparse = bf.allreduce(tf.IndexedSlices(v, i, dense_shape=tf.constant(dense_shape,
                                                                               tf.int64)),
                              average=average, name=op_name + ".sparse")
        assert isinstance(sparse, tf.IndexedSlices)
        return tf.convert_to_tensor(sparse), bf.allreduce(d, average=average,
                                                          name=op_name + ".dense")

    sparse, dense = (fn if mode == "eager" else tf.function(fn))(
        tf.constant(values), tf.constant(indices), tf.constant(dense_in))
    # The dense allreduce against numpy, then the sparse result against the dense one.
    total = np.zeros(dense_shape)
    for r in range(size):
        np.add.at(total, [r, r + 1, r], np.array([[5, 5 + r], [5, 7], [3 * r + 1, 2]]))
    if average:
        # Dense integer averages truncate; sparse ones divide exactly into floats (Horovod's
        # values / size), after adding the rows of each index.
        sparse_total = total / size
        total = np.trunc(total / size) if dtype.is_integer else total / size
        assert sparse.dtype == (tf.float64 if dtype.is_integer else dtype), sparse.dtype
        np.testing.assert_allclose(sparse.numpy(), sparse_total, rtol=1e-6)
    else:
        _assert_matches(sparse.numpy(), dense.numpy(), dtype)
    _assert_matches(dense.numpy(), total, dtype)


# ----------------------------------------------------------------------------------- allgather


def _gather_shape(rest, rank):
    """Per-rank shape: rank + 1 rows, or for "empty" cases 0 rows on the even ranks."""
    if isinstance(rest, str):
        trailing = [2, 2] if rest.endswith("2x2") else []
        return [0 if rank % 2 == 0 else rank + 1] + trailing
    return [rank + 1] + rest


@pytest.mark.parametrize("mode,dtype,rest", _cases(GATHER_EAGER_CASES, GATHER_SUBSET_CASES))
def test_allgather(mode, dtype, rest, rank, size, op_name):
    mine = _values(_gather_shape(rest, rank), rank, dtype)
    expected = np.concatenate([_values(_gather_shape(rest, r), r, dtype) for r in range(size)])

    result = _run(mode, lambda t: bf.allgather(t, name=op_name), mine)
    if dtype == tf.bool:
        assert result.dtype == np.bool_ and result.shape == expected.shape
        np.testing.assert_array_equal(result, expected)
    else:
        _assert_matches(result, expected.astype(np.float64), dtype)


@pytest.mark.parametrize("mode", MODES)
def test_allgather_several_in_one_call(mode, rank, size, op_name):
    arrays = [_values([rank + 1, 2], rank, tf.float32), _values([size - rank], rank, tf.int32),
              _values([1, 1, 3], rank, tf.bool)]

    def fn(a, b, c):
        return [bf.allgather(a, name=op_name + ".a"), bf.allgather(b, name=op_name + ".b"),
                bf.allgather(c, name=op_name + ".c")]

    results = _run(mode, fn, *arrays)
    expected = [np.concatenate([_values([r + 1, 2], r, tf.float32) for r in range(size)]),
                np.concatenate([_values([size - r], r, tf.int32) for r in range(size)]),
                np.concatenate([_values([1, 1, 3], r, tf.bool) for r in range(size)])]
    for result, exp in zip(results, expected):
        assert result.dtype == exp.dtype
        np.testing.assert_array_equal(result, exp)


@pytest.mark.parametrize("mode", ["eager", "function"])
def test_allgather_variable(mode, rank, size, op_name):
    var = tf.Variable(_values([2, 2], rank, tf.float64))

    def fn():
        return bf.allgather(var, name=op_name)

    result = (fn() if mode == "eager" else tf.function(fn)()).numpy()
    expected = np.concatenate([_values([2, 2], r, tf.float64) for r in range(size)])
    np.testing.assert_array_equal(result, expected)


# ----------------------------------------------------------------------------------- broadcast


@pytest.mark.parametrize("mode,dtype,shape", _cases(BROADCAST_EAGER_CASES, BROADCAST_SUBSET_CASES))
def test_broadcast(mode, dtype, shape, rank, size, op_name):
    mine = _values(shape, rank, dtype)

    def fn(t):
        return [bf.broadcast(t, root_rank=root, name=f"{op_name}.root{root}")
                for root in range(size)]

    results = _run(mode, fn, mine)
    for root, result in enumerate(results):
        expected = _values(shape, root, dtype)
        assert np.asarray(result).dtype == expected.dtype, (root, result.dtype, expected.dtype)
        assert np.shape(result) == expected.shape
        np.testing.assert_array_equal(result, expected, err_msg=f"root_rank {root}")


# ----------------------------------------------------------------------------------- unnamed


@pytest.mark.parametrize("mode", ["eager", "function"])
def test_unnamed_collectives_match_by_call_order(mode, rank, size):
    """Without names, the n-th call of an op on every rank matches the n-th call elsewhere."""
    def fn(a, b):
        return [bf.allreduce(a, average=False), bf.allreduce(b, average=False),
                bf.allgather(b), bf.broadcast(a, root_rank=0)]

    a = _values([3], rank, tf.float32)
    b = _values([2], rank, tf.int32, offset=10)
    s1, s2, g, bc = _run(mode, fn, a, b)
    _assert_matches(s1, sum(_values([3], r, tf.float32).astype(np.float64)
                            for r in range(size)), tf.float32)
    _assert_matches(s2, sum(_values([2], r, tf.int32, offset=10).astype(np.float64)
                            for r in range(size)), tf.int32)
    np.testing.assert_array_equal(g, np.concatenate([_values([2], r, tf.int32, offset=10)
                                                     for r in range(size)]))
    np.testing.assert_array_equal(bc, _values([3], 0, tf.float32))


# ------------------------------------------------------------------ side effects in tf.function


@needs_ranks(2)
def test_collective_with_unused_result_runs_in_function(rank, size, op_name):
    """A collective is a side effect for the other ranks: tf.function must run it even when
    nothing in the function uses its result (as it would for any other stateful op).

    Rank 0 calls such a function; the other ranks submit the same name eagerly from a thread.
    The function returns after its allreduce completed, or at once if TensorFlow pruned it. A
    "returned" allreduce then tells the others that rank 0 is past that point: the runtime
    completes requests in order, so their request has completed by then unless rank 0 never
    submitted it. In that case rank 0 submits it now, which releases them, and the test fails.
    """
    value = np.array([rank + 1.0, 1.0], np.float32)
    out = {}
    if rank == 0:
        @tf.function
        def fn(x):
            bf.allreduce(x, average=False, name=op_name)
            return x + 1

        np.testing.assert_array_equal(fn(tf.constant(value)).numpy(), value + 1)
    else:
        thread = threading.Thread(target=lambda: out.update(r=bf.allreduce(
            tf.constant(value), average=False, name=op_name).numpy()), daemon=True)
        thread.start()
    bf.allreduce(tf.constant(1), name=op_name + ".returned")
    if rank != 0:
        thread.join(5.0)  # only the Python side of a completed request is left to finish
    done = rank == 0 or "r" in out
    completed = int(bf.allreduce(tf.constant(int(done)), average=False, name=op_name + ".done"))
    if completed != size:
        if rank == 0:  # the function never submitted its request: submit it now
            bf.allreduce(tf.constant(value), average=False, name=op_name)
        else:
            thread.join()
        pytest.fail(f"the unused allreduce in tf.function did not run on rank 0 (the other "
                    f"{size - 1} rank(s) waited for it)")
    if rank != 0:
        np.testing.assert_allclose(out["r"], [size * (size + 1) / 2, size])
