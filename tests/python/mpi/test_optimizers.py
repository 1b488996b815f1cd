"""DistributedGradientTape and DistributedOptimizer on every rank (broadcast_variables:
test_broadcast_variables.py).

Every rank's data is a closed-form function of its rank, so each rank can compute what every
other rank computes, and so the expected averaged result, by itself.
"""

import os

import keras
import numpy as np
import pytest
import tensorflow as tf

import bluefog.tensorflow as bf
import bluefog.tensorflow.keras as bfk

from conftest import assert_same_on_all_ranks, mean_factor

W = np.array([1.0, -2.0, 0.5], dtype=np.float32)


# ------------------------------------------------------------------------------------------
# DistributedGradientTape
# ------------------------------------------------------------------------------------------

def test_tape_eager_averages_and_keeps_none(rank, size):
    v = tf.Variable(W)
    unused = tf.Variable(1.0)
    with tf.GradientTape() as tape:
        loss = (rank + 1) * tf.reduce_sum(v * v)
    tape = bf.DistributedGradientTape(tape)
    g_v, g_unused = tape.gradient(loss, [v, unused])
    assert g_unused is None
    np.testing.assert_allclose(g_v.numpy(), mean_factor(size) * 2 * W, rtol=1e-6)


def test_tape_in_tf_function_nested_sources(rank, size):
    a = tf.Variable(W)
    b = tf.Variable(3.0)

    @tf.function
    def grads(x):
        with bf.DistributedGradientTape(tf.GradientTape()) as tape:
            loss = x * tf.reduce_sum(a) + x * x * b
        return tape.gradient(loss, {"a": a, "b": [b]})

    x = tf.constant(float(rank + 1))
    g = grads(x)
    np.testing.assert_allclose(g["a"].numpy(), mean_factor(size) * np.ones(3), rtol=1e-6)
    mean_sq = np.mean([(q + 1) ** 2 for q in range(size)])
    np.testing.assert_allclose(g["b"][0].numpy(), mean_sq, rtol=1e-6)
    # A second call reuses the trace, with the same request names.
    np.testing.assert_allclose(grads(x)["a"].numpy(), mean_factor(size) * np.ones(3), rtol=1e-6)


def test_tape_persistent_and_watch_accessed_variables_false(rank, size):
    v = tf.Variable(W)
    t = tf.constant(W)
    with tf.GradientTape(persistent=True, watch_accessed_variables=False) as raw:
        raw.watch(t)
        loss = (rank + 1) * tf.reduce_sum(t * t) + tf.reduce_sum(v)
    tape = bf.DistributedGradientTape(raw)
    assert tape.gradient(loss, v) is None  # not watched
    g1 = tape.gradient(loss, t)
    g2 = tape.gradient(loss, t)  # persistent: allowed twice
    expected = mean_factor(size) * 2 * W
    np.testing.assert_allclose(g1.numpy(), expected, rtol=1e-6)
    np.testing.assert_allclose(g2.numpy(), expected, rtol=1e-6)
    assert list(raw.watched_variables()) == []
    del raw


def test_tape_non_persistent_used_twice_raises(rank):
    v = tf.Variable(W)
    with tf.GradientTape() as raw:
        loss = tf.reduce_sum(v * v)
    tape = bf.DistributedGradientTape(raw)
    tape.gradient(loss, v)
    with pytest.raises(RuntimeError):
        tape.gradient(loss, v)


def test_tape_indexed_slices_stay_indexed_slices(rank, size):
    table = tf.Variable(np.zeros((5, 2), dtype=np.float32))
    idx = tf.constant([rank % 5, (rank + 2) % 5])
    with tf.GradientTape() as tape:
        loss = (rank + 1) * tf.reduce_sum(tf.gather(table, idx))
    g = bf.DistributedGradientTape(tape).gradient(loss, table)
    assert isinstance(g, tf.IndexedSlices)
    expected = np.zeros((5, 2))
    for q in range(size):
        for i in (q % 5, (q + 2) % 5):
            expected[i] += (q + 1) / size
    np.testing.assert_allclose(tf.convert_to_tensor(g).numpy(), expected, rtol=1e-6)


@pytest.mark.parametrize("mode", ["eager", "function"])
def test_tape_sparse_as_dense(mode, rank, size):
    table = tf.Variable(np.zeros((5, 2), dtype=np.float32))
    idx = tf.constant([rank % 5, (rank + 2) % 5])

    def grad():
        with tf.GradientTape() as tape:
            loss = (rank + 1) * tf.reduce_sum(tf.gather(table, idx))
        return bf.DistributedGradientTape(tape, sparse_as_dense=True).gradient(loss, table)

    g = tf.function(grad)() if mode == "function" else grad()
    assert isinstance(g, tf.Tensor) and not isinstance(g, tf.IndexedSlices)
    expected = np.zeros((5, 2))
    for q in range(size):
        for i in (q % 5, (q + 2) % 5):
            expected[i] += (q + 1) / size
    np.testing.assert_allclose(g.numpy(), expected, rtol=1e-6)


def test_optimizer_sparse_as_dense(rank, size):
    table = tf.Variable(np.zeros((3, 2), dtype=np.float32))
    opt = bf.DistributedOptimizer(keras.optimizers.SGD(1.0), sparse_as_dense=True)
    grad = tf.IndexedSlices(tf.constant([[rank + 1.0, 1.0]]), tf.constant([rank % 3]),
                            tf.constant([3, 2]))
    opt.apply_gradients([(grad, table)])
    expected = np.zeros((3, 2))
    for q in range(size):
        expected[q % 3] -= np.array([q + 1.0, 1.0]) / size
    np.testing.assert_allclose(table.numpy(), expected, rtol=1e-6)
    with pytest.raises(TypeError, match="sparse_as_dense must be a bool"):
        bf.DistributedOptimizer(keras.optimizers.SGD(1.0), sparse_as_dense="yes")


def test_tape_retrace_on_some_ranks_only(rank, size):
    """A tf.function retraced on some ranks only (a smaller last batch) uses the same names."""
    v = tf.Variable(W)

    @tf.function
    def grad(x):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(x * v)
        return bf.DistributedGradientTape(tape).gradient(loss, v)

    grad(tf.ones([4, 3]))
    rows = 4 if rank == 0 else 3  # a new shape, so a new trace, on every rank but 0
    g = grad(tf.ones([rows, 3]))
    expected = np.mean([4 if q == 0 else 3 for q in range(size)])
    np.testing.assert_allclose(g.numpy(), expected * np.ones(3), rtol=1e-6)


def test_tape_bad_arguments():
    with pytest.raises(ValueError, match="expected a tf.GradientTape"):
        bf.DistributedGradientTape("tape")
    with pytest.raises(ValueError, match="not the class"):
        bf.DistributedGradientTape(tf.GradientTape)
    wrapped = bf.DistributedGradientTape(tf.GradientTape())
    with pytest.raises(ValueError, match="already"):
        bf.DistributedGradientTape(wrapped)
    with pytest.raises(TypeError, match="device"):
        bf.DistributedGradientTape(tf.GradientTape(), device=3)


# ------------------------------------------------------------------------------------------
# DistributedOptimizer (Keras 3)
# ------------------------------------------------------------------------------------------

def test_optimizer_apply_gradients_averages(rank, size):
    v = tf.Variable(W)
    opt = bf.DistributedOptimizer(keras.optimizers.SGD(learning_rate=0.5))
    assert isinstance(opt, keras.optimizers.SGD)
    grad = tf.constant((rank + 1) * W)
    opt.apply_gradients([(grad, v)])
    np.testing.assert_allclose(v.numpy(), W - 0.5 * mean_factor(size) * W, rtol=1e-6)
    assert int(opt.iterations.numpy()) == 1


def test_optimizer_defaults_config_and_learning_rate():
    base = keras.optimizers.Adam(learning_rate=0.01, beta_1=0.8, clipnorm=1.0)
    opt = bf.DistributedOptimizer(base)
    assert opt._bluefog_prefix.split(".")[0] == "DistributedAdam"
    assert bf.DistributedOptimizer(keras.optimizers.SGD(0.1), name="mine")._bluefog_prefix == "mine"
    assert opt.get_config() == base.get_config()
    restored = keras.optimizers.Adam.from_config(opt.get_config())
    assert type(restored) is keras.optimizers.Adam
    opt.learning_rate = 0.25
    assert float(opt.learning_rate.numpy()) == pytest.approx(0.25)


def test_optimizer_keeps_learning_rate_schedule(rank, size):
    schedule = keras.optimizers.schedules.ExponentialDecay(0.1, decay_steps=1, decay_rate=0.5)
    opt = bf.DistributedOptimizer(keras.optimizers.SGD(learning_rate=schedule))
    assert opt._learning_rate is schedule
    v = tf.Variable(W)
    for _ in range(2):
        opt.apply([tf.constant((rank + 1) * W)], [v])
    # Steps with lr 0.1 then 0.05 on the mean gradient.
    np.testing.assert_allclose(v.numpy(), W - 0.15 * mean_factor(size) * W, rtol=1e-6)
    assert float(opt.learning_rate.numpy()) == pytest.approx(0.025)


def test_optimizer_wrapping_a_built_optimizer_keeps_state():
    v = tf.Variable(W)
    base = keras.optimizers.SGD(0.1, momentum=0.9)
    base.apply([tf.constant(W)], [v])
    opt = bf.DistributedOptimizer(base)
    assert opt.built
    for a, b in zip(base.variables, opt.variables):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_two_optimizers_of_one_class_in_one_step(rank, size):
    """Two DistributedAdam in one tf.function: their requests must not collide."""
    a, b = tf.Variable(W), tf.Variable(-W)
    opt_a = bf.DistributedOptimizer(keras.optimizers.SGD(0.5))
    opt_b = bf.DistributedOptimizer(keras.optimizers.SGD(0.5))

    @tf.function
    def step():
        opt_a.apply([(rank + 1) * tf.ones(3)], [a])
        opt_b.apply([(rank + 1) * tf.ones(3)], [b])

    step()
    np.testing.assert_allclose(a.numpy(), W - 0.5 * mean_factor(size), rtol=1e-6)
    np.testing.assert_allclose(b.numpy(), -W - 0.5 * mean_factor(size), rtol=1e-6)


def test_extra_plain_optimizers_on_some_ranks(rank, size):
    """Recent Keras numbers every optimizer a process makes; the collectives' names
    must not depend on it, or one extra optimizer on some ranks would stall the next step."""
    for _ in range(rank):
        keras.optimizers.SGD(0.1)  # a plain optimizer this rank makes and drops
    v = tf.Variable(W)
    opt = bf.DistributedOptimizer(keras.optimizers.SGD(learning_rate=0.5))
    opt.apply([tf.constant((rank + 1) * W)], [v])
    np.testing.assert_allclose(v.numpy(), W - 0.5 * mean_factor(size) * W, rtol=1e-6)
    assert len(set(bf.allgather_object(opt._bluefog_prefix))) == 1


def test_optimizer_bad_arguments():
    with pytest.raises(ValueError, match="optimizer name string"):
        bf.DistributedOptimizer("sgd")
    with pytest.raises(ValueError, match="not the class"):
        bf.DistributedOptimizer(keras.optimizers.SGD)
    with pytest.raises(ValueError, match="expected a keras.optimizers.Optimizer"):
        bf.DistributedOptimizer(42)
    with pytest.raises(ValueError, match="already distributed"):
        bf.DistributedOptimizer(bf.DistributedOptimizer(keras.optimizers.SGD(0.1)))
    with pytest.raises(ValueError, match="name"):
        bf.DistributedOptimizer(keras.optimizers.SGD(0.1), name="")
    with pytest.raises(ValueError, match="use_locking"):
        bf.DistributedOptimizer(keras.optimizers.SGD(0.1), use_locking="yes")
    with pytest.raises(TypeError, match="device"):
        bf.DistributedOptimizer(keras.optimizers.SGD(0.1), device=0)


# ------------------------------------------------------------------------------------------
# model.fit == single-process training on the averaged gradients
# ------------------------------------------------------------------------------------------

N_SAMPLES = 12


def rank_data(q):
    """Rank q's training data: a closed-form function of q."""
    rs = np.random.RandomState(100 + q)
    x = rs.uniform(-1, 1, size=(N_SAMPLES, 3)).astype(np.float32)
    y = (x @ np.array([[1.0], [-1.0], [2.0]]) + 0.3 * q).astype(np.float32)
    return x, y


def make_model(seed=1234):
    keras.utils.set_random_seed(seed)
    return keras.Sequential([keras.Input((3,)), keras.layers.Dense(4, activation="tanh"),
                             keras.layers.Dense(1)])


def reference_weights(make_optimizer, steps, size, seed=1234):
    """Full-batch training of one model on the mean of every rank's gradient."""
    model = make_model(seed)
    opt = make_optimizer()
    loss_fn = keras.losses.MeanSquaredError()
    data = [rank_data(q) for q in range(size)]
    for _ in range(steps):
        per_rank = []
        for x, y in data:
            with tf.GradientTape() as tape:
                loss = loss_fn(y, model(x, training=True))
            per_rank.append(tape.gradient(loss, model.trainable_variables))
        mean = [tf.add_n(list(gs)) / size for gs in zip(*per_rank)]
        opt.apply_gradients(zip(mean, model.trainable_variables))
    return model.get_weights()


OPTIMIZERS = {
    "sgd": lambda: keras.optimizers.SGD(learning_rate=0.1, momentum=0.5),
    "adam": lambda: keras.optimizers.Adam(learning_rate=0.05),
}


@pytest.mark.parametrize("opt_name, run_eagerly", [("adam", False), ("sgd", False),
                                                     ("sgd", True)])
def test_fit_matches_training_on_averaged_gradients(rank, size, opt_name, run_eagerly):
    make_optimizer = OPTIMIZERS[opt_name]
    model = make_model()
    model.compile(optimizer=bf.DistributedOptimizer(make_optimizer()), loss="mse",
                  run_eagerly=run_eagerly)
    x, y = rank_data(rank)
    steps = 3
    model.fit(x, y, batch_size=N_SAMPLES, epochs=steps, shuffle=False, verbose=0)
    assert_same_on_all_ranks(model.get_weights())
    expected = reference_weights(make_optimizer, steps, size)
    for got, want in zip(model.get_weights(), expected):
        np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-6)


def _keras_accumulates_differently() -> bool:
    """Keras before 3.5: bluefog refuses gradient accumulation (see compat.py)."""
    from bluefog.tensorflow import compat

    return compat.keras_version() < compat.KERAS_FOR_ACCUMULATION


@pytest.mark.parametrize("run_eagerly", [False, True])
def test_fit_with_backward_passes_per_step(rank, size, run_eagerly):
    """Two half batches accumulated per update: the same as full-batch training on the mean
    gradient (MSE over equal halves), with one allreduce per update."""
    make_optimizer = OPTIMIZERS["adam"]
    if _keras_accumulates_differently():
        with pytest.raises(ValueError, match=r"needs Keras >= 3\.5, but Keras 3\.\d"):
            bf.DistributedOptimizer(make_optimizer(), backward_passes_per_step=2)
        return
    model = make_model()
    opt = bf.DistributedOptimizer(make_optimizer(), backward_passes_per_step=2)
    assert opt.gradient_accumulation_steps == 2
    model.compile(optimizer=opt, loss="mse", run_eagerly=run_eagerly)
    x, y = rank_data(rank)
    steps = 2
    model.fit(x, y, batch_size=N_SAMPLES // 2, epochs=steps, shuffle=False, verbose=0)
    assert_same_on_all_ranks(model.get_weights())
    for got, want in zip(model.get_weights(), reference_weights(make_optimizer, steps, size)):
        np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-6)


def test_accumulating_optimizer_communicates_on_update_steps_only(rank, size, monkeypatch):
    from bluefog.tensorflow import averaging

    calls = []
    average = averaging.average_gradients
    monkeypatch.setattr(averaging, "average_gradients",
                        lambda *a, **k: calls.append(1) or average(*a, **k))
    v = tf.Variable(W)
    if _keras_accumulates_differently():
        with pytest.raises(ValueError, match=r"pip install 'keras>=3\.5'"):
            bf.DistributedOptimizer(keras.optimizers.SGD(1.0, gradient_accumulation_steps=3))
        return
    # Created with Keras' own option: the same behaviour as backward_passes_per_step=3.
    opt = bf.DistributedOptimizer(keras.optimizers.SGD(1.0, gradient_accumulation_steps=3))
    for k in (1, 2, 3):
        opt.apply_gradients([(tf.constant(k * (rank + 1) * W), v)])
        assert len(calls) == (1 if k == 3 else 0)
        if k < 3:
            np.testing.assert_array_equal(v.numpy(), W)
    # The mean over 3 steps (k = 1, 2, 3: mean 2) of the mean over ranks.
    np.testing.assert_allclose(v.numpy(), W - 2 * mean_factor(size) * W, rtol=1e-6)


def test_backward_passes_per_step_bad_arguments():
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="backward_passes_per_step must be an int"):
            bf.DistributedOptimizer(keras.optimizers.SGD(0.1), backward_passes_per_step=bad)
    with pytest.raises(ValueError, match="needs a Keras optimizer"):
        bf.DistributedOptimizer(tf.compat.v1.train.GradientDescentOptimizer(0.1),
                                backward_passes_per_step=2)
    with pytest.raises(ValueError, match="give one of them"):
        bf.DistributedOptimizer(keras.optimizers.SGD(0.1, gradient_accumulation_steps=3),
                                backward_passes_per_step=2)
    built = keras.optimizers.SGD(0.1)
    built.build([tf.Variable(W)])
    with pytest.raises(ValueError, match="before it is built"):
        bf.DistributedOptimizer(built, backward_passes_per_step=2)


def test_loss_scale_optimizer_around_distributed_optimizer(rank, size):
    make_optimizer = OPTIMIZERS["sgd"]
    model = make_model()
    opt = keras.optimizers.LossScaleOptimizer(bf.DistributedOptimizer(make_optimizer()),
                                              initial_scale=64.0)
    model.compile(optimizer=opt, loss="mse")
    x, y = rank_data(rank)
    model.fit(x, y, batch_size=N_SAMPLES, epochs=2, shuffle=False, verbose=0)
    assert_same_on_all_ranks(model.get_weights())
    for got, want in zip(model.get_weights(), reference_weights(make_optimizer, 2, size)):
        np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-6)


def test_distributed_loss_scale_optimizer_skips_overflow_on_every_rank(rank, size):
    """Wrapping the LossScaleOptimizer itself: a non-finite gradient on one rank makes the
    averaged gradient non-finite everywhere, so every rank skips the step and halves the scale
    together (no rank waits for the others)."""
    v = tf.Variable(W)
    opt = bf.DistributedOptimizer(keras.optimizers.LossScaleOptimizer(
        keras.optimizers.SGD(0.5), initial_scale=8.0))
    bad = np.inf if rank == size - 1 else 1.0
    opt.apply([tf.constant(W * bad)], [v])
    np.testing.assert_array_equal(v.numpy(), W)  # step skipped on every rank
    assert float(opt.dynamic_scale.numpy()) == 4.0
    # A finite step afterwards: the mean of (q + 1) * scale * W, unscaled by the scale.
    scale = float(opt.dynamic_scale.numpy())
    before = v.numpy()
    opt.apply([tf.constant((rank + 1) * scale * W)], [v])
    np.testing.assert_allclose(v.numpy(), before - 0.5 * mean_factor(size) * W, rtol=1e-6)


@pytest.mark.parametrize("in_function", [False, True])
def test_loss_scale_around_distributed_agrees_on_overflow(rank, size, in_function):
    """LossScaleOptimizer(DistributedOptimizer(opt)) with a non-finite gradient on one rank
    only: every rank skips the step (none waits alone in the allreduce), then all step."""
    v = tf.Variable(W)
    opt = keras.optimizers.LossScaleOptimizer(bf.DistributedOptimizer(keras.optimizers.SGD(0.5)),
                                              initial_scale=8.0)
    apply = tf.function(opt.apply) if in_function else opt.apply
    bad = np.float32(np.inf if rank == size - 1 else 1.0)
    apply([tf.constant(W * bad)], [v])
    np.testing.assert_array_equal(v.numpy(), W)
    assert float(opt.dynamic_scale.numpy()) == 4.0
    apply([tf.constant((rank + 1) * 4.0 * W)], [v])
    np.testing.assert_allclose(v.numpy(), W - 0.5 * mean_factor(size) * W, rtol=1e-6)


def test_mixed_float16_policy_fit(rank, size):
    """Under mixed_float16, compile wraps the optimizer in a LossScaleOptimizer by itself."""
    previous = keras.config.dtype_policy()
    keras.config.set_dtype_policy("mixed_float16")
    try:
        model = make_model(seed=rank)
        model.compile(optimizer=bf.DistributedOptimizer(keras.optimizers.SGD(0.05)), loss="mse")
        assert isinstance(model.optimizer, keras.optimizers.LossScaleOptimizer)
        x, y = rank_data(rank)
        model.fit(x, y, batch_size=4, epochs=1, shuffle=False, verbose=0,
                  callbacks=[bfk.callbacks.BroadcastGlobalVariablesCallback(0)])
    finally:
        keras.config.set_dtype_policy(previous)
    assert_same_on_all_ranks(model.get_weights())


def test_fit_with_sparse_embedding_gradients(rank, size):
    """Embedding gradients are IndexedSlices: reduced by allgather, ranks stay identical."""
    keras.utils.set_random_seed(5)
    model = keras.Sequential([keras.Input((2,), dtype="int32"), keras.layers.Embedding(10, 3),
                              keras.layers.Flatten(), keras.layers.Dense(1)])
    model.compile(optimizer=bf.DistributedOptimizer(keras.optimizers.SGD(0.1)), loss="mse")
    rows = 3 + rank  # a different number of looked-up rows on every rank
    x = (np.arange(2 * rows).reshape(rows, 2) + rank) % 10
    y = np.ones((rows, 1), dtype=np.float32) * rank
    model.fit(x, y, batch_size=rows, epochs=2, shuffle=False, verbose=0)
    assert_same_on_all_ranks(model.get_weights())


def test_save_and_load(rank, size, tmp_path):
    model = make_model()
    model.compile(optimizer=bf.DistributedOptimizer(keras.optimizers.Adam(0.05)), loss="mse")
    x, y = rank_data(rank)
    model.fit(x, y, batch_size=N_SAMPLES, epochs=1, shuffle=False, verbose=0)
    path = os.path.join(str(tmp_path), f"model_rank{rank}.keras")
    model.save(path)

    plain = keras.models.load_model(path)
    assert type(plain.optimizer) is keras.optimizers.Adam
    for a, b in zip(plain.get_weights(), model.get_weights()):
        np.testing.assert_array_equal(a, b)

    loaded = bfk.load_model(path)
    assert isinstance(loaded.optimizer, keras.optimizers.Adam)
    assert type(loaded.optimizer) is not keras.optimizers.Adam  # wrapped again
    for a, b in zip(loaded.optimizer.variables, model.optimizer.variables):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    # Both continue identically: the loaded one still averages.
    model.fit(x, y, batch_size=N_SAMPLES, epochs=1, shuffle=False, verbose=0)
    loaded.fit(x, y, batch_size=N_SAMPLES, epochs=1, shuffle=False, verbose=0)
    for a, b in zip(loaded.get_weights(), model.get_weights()):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
    assert_same_on_all_ranks(loaded.get_weights())
