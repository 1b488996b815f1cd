"""LearningRateScheduleCallback (alone and chained after LearningRateWarmupCallback, as in
Horovod's examples) and BestModelCheckpoint, in model.fit on every rank.

The model is w * x with x = 1 and loss = mean(prediction): every gradient is exactly 1, so the
learning rate of every batch and the final weight of a momentum SGD (with and without
momentum correction) follow in closed form.
"""

import os
import tempfile

import keras
import numpy as np
import pytest

import bluefog.tensorflow as bf

bfk = bf.keras
STEPS, BATCH, MOMENTUM = 3, 2, 0.9


class RecordLR(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.lrs = []

    def on_train_batch_begin(self, batch, logs=None):
        self.lrs.append(float(np.asarray(self.model.optimizer.learning_rate)))


def mean_prediction(y_true, y_pred):
    return keras.ops.mean(y_pred)


def fit(callbacks, epochs, lr=0.1, momentum=MOMENTUM, **fit_kw):
    model = keras.Sequential([keras.Input((1,)),
                              keras.layers.Dense(1, use_bias=False, kernel_initializer="zeros")])
    opt = bf.DistributedOptimizer(keras.optimizers.SGD(lr, momentum=momentum))
    model.compile(optimizer=opt, loss=mean_prediction)
    record = RecordLR()
    x = np.ones((STEPS * BATCH, 1), np.float32)
    history = model.fit(x, np.zeros_like(x), batch_size=BATCH, epochs=epochs, verbose=0,
                        shuffle=False, callbacks=callbacks + [record], **fit_kw)
    return model, record.lrs, history


def simulate(lrs, correction, momentum=MOMENTUM) -> float:
    """The weight after SGD steps with gradient 1 at the given rates (Goyal's correction:
    the velocity is scaled by new/old at each change)."""
    w = v = 0.0
    for t, lr in enumerate(lrs):
        if correction and t > 0 and lrs[t - 1] > 0:
            v *= lr / lrs[t - 1]
        v = momentum * v - lr
        w += v
    return w


@pytest.mark.parametrize("correction", [True, False])
def test_staircase_schedule_with_momentum_correction(correction):
    cb = bfk.callbacks.LearningRateScheduleCallback(0.1, lambda e: 0.5 ** e, start_epoch=1,
                                                    end_epoch=3, momentum_correction=correction)
    model, lrs, history = fit([cb], epochs=4)
    want = [0.1] * STEPS + [0.05] * STEPS + [0.025] * STEPS + [0.025] * STEPS
    np.testing.assert_allclose(lrs, want, rtol=1e-6)
    np.testing.assert_allclose(model.layers[0].kernel.numpy()[0, 0],
                               simulate(want, correction), rtol=1e-5)
    # the two variants must differ, or the test could not tell them apart
    assert abs(simulate(want, True) - simulate(want, False)) > 1e-3
    np.testing.assert_allclose(history.history["lr"], [0.1, 0.05, 0.025, 0.025], rtol=1e-6)


def test_smooth_schedule():
    cb = bfk.callbacks.LearningRateScheduleCallback(0.2, lambda e: 1.0 + e, staircase=False,
                                                    end_epoch=2)
    model, lrs, _ = fit([cb], epochs=3)
    want = [0.2 * (1 + e + b / STEPS) for e in range(2) for b in range(STEPS)]
    want += [want[-1]] * STEPS
    np.testing.assert_allclose(lrs, want, rtol=1e-6)
    np.testing.assert_allclose(model.layers[0].kernel.numpy()[0, 0], simulate(want, True),
                               rtol=1e-5)


def test_warmup_then_schedule_as_in_horovod_examples():
    n = bf.size()
    callbacks = [bfk.callbacks.LearningRateWarmupCallback(initial_lr=0.1, warmup_epochs=1),
                 bfk.callbacks.LearningRateScheduleCallback(0.1, 1.0, start_epoch=1,
                                                            end_epoch=2),
                 bfk.callbacks.LearningRateScheduleCallback(0.1, 0.1, start_epoch=2)]
    _, lrs, _ = fit(callbacks, epochs=3)
    want = [0.1 / n * (1 + (n - 1) * b / STEPS) for b in range(STEPS)]
    want += [0.1] * STEPS + [0.01] * STEPS
    np.testing.assert_allclose(lrs, want, rtol=1e-6)


@pytest.mark.parametrize("correction", [True, False])
def test_warmup_momentum_correction(correction):
    n = bf.size()
    warmup = bfk.callbacks.LearningRateWarmupCallback(initial_lr=0.1 * n, warmup_epochs=2,
                                                      momentum_correction=correction)
    model, lrs, _ = fit([warmup], epochs=3, lr=0.1 * n)
    want = [0.1 * (1 + (n - 1) * (e + b / STEPS) / 2) for e in range(2) for b in range(STEPS)]
    want += [0.1 * n] * STEPS
    np.testing.assert_allclose(lrs, want, rtol=1e-6)
    # before the first batch the warmup lowers the rate from 0.1 * n: a change like any other
    np.testing.assert_allclose(model.layers[0].kernel.numpy()[0, 0],
                               simulate(want, correction), rtol=1e-5)


def test_schedule_errors():
    with pytest.raises(ValueError, match="multiplier"):
        bfk.callbacks.LearningRateScheduleCallback(0.1, "half")
    with pytest.raises(ValueError, match="end_epoch"):
        bfk.callbacks.LearningRateScheduleCallback(0.1, 1.0, start_epoch=3, end_epoch=3)
    with pytest.raises(ValueError, match="initial_lr"):
        bfk.callbacks.LearningRateScheduleCallback(0.0, 1.0)
    model = keras.Sequential([keras.Input((1,)), keras.layers.Dense(1)])
    sched = keras.optimizers.schedules.ExponentialDecay(0.1, 10, 0.9)
    model.compile(optimizer=bf.DistributedOptimizer(keras.optimizers.SGD(sched)), loss="mse")
    with pytest.raises(ValueError, match="LearningRateSchedule"):
        model.fit(np.ones((2, 1)), np.ones((2, 1)), verbose=0,
                  callbacks=[bfk.callbacks.LearningRateScheduleCallback(0.1, 1.0)])


def test_best_model_checkpoint_written_by_rank_0_only():
    path = os.path.join(tempfile.mkdtemp(), f"best_rank{bf.rank()}.keras")
    cb = bfk.callbacks.BestModelCheckpoint(path, monitor="loss")
    model, _, history = fit([cb], epochs=3, momentum=0.0)
    assert os.path.exists(path) == (bf.rank() == 0)
    if bf.rank() == 0:  # the loss falls every epoch, so the last epoch's model is the best
        saved = keras.models.load_model(path, compile=False)
        np.testing.assert_allclose(saved.layers[0].kernel.numpy(),
                                   model.layers[0].kernel.numpy())
