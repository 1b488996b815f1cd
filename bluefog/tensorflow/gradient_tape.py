"""``DistributedGradientTape``: a ``tf.GradientTape`` whose ``gradient()`` averages over ranks.

For custom training loops; the requests are named as described in ``averaging``.
"""

from __future__ import annotations

import tensorflow as tf

from bluefog.tensorflow import averaging
from bluefog.tensorflow.compression import Compression
from bluefog.tensorflow.local_sources import LocalSources

__all__ = ["DistributedGradientTape"]


def _delegated_state(attr: str):
    """A property that reads and writes `attr` of the wrapped tape."""

    def fget(self):
        return getattr(object.__getattribute__(self, "_bf_tape"), attr)

    def fset(self, value):
        setattr(object.__getattribute__(self, "_bf_tape"), attr, value)

    return property(fget, fset)


class _DistributedGradientTape(tf.GradientTape):
    """A view of a ``tf.GradientTape`` whose ``gradient()`` averages over ranks.

    All recording state lives in the wrapped tape (the internal attributes are delegated), so
    the wrapper can be made before, inside or after the ``with`` block, and both objects stay
    consistent.
    """

    _tape = _delegated_state("_tape")
    _persistent = _delegated_state("_persistent")
    _watch_accessed_variables = _delegated_state("_watch_accessed_variables")
    _watched_variables = _delegated_state("_watched_variables")
    _recording = _delegated_state("_recording")

    def __init__(self, tape: tf.GradientTape, prefix: str, how: averaging.Averaging):
        # tf.GradientTape.__init__ is not called: its state is the wrapped tape's.
        object.__setattr__(self, "_bf_tape", tape)
        object.__setattr__(self, "_bf_prefix", prefix)
        object.__setattr__(self, "_bf_how", how)
        object.__setattr__(self, "_bf_local", LocalSources())

    def register_local_source(self, source) -> None:
        """Marks ``source`` (a variable or watched tensor) as worker-local: its gradient is not
        averaged but returned as computed on this rank, divided by ``size()`` when the tape was
        made with ``scale_local_gradients=True`` (the default, as Horovod). Every rank must
        register sources at the same positions of the ``gradient()`` calls' sources."""
        self._bf_local.add(source, "DistributedGradientTape.register_local_source")

    def __enter__(self):
        self._bf_tape.__enter__()
        return self

    def __exit__(self, typ, value, traceback):
        return self._bf_tape.__exit__(typ, value, traceback)

    def watch(self, tensor):
        return self._bf_tape.watch(tensor)

    def stop_recording(self):
        return self._bf_tape.stop_recording()

    def reset(self):
        return self._bf_tape.reset()

    def watched_variables(self):
        return self._bf_tape.watched_variables()

    def jacobian(self, *args, **kwargs):
        """Not averaged: the wrapped tape's jacobian."""
        return self._bf_tape.jacobian(*args, **kwargs)

    def batch_jacobian(self, *args, **kwargs):
        """Not averaged: the wrapped tape's batch_jacobian."""
        return self._bf_tape.batch_jacobian(*args, **kwargs)

    def gradient(self, target, sources, output_gradients=None,
                 unconnected_gradients=tf.UnconnectedGradients.NONE,
                 use_generic_names: bool = False):
        """The gradient of `target` with respect to `sources`, averaged over all ranks.

        Same arguments and result structure as ``tf.GradientTape.gradient``.
        ``use_generic_names`` (Horovod's) is accepted for its signature: requests are named
        by position here already, never by the variables' names. Every rank must
        call it with the same structure of sources; None gradients (unconnected sources) stay
        None, ``tf.IndexedSlices`` stay ``IndexedSlices``.
        """
        grads = self._bf_tape.gradient(target, sources, output_gradients=output_gradients,
                                       unconnected_gradients=unconnected_gradients)
        flat = tf.nest.flatten(grads)
        local = self._bf_local.mask(tf.nest.flatten(sources)) if len(self._bf_local) else None
        averaged = averaging.average_gradients(flat, self._bf_prefix, self._bf_how, local)
        return tf.nest.pack_sequence_as(grads, averaged)

    def __getattr__(self, name):
        # Anything else (e.g. extra methods of a GradientTape subclass) comes from the wrapped tape.
        if name.startswith("_bf_"):
            raise AttributeError(name)
        return getattr(object.__getattribute__(self, "_bf_tape"), name)

    def __repr__(self):
        return f"DistributedGradientTape({self._bf_tape!r})"


def DistributedGradientTape(gradtape: tf.GradientTape, device: str = "",
                            compression=Compression.none,
                            sparse_as_dense: bool = False,
                            gradient_predivide_factor: float = 1.0,
                            process_set=None, op=None,
                            scale_local_gradients: bool = True, device_dense: str = "",
                            device_sparse: str = "", num_groups: int = 0,
                            groups=None) -> tf.GradientTape:
    """Wraps ``gradtape`` so that ``gradient()`` returns gradients averaged over all ranks.

    Works with persistent and non-persistent tapes, ``watch_accessed_variables=False``, in eager
    mode and inside ``tf.function``. The wrapper can be applied after the ``with`` block::

        with tf.GradientTape() as tape:
            loss = loss_fn(model(x), y)
        tape = bf.DistributedGradientTape(tape)
        grads = tape.gradient(loss, model.trainable_variables)

    or around a fresh tape: ``with bf.DistributedGradientTape(tf.GradientTape()) as tape:``.
    Every rank must call ``gradient()`` the same number of times, in the same order, with the
    same structure of sources. ``jacobian``/``batch_jacobian`` are not averaged.

    Args:
        gradtape: a ``tf.GradientTape``.
        device: device for the allreduce ops ('' = default placement).
        compression: ``bf.Compression.fp16`` or ``.bf16`` sends float gradients in 16 bits
            (returned in their own dtype); ``.int8``, ``.int4``, ``.topk(ratio)`` and
            ``.powersgd(rank=r)`` send fewer bytes with error feedback (one compressor object
            per model); ``bf.Compression.none`` (default) sends them as they are. Ranks must
            agree on it.
        sparse_as_dense: average ``tf.IndexedSlices`` gradients as dense tensors (one fused
            allreduce) instead of gathering every rank's rows; pays when the rows touched per
            step are a large part of the table.
        gradient_predivide_factor: as Horovod's: gradients are scaled by
            ``1 / gradient_predivide_factor`` before the sum over ranks and by
            ``gradient_predivide_factor / size`` after it (still the average; a factor such as
            ``size`` keeps float16 sums from overflowing). Float gradients only.
        process_set: average over that registered ``bf.ProcessSet`` only (default: every
            rank); only its ranks may use the tape.
        op: ``bf.Average`` (default, the mean), ``bf.Sum`` or ``bf.Adasum`` (adaptive
            summation, power-of-two rank counts, no compression; see ``bf.allreduce``).
        scale_local_gradients: gradients of sources registered with
            ``register_local_source`` are not reduced; with True (default, as Horovod) they
            are divided by ``size``.
        device_dense, device_sparse: Horovod's names for ``device`` (those given must agree).
        groups, num_groups: Horovod's: send the gradients as this many grouped requests
            (consecutive, evenly split) instead of one. An int, or Horovod's lists of variables
            (checked; then as many requests as lists, plus one for the other variables).
    """
    if isinstance(gradtape, type) and issubclass(gradtape, tf.GradientTape):
        raise ValueError("bluefog DistributedGradientTape: pass a tf.GradientTape instance "
                         "(tf.GradientTape()), not the class")
    if not isinstance(gradtape, tf.GradientTape):
        raise ValueError(f"bluefog DistributedGradientTape: expected a tf.GradientTape, got "
                         f"{type(gradtape).__name__}")
    if isinstance(gradtape, _DistributedGradientTape):
        raise ValueError("bluefog DistributedGradientTape: this tape is already a "
                         "DistributedGradientTape; wrap the tf.GradientTape only once")
    what = "DistributedGradientTape"
    how = averaging.averaging_options(
        averaging.resolve_device(device, device_dense, device_sparse, what), compression,
        sparse_as_dense, what, gradient_predivide_factor, process_set, op, scale_local_gradients,
        averaging.resolve_groups(groups, num_groups, what))
    averaging.check_initialized("DistributedGradientTape")
    return _DistributedGradientTape(gradtape, "DistributedGradientTape", how)
