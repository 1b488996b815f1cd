"""bf.Compression: floats travel in 16 bits and come back in their own dtype.

The inputs carry marker values that tell the wire type apart: 1 + 2**-20 survives only float32
(and wider), 1 + 2**-9 survives float16 but not bfloat16, and rank + 1 is exact everywhere.
Every rank holds the same markers, so the partial sums and the average stay exact in every
wire type and the expected results are exact.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

import bluefog.tensorflow as bf

FINE, MEDIUM = 1 + 2.0 ** -20, 1 + 2.0 ** -9
# What each marker becomes after a trip through the wire type.
ROUNDED = {"none": (FINE, MEDIUM), "fp16": (1.0, MEDIUM), "bf16": (1.0, 1.0)}
COMPRESSIONS = {"none": bf.Compression.none, "fp16": bf.Compression.fp16,
                "bf16": bf.Compression.bf16}


def markers(rank, dtype=np.float32):
    return np.array([FINE, MEDIUM, rank + 1], dtype=dtype)


def expected(kind, size):
    fine, medium = ROUNDED[kind]
    return np.array([fine, medium, (size + 1) / 2])


def expected_training(kind, size):
    """The tape and the optimizers skip the collective (and so the compressor) on one rank."""
    return expected(kind if size > 1 else "none", size)


@pytest.mark.parametrize("mode", ["eager", "function"])
@pytest.mark.parametrize("kind", sorted(COMPRESSIONS))
def test_allreduce_sends_the_wire_type_and_returns_the_input_dtype(kind, mode, rank, size):
    compression = COMPRESSIONS[kind]

    def reduce(x):
        return bf.allreduce(x, name=f"compress.allreduce.{kind}.{mode}", compression=compression)

    if mode == "function":
        reduce = tf.function(reduce)
    for dtype in (np.float32, np.float64):
        got = reduce(tf.constant(markers(rank, dtype)))
        assert got.dtype == tf.as_dtype(dtype)
        np.testing.assert_array_equal(got.numpy(), expected(kind, size).astype(dtype))


@pytest.mark.parametrize("kind", ["fp16", "bf16"])
def test_integers_and_narrow_floats_are_sent_as_they_are(kind, rank, size):
    compression = COMPRESSIONS[kind]
    ints = bf.allreduce(tf.constant([2 ** 20 + rank], tf.int32), average=False,
                        name=f"compress.int.{kind}", compression=compression)
    assert ints.dtype == tf.int32
    assert ints.numpy()[0] == size * 2 ** 20 + size * (size - 1) // 2
    half = bf.allreduce(tf.constant([MEDIUM], tf.float16), name=f"compress.half.{kind}",
                        compression=compression)
    assert half.dtype == tf.float16 and half.numpy()[0] == np.float16(MEDIUM)


def test_grouped_allreduce_compresses_each_float_and_restores_each_dtype(rank, size):
    tensors = [tf.constant(markers(rank, np.float32)), None,
               tf.constant(markers(rank, np.float64)), tf.constant([rank], tf.int64),
               tf.IndexedSlices(tf.constant([[FINE, rank + 1.0]], tf.float32),
                                tf.constant([rank % 3]), tf.constant([3, 2]))]
    out = bf.grouped_allreduce(tensors, name="compress.grouped", compression=bf.Compression.fp16)
    assert out[1] is None
    assert [t.dtype for t in (out[0], out[2], out[3])] == [tf.float32, tf.float64, tf.int64]
    np.testing.assert_array_equal(out[0].numpy(), expected("fp16", size))
    np.testing.assert_array_equal(out[2].numpy(), expected("fp16", size))
    assert out[3].numpy()[0] == (size - 1) // 2  # integer mean truncates
    assert isinstance(out[4], tf.IndexedSlices) and out[4].values.dtype == tf.float32
    dense = np.zeros((3, 2))
    for q in range(size):
        dense[q % 3] += np.array([1.0, q + 1.0]) / size  # FINE arrives as 1.0
    np.testing.assert_allclose(tf.convert_to_tensor(out[4]).numpy(), dense, rtol=1e-6)


@pytest.mark.parametrize("mode", ["eager", "function"])
def test_tape_averages_through_the_compressor(mode, rank, size):
    v = tf.Variable(np.ones(3, np.float32))
    coef = tf.constant(markers(rank))

    def grad():
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(v * coef)
        tape = bf.DistributedGradientTape(tape, compression=bf.Compression.fp16)
        return tape.gradient(loss, v)

    if mode == "function":
        grad = tf.function(grad)
    g = grad()
    assert g.dtype == tf.float32
    np.testing.assert_array_equal(g.numpy(), expected_training("fp16", size))


def test_keras_optimizer_applies_the_compressed_average(rank, size):
    v = tf.Variable(np.zeros(3, np.float32))
    opt = bf.DistributedOptimizer(keras.optimizers.SGD(learning_rate=1.0),
                                  compression=bf.Compression.bf16)
    opt.apply_gradients([(tf.constant(markers(rank)), v)])
    np.testing.assert_array_equal(v.numpy(), -expected_training("bf16", size))


def test_v1_optimizer_compresses(rank, size):
    graph = tf.Graph()
    with graph.as_default():
        v = tf.compat.v1.Variable(np.ones(3, np.float32), use_resource=True)
        loss = tf.reduce_sum(v * tf.constant(markers(rank)))
        opt = bf.DistributedOptimizer(tf.compat.v1.train.GradientDescentOptimizer(1.0),
                                      compression=bf.Compression.fp16)
        (g, _), = opt.compute_gradients(loss, var_list=[v])
    with tf.compat.v1.Session(graph=graph) as sess:
        sess.run(tf.compat.v1.variables_initializer([v]))
        np.testing.assert_array_equal(sess.run(g), expected_training("fp16", size))


class HalveOnTheWire:
    """A user compressor: sends x / 2 and doubles the result."""

    calls = 0

    @classmethod
    def compress(cls, tensor):
        cls.calls += 1
        return tensor / 2, "halved"

    @staticmethod
    def decompress(tensor, context):
        assert context == "halved"
        return tensor * 2


def test_a_user_compressor_is_used(rank, size):
    got = bf.allreduce(tf.constant([rank + 1.0]), average=False, name="compress.user",
                       compression=HalveOnTheWire)
    assert HalveOnTheWire.calls == 1
    assert got.numpy()[0] == size * (size + 1) / 2


@pytest.mark.skipif(bf.size() < 2, reason="needs 2 ranks")
def test_ranks_that_disagree_on_compression_get_an_error_not_a_hang(rank, size):
    compression = bf.Compression.fp16 if rank == 0 else bf.Compression.none
    v = tf.Variable(np.ones(3, np.float32))
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(v * v)
    with pytest.raises(tf.errors.FailedPreconditionError,
                       match="ranks disagree on the dtype: rank 0 has float16, rank 1 has "
                             "float32.*same compression"):
        bf.DistributedGradientTape(tape, compression=compression).gradient(loss, v)
    assert bf.allreduce(tf.constant(1.0), average=False, name="compress.mixed.after").numpy() \
        == size


def test_bad_compression_names_the_call(rank):
    with pytest.raises(TypeError, match=rf"rank {rank}: bluefog allreduce of tensor "
                                        r"'compress.bad': compression must be"):
        bf.allreduce(tf.constant([1.0]), name="compress.bad", compression="fp16")
    with pytest.raises(TypeError, match="DistributedGradientTape: compression must be"):
        bf.DistributedGradientTape(tf.GradientTape(), compression=16)
    with pytest.raises(TypeError, match="DistributedOptimizer: compression must be"):
        bf.DistributedOptimizer(keras.optimizers.SGD(), compression="fp16")
    # The failed call sent nothing: the next collective still matches on every rank.
    assert bf.allreduce(tf.constant(1.0), average=False, name="compress.after").numpy() == \
        bf.size()
