"""allreduce(op=bf.Min / bf.Max / bf.Product / bf.Sum / bf.Average) on every dtype, both
transport paths (MPI_Allreduce below the ring threshold, bluefog's ring above it), fused
groups, NaN, gradients and mistakes.

Rank r's values are small integers computed from (r, element), so every rank knows every
other rank's input and the expected result exactly, for every dtype.
"""

import numpy as np
import pytest
import tensorflow as tf

import bluefog.tensorflow as bf

from conftest import needs_ranks

SMALL, LARGE = 37, 300_001  # elements: LARGE float32 is over the 1 MiB ring threshold
NUMPY = {"min": np.min, "max": np.max, "product": np.prod}
OPS = {"min": bf.Min, "max": bf.Max, "product": bf.Product}
DTYPES = [tf.uint8, tf.int16, tf.int32, tf.int64, tf.float16, tf.bfloat16, tf.float32,
          tf.float64]


def values(r, n, dtype):
    """In [-3, 3] (in [0, 3] for unsigned types): products over 4 ranks stay exact."""
    v = (np.arange(n) * 3 + r * 5) % 7 - 3
    if dtype.is_unsigned:
        v = np.abs(v)
    return v


def expected(op_name, n, dtype, size):
    return NUMPY[op_name](np.stack([values(r, n, dtype) for r in range(size)]), axis=0)


@pytest.mark.parametrize("n", [SMALL, LARGE])
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("op_name", sorted(OPS))
def test_min_max_product(op_name, dtype, n, rank, size):
    if n == LARGE and dtype not in (tf.float32, tf.int32, tf.bfloat16):
        pytest.skip("the ring path is checked on three dtypes")
    x = tf.cast(tf.constant(values(rank, n, dtype)), dtype)
    got = bf.allreduce(x, op=OPS[op_name], name=f"reduce.{op_name}.{dtype.name}.{n}")
    assert got.dtype == dtype
    np.testing.assert_array_equal(tf.cast(got, tf.float64).numpy(),
                                  expected(op_name, n, dtype, size))


@pytest.mark.parametrize("op_name", sorted(OPS))
def test_in_a_function_and_grouped_with_fusion(op_name, rank, size):
    xs = [tf.constant(values(rank, k + 3, tf.float32), tf.float32) for k in range(6)]
    xs.append(tf.constant(values(rank, 5, tf.int64), tf.int64))

    @tf.function
    def reduce():
        return bf.grouped_allreduce(xs, op=OPS[op_name], name=f"reduce.grouped.{op_name}")

    for _ in range(2):
        for k, got in enumerate(reduce()):
            dtype = xs[k].dtype
            np.testing.assert_array_equal(got.numpy(),
                                          expected(op_name, int(xs[k].shape[0]), dtype, size))


def test_average_and_sum_as_ops(rank, size):
    x = tf.constant([float(rank + 1)])
    assert bf.allreduce(x, op=bf.Sum, name="reduce.sum").numpy()[0] == size * (size + 1) / 2
    assert bf.allreduce(x, average=False, op=bf.Average,
                        name="reduce.average").numpy()[0] == (size + 1) / 2


@pytest.mark.parametrize("n", [SMALL, LARGE])
def test_nan_wins_min_and_max_on_both_paths(n, rank, size):
    """A NaN on the first rank (element 1) and on the last (element 2): whichever operand
    order a path combines them in, the NaN must survive."""
    v = values(rank, n, tf.float32).astype(np.float32)
    if rank == 0:
        v[1] = np.nan
    if rank == size - 1:
        v[2] = np.nan
    for op_name in ("min", "max"):
        got = bf.allreduce(tf.constant(v), op=OPS[op_name], name=f"reduce.nan.{op_name}.{n}")
        got = got.numpy()
        assert np.isnan(got[1]) and np.isnan(got[2]), got[:4]
        want = expected(op_name, n, tf.float32, size)
        keep = (np.arange(n) != 1) & (np.arange(n) != 2)
        np.testing.assert_array_equal(got[keep], want[keep])


@pytest.mark.parametrize("mode", ["eager", "function"])
def test_max_gradient_goes_to_the_ranks_that_hold_it(mode, rank, size):
    """loss_r = sum(c_r * y): element 0's max is on the last rank only; element 1 is a tie."""
    x = tf.Variable([float(rank), 5.0])
    c = tf.constant([rank + 1.0, rank + 2.0])

    def grad():
        with tf.GradientTape() as tape:
            y = bf.allreduce(x, op=bf.Max, name=f"reduce.grad.max.{mode}")
            loss = tf.reduce_sum(c * y)
        return tape.gradient(loss, x)

    if mode == "function":
        grad = tf.function(grad)
    c_sum = np.array([sum(q + 1.0 for q in range(size)), sum(q + 2.0 for q in range(size))])
    want = np.array([c_sum[0] if rank == size - 1 else 0.0, c_sum[1] / size])
    np.testing.assert_allclose(grad().numpy(), want, rtol=1e-6)


def test_product_gradient_with_a_zero(rank, size):
    """d(prod_j x_j)/dx_r = prod_{j != r} x_j, also where some x_j is 0."""
    xs = [[q + 1.0, 0.0 if q == 0 else 2.0] for q in range(size)]
    x = tf.Variable(xs[rank])
    with tf.GradientTape() as tape:
        y = bf.grouped_allreduce([x], op=bf.Product, name="reduce.grad.product")[0]
        loss = tf.reduce_sum(y)
    others = np.array([np.prod([xs[q][e] for q in range(size) if q != rank]) for e in range(2)])
    np.testing.assert_allclose(tape.gradient(loss, x).numpy(), size * others, rtol=1e-6)


def test_mistakes(rank):
    with pytest.raises(ValueError, match=rf"rank {rank}: bluefog allreduce of tensor "
                                         r"'reduce.bad': op must be one of"):
        bf.allreduce(tf.constant([1.0]), op="median", name="reduce.bad")
    slices = tf.IndexedSlices(tf.constant([[1.0]]), tf.constant([0]), tf.constant([2, 1]))
    with pytest.raises(ValueError, match="not defined for tf.IndexedSlices"):
        bf.allreduce(slices, op=bf.Max, name="reduce.bad.slices")
    with pytest.raises(TypeError, match="dtype bool"):
        bf.allreduce(tf.constant([True]), op=bf.Max, name="reduce.bad.bool")


@needs_ranks(2)
def test_ranks_that_disagree_on_the_op_fail_together(rank, size):
    with pytest.raises(tf.errors.FailedPreconditionError,
                       match="ranks disagree on the reduction: rank 0 has max, rank 1 has min"):
        bf.allreduce(tf.constant([1.0]), op=bf.Max if rank == 0 else bf.Min,
                     name="reduce.disagree")
    assert bf.allreduce(tf.constant(1.0), average=False, name="reduce.after").numpy() == size


@needs_ranks(2)
@pytest.mark.parametrize("dtype, value", [(tf.float16, 60000.0), (tf.bfloat16, 3.0e38)],
                         ids=["float16", "bfloat16"])
@pytest.mark.parametrize("n", [4, 700, LARGE], ids=["in-round", "fused", "large"])
def test_16_bit_average_does_not_overflow_when_the_mean_fits(dtype, value, n, rank, size):
    """The sum of every rank's value overflows a 16-bit float although the mean fits: each rank's
    input is divided before the sum (the round's data, a fused group, the large paths)."""
    x = tf.cast(tf.fill([n], value), dtype)
    want = float(tf.cast(x[0], tf.float32))
    outs = [bf.allreduce(x, average=True, name=f"ro.avg16.{dtype.name}.{n}")]
    outs += bf.grouped_allreduce([x, x], average=True, name=f"ro.avg16.g.{dtype.name}.{n}")
    rows = tf.reshape(x[: n - n % size], [size, -1])
    outs.append(bf.reducescatter(rows, op=bf.Average, name=f"ro.avg16.rs.{dtype.name}.{n}"))
    for out in outs:
        got = tf.cast(out, tf.float32).numpy()
        assert np.all(np.isfinite(got)), (dtype.name, n, got[:4])
        np.testing.assert_allclose(got, want, rtol=1e-2 if dtype == tf.bfloat16 else 1e-3)
