"""bluefog.tensorflow.keras: the callbacks and the Keras-facing module, on every rank."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import bluefog.tensorflow as bf
import bluefog.tensorflow.keras as bfk
from bluefog.tensorflow.keras.callbacks import (
    BroadcastGlobalVariablesCallback,
    LearningRateWarmupCallback,
    MetricAverageCallback,
)


def gather_rows(vector):
    v = tf.reshape(tf.constant(np.asarray(vector, dtype=np.float64)), [1, -1])
    return bf.allgather(v).numpy()


def flat(variables):
    return np.concatenate([np.asarray(v).astype(np.float64).ravel() for v in variables])


def assert_same_on_all_ranks(variables):
    rows = gather_rows(flat(variables))
    for r in range(1, rows.shape[0]):
        np.testing.assert_array_equal(rows[r], rows[0], err_msg=f"rank {r} differs from rank 0")


def rank_data(q, n=8):
    rs = np.random.RandomState(7 + q)
    x = rs.uniform(-1, 1, size=(n, 3)).astype(np.float32)
    y = (x.sum(axis=1, keepdims=True) + q).astype(np.float32)
    return x, y


def make_model(seed):
    keras.utils.set_random_seed(seed)
    return keras.Sequential([keras.Input((3,)), keras.layers.Dense(4, activation="relu"),
                             keras.layers.Dense(1)])


class Recorder(keras.callbacks.Callback):
    """Records what it sees, for the checks."""

    def __init__(self):
        super().__init__()
        self.epoch_logs = []
        self.batch_lrs = []

    def on_train_batch_begin(self, batch, logs=None):
        self.batch_lrs.append(float(np.asarray(self.model.optimizer.learning_rate)))

    def on_epoch_end(self, epoch, logs=None):
        self.epoch_logs.append(dict(logs))


def test_module_reexports():
    assert bfk.DistributedOptimizer is bf.DistributedOptimizer
    assert bfk.DistributedGradientTape is bf.DistributedGradientTape
    assert bfk.broadcast_variables is bf.broadcast_variables
    assert bfk.rank() == bf.rank() and bfk.size() == bf.size()
    assert bfk.callbacks.MetricAverageCallback is MetricAverageCallback
    assert bfk.BroadcastGlobalVariablesCallback is BroadcastGlobalVariablesCallback
    assert bf.keras is bfk  # `bf.keras.X` works after `import bluefog.tensorflow as bf`
    assert bf.keras.LearningRateWarmupCallback is LearningRateWarmupCallback
    with pytest.raises(AttributeError):
        bf.no_such_name  # noqa: B018 - the attribute access is what raises


def test_broadcast_callback_syncs_model_and_optimizer(rank, size):
    root = size - 1
    model = make_model(seed=rank)  # different weights on every rank
    opt = keras.optimizers.SGD(learning_rate=0.05, momentum=0.9)
    opt.build(model.trainable_variables)
    # Rank-dependent optimizer state, as after resuming from different checkpoints.
    for v in opt.variables:
        if "momentum" in v.path:
            v.assign(np.full(v.shape, float(rank), dtype=np.float32))
    root_model = make_model(seed=root)
    model.compile(optimizer=bf.DistributedOptimizer(opt), loss="mse")
    x, y = rank_data(rank)
    model.fit(x, y, batch_size=8, epochs=1, verbose=0,
              callbacks=[BroadcastGlobalVariablesCallback(root)])
    assert_same_on_all_ranks(model.get_weights())
    assert_same_on_all_ranks(model.optimizer.variables)
    # After one step from root's state, the weights moved away from root's initial weights
    # by the same (averaged) update on every rank: the momentum was root's.
    before = flat(root_model.get_weights())
    assert not np.array_equal(flat(model.get_weights()), before)


def test_broadcast_callback_broadcasts_once(rank):
    model = make_model(seed=rank)
    model.compile(optimizer=bf.DistributedOptimizer(keras.optimizers.SGD(0.0)), loss="mse")
    cb = BroadcastGlobalVariablesCallback(0)
    x, y = rank_data(rank)
    model.fit(x, y, batch_size=4, epochs=2, verbose=0, callbacks=[cb])
    assert cb._model_done and cb._optimizer_done
    # Learning rate 0: the weights are exactly root 0's initial weights.
    expected = make_model(seed=0).get_weights()
    for a, b in zip(model.get_weights(), expected):
        np.testing.assert_array_equal(a, b)


def test_metric_average_callback(rank, size):
    model = make_model(seed=0)
    model.compile(optimizer=bf.DistributedOptimizer(keras.optimizers.SGD(0.01)), loss="mse",
                  metrics=["mae"])
    x, y = rank_data(rank)
    vx, vy = rank_data(rank + 50, n=4)
    local, averaged = Recorder(), Recorder()
    history = model.fit(x, y, batch_size=8, epochs=2, verbose=0, validation_data=(vx, vy),
                        callbacks=[local, MetricAverageCallback(), averaged])
    keys = sorted(local.epoch_logs[0])
    assert {"loss", "mae", "val_loss", "val_mae"} <= set(keys)
    for epoch in range(2):
        local_values = np.array([local.epoch_logs[epoch][k] for k in keys])
        rows = gather_rows(local_values)
        expected = rows.mean(axis=0)
        got = np.array([averaged.epoch_logs[epoch][k] for k in keys])
        np.testing.assert_allclose(got, expected, rtol=1e-12)
        np.testing.assert_allclose([history.history[k][epoch] for k in keys], expected,
                                   rtol=1e-12)


def test_learning_rate_warmup_callback(rank, size):
    model = make_model(seed=0)
    model.compile(optimizer=bf.DistributedOptimizer(keras.optimizers.SGD(0.123)), loss="mse")
    x, y = rank_data(rank)
    rec = Recorder()
    warmup = LearningRateWarmupCallback(initial_lr=0.4, warmup_epochs=2)
    model.fit(x, y, batch_size=2, epochs=3, verbose=0, callbacks=[warmup, rec])
    steps = 4
    expected = []
    for epoch in range(3):
        for batch in range(steps):
            progress = (epoch + batch / steps) / 2
            expected.append(0.4 if epoch >= 2 else 0.4 / size * (1 + (size - 1) * progress))
    np.testing.assert_allclose(rec.batch_lrs, expected, rtol=1e-6)
    assert rec.batch_lrs[0] == pytest.approx(0.4 / size)
    assert float(np.asarray(model.optimizer.learning_rate)) == pytest.approx(0.4)


@pytest.mark.parametrize("warmup_epochs, initial_epoch", [(0, 0), (1, 2)])
def test_learning_rate_warmup_none_or_already_done(rank, warmup_epochs, initial_epoch):
    """No warmup, or resuming after it: the rate is initial_lr from the first batch."""
    model = make_model(seed=0)
    model.compile(optimizer=bf.DistributedOptimizer(keras.optimizers.SGD(0.01)), loss="mse")
    x, y = rank_data(rank)
    rec = Recorder()
    model.fit(x, y, batch_size=4, epochs=initial_epoch + 1, initial_epoch=initial_epoch,
              verbose=0, callbacks=[LearningRateWarmupCallback(0.3, warmup_epochs), rec])
    np.testing.assert_allclose(rec.batch_lrs, [0.3, 0.3], rtol=1e-6)


def test_learning_rate_warmup_with_loss_scale_optimizer(size):
    model = make_model(seed=0)
    opt = keras.optimizers.LossScaleOptimizer(bf.DistributedOptimizer(keras.optimizers.SGD(0.1)))
    model.compile(optimizer=opt, loss="mse")
    x, y = rank_data(bf.rank())
    rec = Recorder()
    model.fit(x, y, batch_size=4, epochs=1, verbose=0,
              callbacks=[LearningRateWarmupCallback(0.2, warmup_epochs=1,
                                                    steps_per_epoch=2), rec])
    np.testing.assert_allclose(rec.batch_lrs, [0.2 / size, 0.2 / size * (1 + (size - 1) / 2)],
                               rtol=1e-6)
    assert float(np.asarray(opt.learning_rate)) == pytest.approx(0.2)


def test_five_lines_training_keeps_ranks_identical(rank, size):
    """The README recipe: DistributedOptimizer + the three callbacks, rank-dependent data."""
    model = make_model(seed=rank)
    model.compile(optimizer=bf.DistributedOptimizer(keras.optimizers.Adam(0.01 * size)),
                  loss="mse", metrics=["mae"])
    x, y = rank_data(rank)
    callbacks = [BroadcastGlobalVariablesCallback(0), MetricAverageCallback(),
                 LearningRateWarmupCallback(0.01 * size, warmup_epochs=1)]
    history = model.fit(x, y, batch_size=4, epochs=2, verbose=0, callbacks=callbacks)
    assert_same_on_all_ranks(model.get_weights())
    assert_same_on_all_ranks(model.optimizer.variables)
    assert_same_on_all_ranks(history.history["loss"])


def test_callback_bad_arguments(size):
    with pytest.raises(TypeError, match="root_rank"):
        BroadcastGlobalVariablesCallback("0")
    with pytest.raises(ValueError, match="outside"):
        BroadcastGlobalVariablesCallback(size)
    with pytest.raises(ValueError, match="initial_lr"):
        LearningRateWarmupCallback(0.0)
    with pytest.raises(ValueError, match="initial_lr"):
        LearningRateWarmupCallback("0.1")
    with pytest.raises(ValueError, match="warmup_epochs"):
        LearningRateWarmupCallback(0.1, warmup_epochs=-1)
    with pytest.raises(ValueError, match="steps_per_epoch"):
        LearningRateWarmupCallback(0.1, steps_per_epoch=0)


def test_warmup_with_a_schedule_is_a_clear_error(rank):
    schedule = keras.optimizers.schedules.ExponentialDecay(0.1, decay_steps=10, decay_rate=0.9)
    model = make_model(seed=0)
    model.compile(optimizer=bf.DistributedOptimizer(keras.optimizers.SGD(schedule)), loss="mse")
    x, y = rank_data(rank)
    with pytest.raises(ValueError, match="LearningRateSchedule"):
        model.fit(x, y, batch_size=8, epochs=1, verbose=0,
                  callbacks=[LearningRateWarmupCallback(0.1, warmup_epochs=1)])


def test_load_model_bad_path():
    with pytest.raises(ValueError):
        bfk.load_model("/nonexistent/model.keras")
