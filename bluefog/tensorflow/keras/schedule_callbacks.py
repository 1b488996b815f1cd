"""Horovod's remaining Keras callbacks: ``LearningRateScheduleCallback`` and
``BestModelCheckpoint`` (re-exported by ``bluefog.tensorflow.keras.callbacks``)."""

from __future__ import annotations

import math
import numbers
from typing import Callable, Optional, Union

import keras
import numpy as np

from bluefog.common import basics

__all__ = ["LearningRateScheduleCallback", "BestModelCheckpoint", "rescale_momentum"]


def _optimizer_of(model, what: str):
    optimizer = getattr(model, "optimizer", None)
    if optimizer is None:
        raise ValueError(f"bluefog {what}: the model has no optimizer; compile it first")
    return optimizer


def current_lr(optimizer, what: str) -> float:
    """The optimizer's learning rate as a float; ValueError for a schedule."""
    if isinstance(getattr(optimizer, "_learning_rate", None),
                  keras.optimizers.schedules.LearningRateSchedule):
        raise ValueError(f"bluefog {what}: the optimizer's learning rate is a "
                         "LearningRateSchedule, which this callback cannot set; create the "
                         "optimizer with a float learning_rate")
    return float(np.asarray(optimizer.learning_rate))


def rescale_momentum(optimizer, ratio: float) -> bool:
    """Goyal et al.'s momentum correction for a learning-rate change by ``ratio`` (new / old).

    Horovod multiplies SGD's momentum coefficient by ``ratio`` for the one batch after the
    change. Keras 3 compiles the coefficient into the train function as a constant, so the same
    update is obtained by multiplying SGD's velocity variables by ``ratio`` once (identical for
    plain momentum: ``v = momentum * ratio * v - new_lr * g``; with ``nesterov=True`` the
    correction reaches the variable one step later). Other optimizers are left alone. Returns
    whether velocities were rescaled.
    """
    inner = getattr(optimizer, "inner_optimizer", None)  # LossScaleOptimizer
    if inner is not None:
        optimizer = inner
    if not isinstance(optimizer, keras.optimizers.SGD) or not optimizer.momentum:
        return False
    if ratio == 1.0 or not getattr(optimizer, "built", False):
        return False
    for m in optimizer.momentums:
        m.assign(m * ratio)
    return True


class LearningRateScheduleCallback(keras.callbacks.Callback):
    """Sets the learning rate to ``initial_lr * multiplier(epoch)`` between two epochs (Horovod's).

    From epoch ``start_epoch`` (inclusive) to ``end_epoch`` (exclusive; None: to the end):

    * ``staircase=True``: at the first batch of every epoch ``e``,
      ``lr = initial_lr * multiplier(e)``;
    * ``staircase=False``: at every batch ``b`` of epoch ``e``,
      ``lr = initial_lr * multiplier(e + b / steps_per_epoch)`` (fractional epochs).

    ``multiplier`` is a number (a constant factor) or a function of the epoch. Outside the range
    the callback leaves the rate alone, so several of them can be chained, as Horovod's examples
    do after ``LearningRateWarmupCallback``::

        callbacks=[bfk.callbacks.LearningRateWarmupCallback(initial_lr=lr, warmup_epochs=5),
                   bfk.callbacks.LearningRateScheduleCallback(lr, 1.0, start_epoch=5,
                                                              end_epoch=30),
                   bfk.callbacks.LearningRateScheduleCallback(lr, 1e-1, start_epoch=30,
                                                              end_epoch=60),
                   bfk.callbacks.LearningRateScheduleCallback(lr, 1e-2, start_epoch=60)]

    ``momentum_correction`` (default True): when the rate changes from ``old`` to ``new``, the
    velocity of a momentum ``SGD`` is multiplied by ``new / old`` (see ``rescale_momentum``).
    ``steps_per_epoch`` defaults to what ``fit`` reports; it is needed for
    ``staircase=False``. The epoch-end logs get an ``lr`` entry. Needs an optimizer with a float
    learning rate, not a schedule.
    """

    def __init__(self, initial_lr: float, multiplier: Union[float, Callable[[float], float]],
                 start_epoch: int = 0, end_epoch: Optional[int] = None, staircase: bool = True,
                 momentum_correction: bool = True, steps_per_epoch: Optional[int] = None,
                 verbose: int = 0):
        super().__init__()
        what = "LearningRateScheduleCallback"
        if isinstance(initial_lr, bool) or not isinstance(initial_lr, numbers.Real) \
                or not math.isfinite(initial_lr) or initial_lr <= 0:
            raise ValueError(f"bluefog {what}: initial_lr must be a positive number, got "
                             f"{initial_lr!r}")
        if callable(multiplier):
            self.multiplier = multiplier
        elif isinstance(multiplier, numbers.Real) and not isinstance(multiplier, bool):
            factor = float(multiplier)
            self.multiplier = lambda epoch: factor
        else:
            raise ValueError(f"bluefog {what}: multiplier must be a number or a function of the "
                             f"epoch, got {multiplier!r}")
        for label, value, allow_none in (("start_epoch", start_epoch, False),
                                         ("end_epoch", end_epoch, True)):
            if value is None and allow_none:
                continue
            if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 0:
                raise ValueError(f"bluefog {what}: {label} must be an int >= 0, got {value!r}")
        if end_epoch is not None and end_epoch <= start_epoch:
            raise ValueError(f"bluefog {what}: end_epoch ({end_epoch}) must be greater than "
                             f"start_epoch ({start_epoch})")
        if steps_per_epoch is not None and (isinstance(steps_per_epoch, bool) or not isinstance(
                steps_per_epoch, numbers.Integral) or steps_per_epoch < 1):
            raise ValueError(f"bluefog {what}: steps_per_epoch must be an int >= 1 or None, got "
                             f"{steps_per_epoch!r}")
        self.initial_lr = float(initial_lr)
        self.start_epoch = int(start_epoch)
        self.end_epoch = math.inf if end_epoch is None else int(end_epoch)
        self.staircase = bool(staircase)
        self.momentum_correction = bool(momentum_correction)
        self.steps_per_epoch = steps_per_epoch
        self.verbose = verbose
        self.current_epoch = 0
        self._what = what

    def _adjust_learning_rate(self, epoch: float) -> None:
        optimizer = _optimizer_of(self.model, self._what)
        old_lr = current_lr(optimizer, self._what)
        new_lr = self.initial_lr * float(self.multiplier(epoch))
        optimizer.learning_rate = new_lr
        if self.momentum_correction and old_lr > 0:
            rescale_momentum(optimizer, new_lr / old_lr)

    def on_train_begin(self, logs=None):
        current_lr(_optimizer_of(self.model, self._what), self._what)  # fails early, every rank
        if not self.staircase and not self.steps_per_epoch:
            self.steps_per_epoch = (self.params or {}).get("steps")
            if not self.steps_per_epoch:
                raise ValueError(f"bluefog {self._what}: staircase=False needs steps_per_epoch, "
                                 "which fit does not know here; pass steps_per_epoch=")

    def on_epoch_begin(self, epoch, logs=None):
        self.current_epoch = epoch

    def on_train_batch_begin(self, batch, logs=None):
        if not self.start_epoch <= self.current_epoch < self.end_epoch:
            return
        if self.staircase:
            if batch == 0:
                self._adjust_learning_rate(self.current_epoch)
        else:
            self._adjust_learning_rate(self.current_epoch + batch / self.steps_per_epoch)

    def on_epoch_end(self, epoch, logs=None):
        lr = current_lr(_optimizer_of(self.model, self._what), self._what)
        if logs is not None:
            logs["lr"] = lr
        if self.verbose and basics.rank() == 0 and self.start_epoch <= epoch < self.end_epoch:
            print(f"\nEpoch {epoch + 1}: learning rate {lr:g}.")


class BestModelCheckpoint(keras.callbacks.ModelCheckpoint):
    """Horovod's ``BestModelCheckpoint``: ``ModelCheckpoint(save_best_only=True)`` whose file is
    written by rank 0 only (every rank holds the same model; put ``MetricAverageCallback``
    before it so that every rank sees the same monitored value).

    Horovod's keyword arguments (``monitor``, ``verbose``, ``save_weights_only``, ``mode``,
    ``save_freq``) are accepted. ``filepath`` (which Horovod's estimators set themselves)
    defaults to ``best_model.keras``, or ``best_model.weights.h5`` with
    ``save_weights_only=True``, in the working directory.
    """

    def __init__(self, filepath: Optional[str] = None, monitor: str = "val_loss",
                 verbose: int = 0, save_weights_only: bool = False, mode: str = "auto",
                 save_freq="epoch"):
        if filepath is None:
            filepath = "best_model.weights.h5" if save_weights_only else "best_model.keras"
        super().__init__(filepath, monitor=monitor, verbose=verbose if basics.is_initialized()
                         and basics.rank() == 0 else 0, save_best_only=True,
                         save_weights_only=save_weights_only, mode=mode, save_freq=save_freq)

    def _save_model(self, *args, **kwargs):
        if basics.rank() != 0:
            return None
        return super()._save_model(*args, **kwargs)
