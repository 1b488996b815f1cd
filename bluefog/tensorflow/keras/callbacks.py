"""Keras callbacks for data-parallel training with bluefog.

* ``BroadcastGlobalVariablesCallback(root_rank)``: every rank starts from ``root_rank``'s model
  weights and optimizer state.
* ``MetricAverageCallback()``: the metrics in the epoch-end logs are averaged over ranks.
* ``LearningRateWarmupCallback(initial_lr, ...)``: ramps the learning rate from
  ``initial_lr / size`` up to ``initial_lr`` over the first epochs.
* ``LearningRateScheduleCallback(initial_lr, multiplier, ...)`` and ``BestModelCheckpoint``
  (in ``schedule_callbacks``): Horovod's learning-rate schedule and best-model checkpoint.
* ``ReplicaCheckCallback(every_n_batches)``: checks that the ranks' models are still bitwise
  equal (``check_replicas``), or logs their spread under a decentralized optimizer.
* ``JobPageCallback(address, ...)``: the live job page (step time, bytes, straggler per rank)
  served by rank 0, and the same numbers as TensorBoard scalars.

Every rank must run ``fit`` with the same callbacks and the same number of steps per epoch.
"""

from __future__ import annotations

import math
import numbers
import os
from typing import Optional

import keras
import numpy as np
import tensorflow as tf

from bluefog.common import basics
from bluefog.tensorflow import job_page, mpi_ops
from bluefog.tensorflow.keras.schedule_callbacks import (
    BestModelCheckpoint,
    LearningRateScheduleCallback,
    rescale_momentum,
)
from bluefog.tensorflow.local_sources import LocalSources
from bluefog.tensorflow.op_rules import op_error_prefix
from bluefog.tensorflow.replicas import check_replicas, replica_spread
from bluefog.tensorflow.variables import broadcast_variables

__all__ = ["BroadcastGlobalVariablesCallback", "MetricAverageCallback",
           "LearningRateWarmupCallback", "LearningRateScheduleCallback", "BestModelCheckpoint",
           "ReplicaCheckCallback", "JobPageCallback"]


def _check_root_rank(root_rank, what: str) -> int:
    if isinstance(root_rank, bool) or not isinstance(root_rank, numbers.Integral):
        raise TypeError(f"bluefog {what}: root_rank must be an int, got {root_rank!r}")
    root_rank = int(root_rank)
    if basics.is_initialized() and not 0 <= root_rank < basics.size():
        raise ValueError(f"{op_error_prefix(what)}: root_rank {root_rank} is outside "
                         f"[0, {basics.size()})")
    if root_rank < 0:
        raise ValueError(f"bluefog {what}: root_rank must be >= 0, got {root_rank}")
    return root_rank


class BroadcastGlobalVariablesCallback(keras.callbacks.Callback):
    """Makes every rank start training from ``root_rank``'s model and optimizer state.

    At the start of ``fit`` it broadcasts the model's weights (trainable and non-trainable),
    and the optimizer's variables if the optimizer is already built (Keras builds it before
    training starts; the state of a loaded model is included). An optimizer built later has its
    variables broadcast at the end of the first batch. Put it first in the callback list.

    ``local_variables`` (Horovod's): variables, or Keras layers standing for all their weights,
    that keep each rank's own value (worker-local heads, see ``PartialDistributedOptimizer``).
    ``device`` is accepted for Horovod's signature and unused.
    """

    def __init__(self, root_rank: int = 0, device: str = "", local_variables=None):
        super().__init__()
        self.root_rank = _check_root_rank(root_rank, "BroadcastGlobalVariablesCallback")
        self.device = device
        self._local = LocalSources()
        for v in _expand_local(local_variables):
            self._local.add(v, "BroadcastGlobalVariablesCallback: local_variables")
        self._model_done = False
        self._optimizer_done = False

    def _shared(self, variables) -> list:
        return [v for v in variables if v not in self._local]

    def _broadcast_optimizer(self) -> None:
        optimizer = getattr(self.model, "optimizer", None)
        if optimizer is None:
            self._optimizer_done = True
        elif getattr(optimizer, "built", False):
            broadcast_variables(self._shared(optimizer.variables), self.root_rank)
            self._optimizer_done = True

    def on_train_begin(self, logs=None):
        if not self._model_done:
            broadcast_variables(self._shared(self.model.weights), self.root_rank)
            self._model_done = True
        if not self._optimizer_done:
            self._broadcast_optimizer()

    def on_train_batch_end(self, batch, logs=None):
        if not self._optimizer_done:
            self._broadcast_optimizer()


def _expand_local(local_variables) -> list:
    if local_variables is None:
        return []
    if isinstance(local_variables, keras.layers.Layer) or not isinstance(
            local_variables, (list, tuple, set)):
        local_variables = [local_variables]
    out = []
    for v in local_variables:
        out.extend(v.weights if isinstance(v, keras.layers.Layer) else [v])
    return out


class MetricAverageCallback(keras.callbacks.Callback):
    """Replaces each metric in the epoch-end logs with its mean over all ranks.

    Training and validation metrics are computed by each rank on its own data; after this
    callback, ``History``, the progress bar and callbacks placed after it (``ModelCheckpoint``,
    ``EarlyStopping``, ``ReduceLROnPlateau``...) see the averages, identical on every rank. Put it
    before those callbacks. All ranks must log the same metric names. ``device`` (Horovod's) is
    accepted for its signature: the averages run on the CPU here.
    """

    def __init__(self, device: str = ""):
        super().__init__()
        if not isinstance(device, str):
            raise TypeError(f"bluefog MetricAverageCallback: device must be a device string, got "
                            f"{device!r}")
        self.device = device

    def on_epoch_end(self, epoch, logs=None):
        if logs is None:
            return
        keys = sorted(k for k, v in logs.items() if _is_number(v))
        if not keys or basics.size() == 1:
            return
        values = np.array([float(np.asarray(logs[k])) for k in keys], dtype=np.float64)
        averaged = mpi_ops.allreduce(tf.constant(values), average=True,
                                     name="MetricAverageCallback.epoch_end").numpy()
        for k, v in zip(keys, averaged):
            logs[k] = float(v)


def _is_number(v) -> bool:
    if isinstance(v, bool):
        return False
    if isinstance(v, numbers.Number):
        return True
    try:
        a = np.asarray(v)
    except Exception:
        return False
    return a.shape == () and np.issubdtype(a.dtype, np.number)


class LearningRateWarmupCallback(keras.callbacks.Callback):
    """Gradual learning-rate warmup for large effective batch sizes (Goyal et al., 2017).

    With N ranks the effective batch is N times the per-rank batch, and the usual advice is to
    scale the learning rate by N: ``initial_lr`` is that scaled rate. Starting at it can
    destabilise the first epochs, so this callback sets the rate, at the start of every batch of
    the first ``warmup_epochs`` epochs, to::

        lr = initial_lr / N * (1 + (N - 1) * progress)
        progress = (epoch + batch / steps) / warmup_epochs

    i.e. from ``initial_lr / N`` (the single-process rate) at the first batch up to ``initial_lr``
    at the end of warmup, where it sets exactly ``initial_lr`` and then leaves the rate alone.

    The arguments are Horovod's, in its order.

    Args:
        initial_lr: the learning rate reached at the end of warmup (> 0).
        warmup_epochs: number of warmup epochs (>= 0; 0 sets ``initial_lr`` at once).
        momentum_correction: as Horovod's (default True): each rate change multiplies a
            momentum ``SGD``'s velocity by ``new_lr / old_lr`` (see
            ``LearningRateScheduleCallback``).
        steps_per_epoch: batches per epoch; by default what ``fit`` reports. When unknown the
            rate changes once per epoch.
        verbose: 1 prints (on rank 0) when warmup ends.
    """

    def __init__(self, initial_lr: float, warmup_epochs: int = 5,
                 momentum_correction: bool = True, steps_per_epoch: Optional[int] = None,
                 verbose: int = 0):
        super().__init__()
        if isinstance(initial_lr, bool) or not isinstance(initial_lr, numbers.Real) \
                or not math.isfinite(initial_lr) or initial_lr <= 0:
            raise ValueError(f"bluefog LearningRateWarmupCallback: initial_lr must be a positive "
                             f"number, got {initial_lr!r}")
        if isinstance(warmup_epochs, bool) or not isinstance(warmup_epochs, numbers.Integral) \
                or warmup_epochs < 0:
            raise ValueError(f"bluefog LearningRateWarmupCallback: warmup_epochs must be an int "
                             f">= 0, got {warmup_epochs!r}")
        if steps_per_epoch is not None and (
                isinstance(steps_per_epoch, bool) or not isinstance(steps_per_epoch,
                                                                    numbers.Integral)
                or steps_per_epoch < 1):
            raise ValueError(f"bluefog LearningRateWarmupCallback: steps_per_epoch must be an int "
                             f">= 1 or None, got {steps_per_epoch!r}")
        self.initial_lr = float(initial_lr)
        self.warmup_epochs = int(warmup_epochs)
        self.steps_per_epoch = steps_per_epoch
        self.verbose = verbose
        self.momentum_correction = bool(momentum_correction)
        self._epoch = 0
        self._steps = None
        self._finished = False

    def warmup_lr(self, epoch: float) -> float:
        """The learning rate at (fractional) `epoch` during warmup."""
        n = basics.size()
        if self.warmup_epochs == 0 or epoch >= self.warmup_epochs:
            return self.initial_lr
        return self.initial_lr / n * (1.0 + (n - 1) * epoch / self.warmup_epochs)

    def _set_lr(self, lr: float) -> None:
        optimizer = getattr(self.model, "optimizer", None)
        if optimizer is None:
            raise ValueError("bluefog LearningRateWarmupCallback: the model has no optimizer; "
                             "compile it first")
        try:
            old = float(np.asarray(optimizer.learning_rate)) if lr is not None else None
            optimizer.learning_rate = lr
            if self.momentum_correction and old and lr is not None:
                rescale_momentum(optimizer, lr / old)
        except TypeError as e:
            raise ValueError("bluefog LearningRateWarmupCallback: cannot set the optimizer's "
                             "learning rate (it was created with a LearningRateSchedule?); "
                             f"create the optimizer with a float learning_rate: {e}") from None

    def on_train_begin(self, logs=None):
        self._steps = self.steps_per_epoch or (self.params or {}).get("steps")
        # Fails now, on every rank, if the rate cannot be set (a schedule).
        optimizer = getattr(self.model, "optimizer", None)
        self._set_lr(None if optimizer is None else float(np.asarray(optimizer.learning_rate)))

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch = epoch
        if epoch >= self.warmup_epochs:
            if not self._finished:  # resumed after the warmup (initial_epoch), or no warmup
                self._set_lr(self.initial_lr)
                self._finished = True
        elif not self._steps:
            self._set_lr(self.warmup_lr(float(epoch)))

    def on_train_batch_begin(self, batch, logs=None):
        if self._epoch < self.warmup_epochs and self._steps:
            self._set_lr(self.warmup_lr(self._epoch + batch / self._steps))

    def on_epoch_end(self, epoch, logs=None):
        if epoch == self.warmup_epochs - 1:
            self._set_lr(self.initial_lr)
            self._finished = True
            if self.verbose and basics.rank() == 0:
                print(f"\nEpoch {epoch + 1}: finished gradual learning rate warmup to "
                      f"{self.initial_lr:g}.")


class ReplicaCheckCallback(keras.callbacks.Callback):
    """Every ``every_n_batches`` training batches, checks that the ranks' models are equal.

    With an optimizer that keeps replicas equal (``DistributedOptimizer``, or none of
    bluefog's) it calls ``check_replicas`` on the model's trainable weights (less those
    registered as worker-local with a ``PartialDistributedOptimizer``), and any difference,
    down to one ulp, stops ``fit`` on every rank with ``ReplicaMismatchError`` naming the rank
    and the variable.

    Decentralized optimizers (``DistributedAdaptThenCombineOptimizer``, the window optimizers,
    any optimizer whose ``_bluefog_replicas_differ`` is true) keep different replicas by
    design: there it measures their spread instead, ``max_i ||x_i - mean|| / ||mean||`` over
    the ranks ``i`` for each variable (``replica_spread``), and writes its maximum over the
    variables into the logs as ``"replica_spread"`` (the batch's logs and the epoch's, so
    ``History`` records the last value of each epoch); the per-variable values are kept in
    ``self.spread`` (a dict by variable name).

    Args:
        every_n_batches: how often (>= 1), counted over the whole of ``fit``.
        variables: the variables to compare instead of the trainable weights: a list, or a
            callable taking the model and returning one (e.g.
            ``lambda m: m.weights + m.optimizer.variables``).
        spread: ``True`` to always measure the spread, ``False`` to always check equality;
            ``None`` (default) decides from the model's optimizer as above.

    Every rank must run ``fit`` with the same callback and the same number of batches.
    """

    def __init__(self, every_n_batches: int = 100, variables=None,
                 spread: Optional[bool] = None):
        super().__init__()
        if isinstance(every_n_batches, bool) or not isinstance(every_n_batches, numbers.Integral) \
                or every_n_batches < 1:
            raise ValueError(f"bluefog ReplicaCheckCallback: every_n_batches must be an int >= 1, "
                             f"got {every_n_batches!r}")
        if spread is not None and not isinstance(spread, bool):
            raise TypeError(f"bluefog ReplicaCheckCallback: spread must be True, False or None, "
                            f"got {spread!r}")
        self.every_n_batches = int(every_n_batches)
        self.variables = variables
        self.spread_mode = spread
        self.spread: dict = {}
        self._batches = 0
        self._last: Optional[float] = None

    def _variables(self) -> list:
        if self.variables is not None:
            chosen = self.variables(self.model) if callable(self.variables) else self.variables
            return list(chosen)
        local = getattr(getattr(self.model, "optimizer", None), "_bluefog_local", None)
        return [v for v in self.model.trainable_weights if not local or v not in local]

    def _measures_spread(self) -> bool:
        if self.spread_mode is not None:
            return self.spread_mode
        optimizer = getattr(self.model, "optimizer", None)
        return bool(getattr(optimizer, "_bluefog_replicas_differ", False))

    def on_train_batch_end(self, batch, logs=None):
        self._batches += 1
        if self._batches % self.every_n_batches:
            return
        variables = self._variables()
        if not self._measures_spread():
            check_replicas(variables, name="ReplicaCheckCallback.check")
            return
        values = replica_spread(variables, name="ReplicaCheckCallback.spread")
        floats = [v for v in variables if tf.as_dtype(v.dtype).is_floating]
        self.spread = {getattr(v, "path", v.name): float(x) for v, x in zip(floats, values)}
        self._last = float(np.max(values)) if len(values) else 0.0
        if logs is not None:
            logs["replica_spread"] = self._last

    def on_epoch_end(self, epoch, logs=None):
        if logs is not None and self._last is not None:
            logs["replica_spread"] = self._last


class JobPageCallback(keras.callbacks.Callback):
    """The live job page during ``fit`` (docs/job-page.md): at the start of training it calls
    ``bf.serve_job_page(address, secret_file, every_n_steps)`` and after each batch
    ``bf.job_page_step()``.

    Args:
        address: the port or ``"HOST:PORT"`` rank 0 serves the page on (127.0.0.1 unless a
            host is given); None: ``BLUEFOG_JOB_PAGE``, and with neither no page is served.
        every_n_steps: batches between two reports (each is one small allgather).
        log_dir: rank 0 also writes each report as TensorBoard scalars there
            (``bluefog/step_seconds/rankR``, ``bytes_per_second``, ``waiting_share``,
            ``compute_seconds``, ``bluefog/straggler``), with or without a page.
        secret_file: the page's secret file (see ``serve_job_page``).

    Every rank must pass the same arguments and run the same number of batches.
    """

    def __init__(self, address=None, every_n_steps: int = job_page.DEFAULT_EVERY,
                 log_dir: Optional[str] = None, secret_file: Optional[str] = None):
        super().__init__()
        self.every_n_steps = job_page._check_every(every_n_steps)
        self.address = address
        self.log_dir = log_dir
        self.secret_file = secret_file

    def on_train_begin(self, logs=None):
        if self.address is not None or self.log_dir is not None or \
                os.environ.get(job_page.VARIABLE, "").strip():
            job_page.serve_job_page(self.address, self.secret_file, self.every_n_steps)
        if self.log_dir is not None:
            job_page.log_to_tensorboard(self.log_dir)

    def on_train_batch_end(self, batch, logs=None):
        job_page.job_page_step()
