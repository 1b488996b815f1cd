"""check_replicas, replica_spread and ReplicaCheckCallback: equal replicas pass, a one-ulp
change on one rank is caught and named, mismatched shapes, dtypes and counts fail clearly on
every rank, and decentralized training reports its spread."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import bluefog.tensorflow as bf

from conftest import needs_ranks

SHAPES = [(3, 4), (5,), (2, 3, 2), (7,)]
DTYPES = [tf.float32, tf.float64, tf.float16, tf.float32]


def make_variables(prefix):
    """The same values on every rank (from a fixed seed), one dtype and shape each."""
    rng = np.random.default_rng(7)
    return [tf.Variable(rng.standard_normal(s).astype(d.as_numpy_dtype), name=f"{prefix}{i}")
            for i, (s, d) in enumerate(zip(SHAPES, DTYPES))]


def test_equal_replicas_pass_eager_and_in_function():
    variables = make_variables("eq")
    assert bf.check_replicas(variables, name="replicas.eq") is None
    assert bf.check_replicas(variables[0]) is None  # one variable, an unnamed call
    assert bf.check_replicas([]) is None

    @tf.function
    def checked():
        bf.check_replicas(variables, name="replicas.eq.fn")
        return tf.constant(1)

    assert int(checked()) == 1


@needs_ranks(2)
def test_one_ulp_on_one_rank_is_caught_and_named(rank, size):
    variables = make_variables("ulp")

    @tf.function
    def traced():
        bf.check_replicas(variables, name="replicas.ulp.fn")

    for trial in range(10):
        odd = trial % size
        index = trial % len(variables)
        v = variables[index]
        saved = v.numpy()
        if rank == odd:
            changed = saved.copy().ravel()
            element = (3 * trial) % changed.size
            towards = np.inf if trial % 2 else -np.inf
            changed[element] = np.nextafter(changed[element], towards, dtype=changed.dtype)
            v.assign(changed.reshape(saved.shape))
        # At two ranks neither is the majority: the other rank is named against rank 0.
        named = odd if (size > 2 or odd != 0) else 1
        reference = 0 if named != 0 else 1
        expected = (rf"rank\(s\) \[{named}\] differ from rank {reference}\b.*"
                    rf"first at variable {index} '{v.name}'")
        if trial % 2:
            with pytest.raises(bf.ReplicaMismatchError, match=expected):
                bf.check_replicas(variables, name="replicas.ulp")
        else:
            with pytest.raises(tf.errors.OpError, match=expected):
                traced()
        v.assign(saved)
        bf.check_replicas(variables, name="replicas.ulp.restored")


@needs_ranks(2)
def test_shape_dtype_and_count_mismatches_fail_clearly(rank, size):
    last = size - 1
    base = make_variables("meta")
    other_shape = list(base)
    if rank == last:
        other_shape[2] = tf.Variable(tf.zeros([2, 2, 3], tf.float16), name="meta2")
    with pytest.raises(bf.ReplicaMismatchError,
                       match=rf"\[{last}\] differ.*rank {last}'s variable 2 'meta2:0' is float16 "
                             r"\[2, 2, 3\], rank 0's is float16 \[2, 3, 2\]"):
        bf.check_replicas(other_shape, name="replicas.shape")
    other_dtype = list(base)
    if rank == last:
        other_dtype[1] = tf.Variable(tf.zeros([5], tf.int32), name="meta1")
    with pytest.raises(bf.ReplicaMismatchError, match=rf"rank {last}'s variable 1 'meta1:0' is "
                                                     r"int32 \[5\], rank 0's is float64 \[5\]"):
        bf.check_replicas(other_dtype, name="replicas.dtype")
    fewer = base[:-1] if rank == last else base
    with pytest.raises(bf.ReplicaMismatchError,
                       match=rf"rank {last} passed 3 variables, rank 0 passed 4"):
        bf.check_replicas(fewer, name="replicas.count")
    bf.check_replicas(base, name="replicas.after")  # the runtime is still usable


def test_refuses_what_has_no_bytes():
    with pytest.raises(TypeError, match=r"variable 0 has dtype string"):
        bf.check_replicas([tf.constant(["a"])], name="replicas.string")
    with pytest.raises(TypeError, match="not a variable or tensor"):
        bf.check_replicas([object()], name="replicas.object")


@needs_ranks(3)
def test_process_set_compares_its_ranks_only(rank, size):
    subset = bf.add_process_set([1, 2])
    try:
        if rank in (1, 2):
            v = tf.Variable(np.full([4], 2.0 if rank == 2 else 1.0, np.float32), name="ps")
            with pytest.raises(bf.ReplicaMismatchError,
                               match=r"rank\(s\) \[2\] differ from rank 1\b"):
                bf.check_replicas([v], name="replicas.set", process_set=subset)
    finally:
        bf.remove_process_set(subset)


def test_replica_spread_in_closed_form(rank, size):
    x = tf.Variable(np.full([6], rank + 1.0, np.float32))
    labels = tf.Variable(np.arange(3, dtype=np.int64))  # skipped: not floating point
    zero_mean = tf.Variable(np.full([2], 2.0 * rank - (size - 1), np.float64))
    got = bf.replica_spread([x, labels, zero_mean], name="replicas.spread")
    # mean (size+1)/2; the farthest rank is (size-1)/2 away in every element.
    np.testing.assert_allclose(got[0], (size - 1) / (size + 1), rtol=1e-12)
    # Mean zero: the absolute norm, sqrt(2) * (size - 1) for the farthest rank.
    np.testing.assert_allclose(got[1], np.sqrt(2.0) * (size - 1), rtol=1e-12)
    assert got.shape == (2,)


def _model():
    keras.utils.set_random_seed(3)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3),
                              keras.layers.Dense(1)])
    return model


def _data(rank):
    rng = np.random.default_rng(rank)
    return rng.standard_normal((32, 4)).astype("float32"), rng.standard_normal((32, 1))


class _Nudge(keras.callbacks.Callback):
    """One ulp on the last rank's first kernel after batch 2."""

    def on_train_batch_end(self, batch, logs=None):
        if batch == 2 and bf.rank() == bf.size() - 1:
            w = self.model.trainable_weights[0]
            w.assign(np.nextafter(w.numpy(), np.float32(np.inf)))


def test_callback_checks_and_stops_a_diverged_fit(rank, size):
    x, y = _data(rank)
    model = _model()
    model.compile(optimizer=bf.DistributedOptimizer(keras.optimizers.SGD(0.01)), loss="mse")
    check = bf.keras.callbacks.ReplicaCheckCallback(every_n_batches=2)
    model.fit(x, y, batch_size=8, epochs=1, verbose=0,
              callbacks=[bf.keras.callbacks.BroadcastGlobalVariablesCallback(0), check])
    if size < 2:
        return
    # _Nudge runs first: the check at the end of batch 3 (the 2nd of this fit) sees it.
    with pytest.raises(bf.ReplicaMismatchError,
                       match=rf"\[{size - 1}\] differ.*first at variable 0 "
                             rf"'{model.trainable_weights[0].path}'"):
        model.fit(x, y, batch_size=8, epochs=1, verbose=0, callbacks=[_Nudge(), check])


def test_callback_reports_the_spread_of_decentralized_replicas(rank, size):
    x, y = _data(rank)
    model = _model()
    opt = bf.DistributedAdaptWithCombineOptimizer(keras.optimizers.SGD(0.05),
                                                  communication_type="neighbor_allreduce")
    model.compile(optimizer=opt, loss="mse")
    check = bf.keras.callbacks.ReplicaCheckCallback(every_n_batches=2)
    history = model.fit(x, y, batch_size=8, epochs=2, verbose=0, callbacks=[check])
    spread = history.history["replica_spread"]
    assert len(spread) == 2 and all(np.isfinite(spread))
    assert set(check.spread) == {v.path for v in model.trainable_weights}
    if size == 1:
        assert spread == [0.0, 0.0]
    else:  # each rank steps on its own data after combining: the replicas differ
        assert all(0.0 < s < 1.0 for s in spread)
