"""``DistributedOptimizer``: averages the gradients over all ranks before applying them.

A Keras 3 optimizer is wrapped here (a mixin in front of its class, see ``wrapping``); a
``tf.compat.v1.train.Optimizer`` is handed to ``v1_optimizer``. The requests are named as
described in ``averaging``.
"""

from __future__ import annotations

from typing import Any, Dict, Optional

import tensorflow as tf

from bluefog.common import basics
from bluefog.tensorflow import averaging, compat, mpi_ops, wrapping
from bluefog.tensorflow.compression import Compression
from bluefog.tensorflow.local_sources import LocalSources
from bluefog.tensorflow.v1_optimizer import wrap_v1_optimizer

__all__ = ["DistributedOptimizer", "is_distributed"]


class _DistributedKerasOptimizer(wrapping.BluefogKerasOptimizer):
    """Mixin placed in front of a Keras optimizer class: ``apply`` averages the gradients.

    Keras 3 routes every update through ``apply``: ``apply_gradients`` (what ``model.fit``
    calls) calls it, and so does ``LossScaleOptimizer`` for its inner optimizer. Overriding it
    alone averages each step's gradients exactly once.

    With gradient accumulation (Keras' ``gradient_accumulation_steps``, which
    ``backward_passes_per_step`` sets), only every N-th ``apply`` updates the variables, from
    the mean of the N local gradients; Keras clips that mean first, so ``_clip_gradients``
    averages it over ranks, and the steps in between communicate nothing.
    """

    _bluefog_prefix: str = "Distributed"  # the collectives' names (wrapping.collective_prefix)
    _bluefog_how = averaging.Averaging()
    _bluefog_average_aggregated: bool = True
    _bluefog_local = None  # LocalSources, made by register_local_var
    _bluefog_update_vars = None  # the variables of the update being built (accumulation)

    def register_local_var(self, var) -> None:
        """Marks ``var`` as worker-local: its gradient is not averaged over ranks but applied as
        computed on this rank, divided by ``size()`` when ``scale_local_gradients=True`` (the
        default, as Horovod). Every rank must register variables at the same positions."""
        if self._bluefog_local is None:
            object.__setattr__(self, "_bluefog_local", LocalSources())  # untracked by Keras
        self._bluefog_local.add(var, "DistributedOptimizer.register_local_var")

    def _bluefog_mask(self, variables):
        if not self._bluefog_local or variables is None:
            return None
        return self._bluefog_local.mask(variables)

    def apply(self, grads, trainable_variables=None):
        grads = list(grads)
        if not self.gradient_accumulation_steps:
            variables = (list(trainable_variables) if trainable_variables is not None
                         else getattr(self, "_trainable_variables", None))
            # Looked up on the module at call time, so that tests can observe the calls.
            grads = averaging.average_gradients(grads, self._bluefog_prefix, self._bluefog_how,
                                                self._bluefog_mask(variables))
        return super().apply(grads, trainable_variables)

    def _backend_apply_gradients(self, grads, trainable_variables):
        # Remembered (while the update is built) for _clip_gradients, which gets no variables.
        # object.__setattr__: Keras would track a list of variables set on the optimizer as
        # optimizer variables.
        object.__setattr__(self, "_bluefog_update_vars", tuple(trainable_variables))
        try:
            return super()._backend_apply_gradients(grads, trainable_variables)
        finally:
            object.__setattr__(self, "_bluefog_update_vars", None)

    def _clip_gradients(self, grads):
        if self.gradient_accumulation_steps:  # an update step: grads is the local mean
            grads = list(grads)
            if not self._bluefog_average_aggregated:  # Horovod's default: the sum of the passes
                steps = self.gradient_accumulation_steps
                grads = [None if g is None else g * tf.cast(steps, g.dtype) for g in grads]
            grads = averaging.average_gradients(grads, self._bluefog_prefix, self._bluefog_how,
                                                self._bluefog_mask(self._bluefog_update_vars))
        return super()._clip_gradients(grads)


def is_distributed(optimizer) -> bool:
    """Whether ``optimizer`` is a Keras optimizer made by ``DistributedOptimizer``."""
    return isinstance(optimizer, _DistributedKerasOptimizer)


def _all_ranks_true(flag, prefix: str):
    """Whether the boolean scalar `flag` is true on every rank."""
    count = tf.cast(flag, tf.int32)
    if tf.executing_eagerly():
        name = prefix
    else:
        name = f"{prefix}.{averaging.next_graph_index(prefix)}"
    total = mpi_ops.allreduce(count, average=False, name=name)
    return tf.equal(total, basics.size())


def _patch_loss_scale_optimizer(keras) -> None:
    """Makes ``LossScaleOptimizer(DistributedOptimizer(opt))`` agree on overflow across ranks.

    The loss-scale optimizer skips a step when *its* gradients are not finite, and only then
    calls the inner optimizer, whose ``apply`` runs the allreduce. Its gradients are the local
    ones, so one rank may skip while the others wait in the allreduce: with a distributed inner
    optimizer the finiteness test is made collective (finite on every rank), which is what the
    averaged gradients would show. Nothing changes for other inner optimizers. (Keras wraps the
    compiled optimizer this way by itself under the ``mixed_float16`` policy.)
    """
    cls = keras.optimizers.LossScaleOptimizer
    if getattr(cls.check_finite, "_bluefog_collective", False):
        return
    original = cls.check_finite

    def check_finite(self, grads):
        finite = original(self, grads)
        inner = getattr(self, "inner_optimizer", None)
        if is_distributed(inner) and basics.size() > 1:
            finite = _all_ranks_true(finite, f"{inner._bluefog_prefix}.finite")
        return finite

    # Marks the patched method, so that it is installed once.
    check_finite._bluefog_collective = True
    check_finite.__doc__ = original.__doc__
    cls.check_finite = check_finite


def _check_keras_optimizer(keras, optimizer) -> None:
    if isinstance(optimizer, type) and issubclass(optimizer, keras.optimizers.Optimizer):
        raise ValueError(f"bluefog DistributedOptimizer: pass an optimizer instance such as "
                         f"{optimizer.__name__}(learning_rate=...), not the class")
    if not isinstance(optimizer, keras.optimizers.Optimizer):
        hint = " (an optimizer name string is not accepted: pass an instance)" \
            if isinstance(optimizer, str) else ""
        raise ValueError(f"bluefog DistributedOptimizer: expected a keras.optimizers.Optimizer or "
                         f"tf.compat.v1.train.Optimizer instance, got {type(optimizer).__name__}"
                         f"{hint}")
    if isinstance(optimizer, wrapping.BluefogKerasOptimizer):
        raise ValueError("bluefog DistributedOptimizer: this optimizer is already distributed "
                         "(it is a bluefog optimizer that communicates); wrap the plain optimizer "
                         "only once")


def _accumulation_overrides(optimizer, backward_passes_per_step: int) -> Dict[str, Any]:
    """The configuration changes that make Keras accumulate over the given number of steps."""
    if backward_passes_per_step == 1:
        return {}
    current = optimizer.gradient_accumulation_steps
    if current and current != backward_passes_per_step:
        raise ValueError(f"bluefog DistributedOptimizer: backward_passes_per_step="
                         f"{backward_passes_per_step} but the optimizer already accumulates "
                         f"over gradient_accumulation_steps={current}; give one of them")
    if optimizer.built and not current:
        raise ValueError("bluefog DistributedOptimizer: backward_passes_per_step needs "
                         "gradient accumulators, which a built optimizer does not have; wrap "
                         "the optimizer before it is built (before compile/fit or the first "
                         "apply)")
    return {"gradient_accumulation_steps": backward_passes_per_step}


def DistributedOptimizer(optimizer, name: Optional[str] = None, use_locking: bool = False,
                         device: str = "", compression=Compression.none,
                         backward_passes_per_step: int = 1, sparse_as_dense: bool = False,
                         gradient_predivide_factor: float = 1.0, process_set=None, op=None,
                         average_aggregated_gradients: Optional[bool] = None,
                         scale_local_gradients: bool = True, device_dense: str = "",
                         device_sparse: str = "", num_groups: int = 0, groups=None):
    """An optimizer that averages gradients over all ranks before applying them.

    * Keras 3 optimizer (``keras.optimizers.*``, including ``LossScaleOptimizer``): returns a
      new optimizer of a subclass of the same class, with the same configuration (learning-rate
      schedule, clipping, ...) and, if the original was already built, the same state. Use it in
      ``model.compile(optimizer=...)`` or call ``apply``/``apply_gradients`` yourself. It is an
      ordinary optimizer otherwise: ``optimizer.learning_rate = x`` works, ``get_config``
      returns the wrapped class's config, and a model saved with it loads anywhere as a model
      with the plain optimizer.
    * ``tf.compat.v1.train.Optimizer``: returns an optimizer whose ``compute_gradients`` (and so
      ``minimize``) averages the gradients; for graph mode / ``tf.compat.v1.Session``.

    Args:
        optimizer: the optimizer instance to wrap.
        name: prefix of the names of the allreduce requests (default ``"Distributed"`` + the
            optimizer's class name). Ranks must agree on it.
        use_locking: passed to ``tf.compat.v1.train.Optimizer``; unused for Keras optimizers.
        device: device for the allreduce ops ('' = default placement).
        compression: ``bf.Compression.fp16`` or ``.bf16`` sends float gradients in 16 bits
            (applied in their own dtype); ``.int8``, ``.int4``, ``.topk(ratio)`` and
            ``.powersgd(rank=r)`` send fewer bytes with error feedback (one compressor object
            per model); ``bf.Compression.none`` (default) sends them as they are. Ranks must
            agree on it.
        backward_passes_per_step: Keras optimizers only. Above 1, gradients are accumulated
            locally (Keras' ``gradient_accumulation_steps``) and averaged over ranks once every
            that many steps, when the variables are updated; the steps in between do not
            communicate. An optimizer created with ``gradient_accumulation_steps`` behaves the
            same way without this argument.
        sparse_as_dense: average ``tf.IndexedSlices`` gradients as dense tensors (one fused
            allreduce) instead of gathering every rank's rows.
        gradient_predivide_factor: as for ``DistributedGradientTape`` (Horovod's): scale by
            ``1 / f`` before the sum and ``f / size`` after it.
        process_set: average over that registered ``bf.ProcessSet`` only (default: every
            rank).
        op: ``bf.Average`` (default), ``bf.Sum`` or ``bf.Adasum`` (adaptive summation of the
            gradients, Keras optimizers only, power-of-two rank counts; scale the learning rate
            as for one rank, not by ``size``).
        average_aggregated_gradients: with ``backward_passes_per_step`` N > 1, whether the
            update uses the mean of the N local gradients (True) or their sum (False, Horovod's
            default). None (default): True, as Keras' ``gradient_accumulation_steps``, except
            False with ``op=bf.Adasum``, which refuses True (as Horovod).
        scale_local_gradients: gradients of variables registered with ``register_local_var``
            (or ``PartialDistributedOptimizer``'s ``local_layers``) are not reduced; with True
            (default, as Horovod) they are divided by ``size``.
        device_dense, device_sparse: Horovod's names for ``device``; bluefog places a step's
            dense and sparse reductions together, so those given must agree.
        groups, num_groups: Horovod's: send the gradients as this many grouped requests
            (consecutive, evenly split) instead of one. An int, or Horovod's lists of variables
            (checked; then as many requests as lists, plus one for the other variables: the
            results are the same whichever gradients travel together).

    Raises:
        ValueError: for a bad argument, something that is not an optimizer instance, an
            optimizer that already communicates, or before ``bf.init()``.
        TypeError: for a bad ``device`` or ``sparse_as_dense``.
    """
    averaging.check_name(name, "DistributedOptimizer")
    if not isinstance(use_locking, bool):
        raise ValueError(f"bluefog DistributedOptimizer: use_locking must be a bool, got "
                         f"{use_locking!r}")
    what = "DistributedOptimizer"
    how = averaging.averaging_options(
        averaging.resolve_device(device, device_dense, device_sparse, what), compression,
        sparse_as_dense, what, gradient_predivide_factor, process_set, op, scale_local_gradients,
        averaging.resolve_groups(groups, num_groups, what))
    if average_aggregated_gradients is None:
        average_aggregated_gradients = how.op != mpi_ops.Adasum
    if not isinstance(average_aggregated_gradients, bool):
        raise TypeError(f"bluefog DistributedOptimizer: average_aggregated_gradients must be a "
                        f"bool, got {average_aggregated_gradients!r}")
    if how.op == mpi_ops.Adasum and average_aggregated_gradients \
            and backward_passes_per_step > 1:
        raise ValueError("bluefog DistributedOptimizer: op=bf.Adasum does not support "
                         "average_aggregated_gradients=True with backward_passes_per_step > 1; "
                         "pass average_aggregated_gradients=False")
    if isinstance(backward_passes_per_step, bool) or not isinstance(backward_passes_per_step, int) \
            or backward_passes_per_step < 1:
        raise ValueError(f"bluefog DistributedOptimizer: backward_passes_per_step must be an int "
                         f">= 1, got {backward_passes_per_step!r}")
    if isinstance(optimizer, tf.compat.v1.train.Optimizer):
        if how.op == mpi_ops.Adasum:
            raise ValueError("bluefog DistributedOptimizer: op=bf.Adasum needs a Keras "
                             "optimizer (or DistributedGradientTape); it is not supported for "
                             "tf.compat.v1.train.Optimizer")
        return wrap_v1_optimizer(optimizer, name or "Distributed" + type(optimizer).__name__,
                                 use_locking, how, backward_passes_per_step)

    keras = wrapping.import_keras()
    _check_keras_optimizer(keras, optimizer)
    averaging.check_initialized("DistributedOptimizer")
    _patch_loss_scale_optimizer(keras)
    base = type(optimizer)
    overrides = _accumulation_overrides(optimizer, backward_passes_per_step)
    if overrides or getattr(optimizer, "gradient_accumulation_steps", None):
        compat.check_keras_gradient_accumulation("bluefog DistributedOptimizer")
    new = wrapping.copy_optimizer(optimizer,
                                  wrapping.derived_class(_DistributedKerasOptimizer, base),
                                  "DistributedOptimizer", overrides)
    new._bluefog_prefix = name or wrapping.collective_prefix("Distributed" + base.__name__)
    new._bluefog_how = how
    new._bluefog_average_aggregated = average_aggregated_gradients
    return new
