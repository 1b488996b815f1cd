"""Data-parallel training helpers: gradient averaging and variable broadcast.

* ``DistributedGradientTape`` wraps a ``tf.GradientTape`` so that ``gradient()`` returns the
  gradients averaged over all ranks (custom training loops).
* ``DistributedOptimizer`` wraps a Keras 3 optimizer (for ``model.compile``/``model.fit`` and
  custom loops) or a ``tf.compat.v1.train.Optimizer`` (graph mode) so that the gradients are
  averaged over all ranks before they are applied.
* ``broadcast_variables`` copies variables from one rank to every rank, so that all ranks start
  from the same model (and optimizer) state.

Naming. Every collective is matched across ranks by name, so the names used here must be the
same on every rank and unique among the collectives that may be in flight together:

* while tracing a ``tf.function`` or building a v1 graph, the ``k``-th averaging with prefix
  ``p`` in that graph is one grouped allreduce named ``"p.k"`` (its requests are derived from
  that name: one per dtype, one per sparse gradient). The counter ``k`` is kept per
  graph, so a retrace (on one rank only, e.g. for a smaller last batch) produces the same names
  again, and two optimizers or tapes used in one step get different names;
* in eager mode the averaging runs in a cached ``tf.function`` per prefix (so that all the
  gradients of one step are reduced concurrently), with the same naming inside it.

The prefix of an optimizer is its bluefog name (``"Distributed" + class name`` by default) plus
the Keras optimizer's own name, which Keras makes unique within a process
(``"adam"``, ``"adam_1"``, ...); the prefix of a tape is ``"DistributedGradientTape"``.
"""

from __future__ import annotations

import dataclasses
import sys
import threading
import warnings
import weakref
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import tensorflow as tf

from bluefog.common import basics
from bluefog.tensorflow import compat, mpi_ops
from bluefog.tensorflow.compression import Compression
from bluefog.tensorflow.compression import check as compression_check

__all__ = ["DistributedGradientTape", "DistributedOptimizer", "broadcast_variables"]

_lock = threading.Lock()
# Graph (tf.function FuncGraph or v1 Graph) -> {prefix: number of averagings traced so far}.
_graph_counters: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
# (kind, prefix, device or root rank) -> tf.function used in eager mode.
_eager_functions: Dict[Tuple[str, str, Any], Callable] = {}


def _rank_str() -> str:
    return str(basics.rank()) if basics.is_initialized() else "?"


def _keras():
    """Keras is imported on first use only: ``import bluefog.tensorflow`` stays light."""
    import keras  # noqa: PLC0415

    return keras


def _next_graph_index(prefix: str) -> int:
    """The how-many-th averaging with `prefix` this is in the graph being built."""
    graph = tf.compat.v1.get_default_graph()
    with _lock:
        counters = _graph_counters.setdefault(graph, {})
        k = counters.get(prefix, 0)
        counters[prefix] = k + 1
    return k


def _check_initialized(what: str) -> None:
    if not basics.is_initialized():
        raise ValueError(f"bluefog {what}: bluefog is not initialized; call bf.init() first "
                         "(on every rank)")


# --------------------------------------------------------------------------------------------
# Gradient averaging
# --------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class _Averaging:
    """How a tape or an optimizer averages gradients. Hashable: it keys the eager functions."""

    device: str = ""
    compression: Any = Compression.none
    sparse_as_dense: bool = False


def _allreduce_in_graph(tensors: Sequence, prefix: str, how: _Averaging) -> List:
    # One grouped request: the dense gradients of one dtype go through a single op, so the
    # runtime gets them together and fuses them.
    k = _next_graph_index(prefix)
    return mpi_ops.grouped_allreduce(list(tensors), average=True, name=f"{prefix}.{k}",
                                     device=how.device, compression=how.compression)


def _eager_allreduce_fn(prefix: str, how: _Averaging) -> Callable:
    key = ("allreduce", prefix, how)
    with _lock:
        fn = _eager_functions.get(key)
        if fn is None:
            def average(tensors):
                return _allreduce_in_graph(tensors, prefix, how)

            fn = tf.function(average, reduce_retracing=True, autograph=False)
            _eager_functions[key] = fn
    return fn


def _to_gradient(g, prefix: str, j: int):
    if g is None or isinstance(g, (tf.Tensor, tf.IndexedSlices)):
        return g
    try:
        return tf.convert_to_tensor(g)
    except (TypeError, ValueError) as e:
        raise TypeError(f"rank {_rank_str()}: bluefog {prefix}: gradient {j} is a "
                        f"{type(g).__name__}, which is not a tensor: {e}") from None


def _average_gradients(grads: Sequence, prefix: str, how: _Averaging) -> List:
    """The mean over ranks of every non-None entry of `grads`; None entries stay None."""
    grads = [_to_gradient(g, prefix, j) for j, g in enumerate(grads)]
    if how.sparse_as_dense:
        grads = [tf.convert_to_tensor(g) if isinstance(g, tf.IndexedSlices) else g
                 for g in grads]
    if basics.size() == 1:
        return grads
    present = [j for j, g in enumerate(grads) if g is not None]
    if not present:
        return grads
    values = [grads[j] for j in present]
    if tf.executing_eagerly():
        reduced = _eager_allreduce_fn(prefix, how)(values)
    else:
        reduced = _allreduce_in_graph(values, prefix, how)
    out = list(grads)
    for j, r in zip(present, reduced):
        out[j] = r
    return out


def _averaging(device, compression, sparse_as_dense, what: str) -> _Averaging:
    """The checked averaging options of a tape or optimizer (`what`)."""
    if not isinstance(sparse_as_dense, bool):
        raise TypeError(f"bluefog {what}: sparse_as_dense must be a bool, got "
                        f"{sparse_as_dense!r}")
    return _Averaging(_check_device(device, what),
                      compression_check(compression, f"bluefog {what}"), sparse_as_dense)


def _check_device(device, what: str) -> str:
    if device is None:
        return ""
    if not isinstance(device, str):
        raise TypeError(f"bluefog {what}: device must be a str such as '' or '/cpu:0', got "
                        f"{device!r}")
    return device


# --------------------------------------------------------------------------------------------
# DistributedGradientTape
# --------------------------------------------------------------------------------------------

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

    def __init__(self, tape: tf.GradientTape, prefix: str, how: _Averaging):
        # tf.GradientTape.__init__ is not called: its state is the wrapped tape's.
        object.__setattr__(self, "_bf_tape", tape)
        object.__setattr__(self, "_bf_prefix", prefix)
        object.__setattr__(self, "_bf_how", how)

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
                 unconnected_gradients=tf.UnconnectedGradients.NONE):
        """The gradient of `target` with respect to `sources`, averaged over all ranks.

        Same arguments and result structure as ``tf.GradientTape.gradient``. Every rank must
        call it with the same structure of sources; None gradients (unconnected sources) stay
        None, ``tf.IndexedSlices`` stay ``IndexedSlices``.
        """
        grads = self._bf_tape.gradient(target, sources, output_gradients=output_gradients,
                                       unconnected_gradients=unconnected_gradients)
        flat = tf.nest.flatten(grads)
        averaged = _average_gradients(flat, self._bf_prefix, self._bf_how)
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
                            sparse_as_dense: bool = False) -> tf.GradientTape:
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
            (returned in their own dtype); ``bf.Compression.none`` (default) sends them as they
            are. Ranks must agree on it.
        sparse_as_dense: average ``tf.IndexedSlices`` gradients as dense tensors (one fused
            allreduce) instead of gathering every rank's rows; pays when the rows touched per
            step are a large part of the table.
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
    how = _averaging(device, compression, sparse_as_dense, "DistributedGradientTape")
    _check_initialized("DistributedGradientTape")
    return _DistributedGradientTape(gradtape, "DistributedGradientTape", how)


# --------------------------------------------------------------------------------------------
# DistributedOptimizer: Keras 3
# --------------------------------------------------------------------------------------------

class _DistributedKerasOptimizer:
    """Mixin placed in front of a Keras optimizer class: ``apply`` averages the gradients.

    Keras 3 routes every update through ``apply``: ``apply_gradients`` (what ``model.fit``
    calls) calls it, and so does ``LossScaleOptimizer`` for its inner optimizer. Overriding it
    alone averages each step's gradients exactly once.

    With gradient accumulation (Keras' ``gradient_accumulation_steps``, which
    ``backward_passes_per_step`` sets), only every N-th ``apply`` updates the variables, from
    the mean of the N local gradients; Keras clips that mean first, so ``_clip_gradients``
    averages it over ranks, and the steps in between communicate nothing.
    """

    _bluefog_name: str = "Distributed"
    _bluefog_how = _Averaging()

    def apply(self, grads, trainable_variables=None):
        grads = list(grads)
        if not self.gradient_accumulation_steps:
            grads = _average_gradients(grads, f"{self._bluefog_name}.{self.name}",
                                       self._bluefog_how)
        return super().apply(grads, trainable_variables)

    def _clip_gradients(self, grads):
        if self.gradient_accumulation_steps:  # an update step: grads is the local mean
            grads = _average_gradients(list(grads), f"{self._bluefog_name}.{self.name}",
                                       self._bluefog_how)
        return super()._clip_gradients(grads)


_keras_classes: Dict[type, type] = {}


def _all_ranks_true(flag, prefix: str):
    """Whether the boolean scalar `flag` is true on every rank."""
    count = tf.cast(flag, tf.int32)
    if tf.executing_eagerly():
        name = prefix
    else:
        name = f"{prefix}.{_next_graph_index(prefix)}"
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
        if isinstance(inner, _DistributedKerasOptimizer) and basics.size() > 1:
            finite = _all_ranks_true(finite, f"{inner._bluefog_name}.{inner.name}.finite")
        return finite

    check_finite._bluefog_collective = True
    check_finite.__doc__ = original.__doc__
    cls.check_finite = check_finite


def _distributed_keras_class(base: type) -> type:
    """The subclass of `base` with averaging; one per base class.

    It carries the base's name and module, so that Keras serializes it as the base class:
    a model saved with a distributed optimizer loads as an ordinary model anywhere (and
    ``bluefog.tensorflow.keras.load_model`` wraps the optimizer again).
    """
    with _lock:
        cls = _keras_classes.get(base)
        if cls is None:
            cls = type(base.__name__, (_DistributedKerasOptimizer, base),
                       {"__module__": base.__module__,
                        "__qualname__": getattr(base, "__qualname__", base.__name__),
                        "__doc__": base.__doc__})
            _keras_classes[base] = cls
    return cls


def _copy_keras_optimizer(optimizer, cls, overrides: Dict[str, Any]):
    """A new instance of `cls` with the configuration (and state, if built) of `optimizer`,
    with `overrides` applied to the configuration."""
    keras = _keras()
    with warnings.catch_warnings():
        # A callable learning rate warns when serialized; it is passed on as is below.
        warnings.simplefilter("ignore")
        config = optimizer.get_config()
    config.update(overrides)
    lr = getattr(optimizer, "_learning_rate", None)
    if "learning_rate" in config and lr is not None and not compat.is_keras_variable(lr):
        # A schedule or callable: keep the very object (no serialization round trip).
        config["learning_rate"] = lr
    try:
        new = cls.from_config(config)
    except Exception as e:  # noqa: BLE001 - a user optimizer whose config does not round-trip
        raise ValueError(
            f"bluefog DistributedOptimizer: cannot re-create {type(optimizer).__name__} from "
            f"its get_config() ({type(e).__name__}: {e}); the optimizer's get_config() must "
            "return every constructor argument") from e
    if optimizer.built:
        trainable = list(optimizer._trainable_variables)
        with keras.name_scope(new.name, caller=new):
            new.build(trainable)
        new.built = True
        old_vars, new_vars = optimizer.variables, new.variables
        if len(old_vars) != len(new_vars):
            raise ValueError(
                f"bluefog DistributedOptimizer: the built {type(optimizer).__name__} has "
                f"{len(old_vars)} variables but its copy has {len(new_vars)}; wrap the optimizer "
                "before it is built (before compile/fit or the first apply)")
        for src, dst in zip(old_vars, new_vars):
            dst.assign(src)
    return new


# --------------------------------------------------------------------------------------------
# DistributedOptimizer: tf.compat.v1 (graph mode)
# --------------------------------------------------------------------------------------------

class _DistributedV1Optimizer(tf.compat.v1.train.Optimizer):
    """A ``tf.compat.v1.train.Optimizer`` whose ``compute_gradients`` averages over ranks.

    ``minimize`` (inherited) calls ``compute_gradients`` then ``apply_gradients``, so it trains
    on averaged gradients too. Everything else is the wrapped optimizer's.
    """

    def __init__(self, optimizer, name: str, use_locking: bool, how: _Averaging):
        super().__init__(use_locking=use_locking, name=name)
        self._optimizer = optimizer
        self._bluefog_how = how

    def compute_gradients(self, *args, **kwargs):
        grads_and_vars = list(self._optimizer.compute_gradients(*args, **kwargs))
        grads = _average_gradients([g for g, _ in grads_and_vars], self._name,
                                   self._bluefog_how)
        return [(g, v) for g, (_, v) in zip(grads, grads_and_vars)]

    def apply_gradients(self, *args, **kwargs):
        return self._optimizer.apply_gradients(*args, **kwargs)

    def get_slot(self, *args, **kwargs):
        return self._optimizer.get_slot(*args, **kwargs)

    def get_slot_names(self, *args, **kwargs):
        return self._optimizer.get_slot_names(*args, **kwargs)

    def variables(self, *args, **kwargs):
        return self._optimizer.variables(*args, **kwargs)


# --------------------------------------------------------------------------------------------
# DistributedOptimizer
# --------------------------------------------------------------------------------------------

def DistributedOptimizer(optimizer, name: Optional[str] = None, use_locking: bool = False,
                         device: str = "", compression=Compression.none,
                         backward_passes_per_step: int = 1, sparse_as_dense: bool = False):
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
            (applied in their own dtype); ``bf.Compression.none`` (default) sends them as they
            are. Ranks must agree on it.
        backward_passes_per_step: Keras optimizers only. Above 1, gradients are accumulated
            locally (Keras' ``gradient_accumulation_steps``) and averaged over ranks once every
            that many steps, when the variables are updated; the steps in between do not
            communicate. An optimizer created with ``gradient_accumulation_steps`` behaves the
            same way without this argument.
        sparse_as_dense: average ``tf.IndexedSlices`` gradients as dense tensors (one fused
            allreduce) instead of gathering every rank's rows.
    """
    if name is not None and (not isinstance(name, str) or not name):
        raise ValueError(f"bluefog DistributedOptimizer: name must be a non-empty str or None, "
                         f"got {name!r}")
    if not isinstance(use_locking, bool):
        raise ValueError(f"bluefog DistributedOptimizer: use_locking must be a bool, got "
                         f"{use_locking!r}")
    how = _averaging(device, compression, sparse_as_dense, "DistributedOptimizer")
    if isinstance(backward_passes_per_step, bool) or not isinstance(backward_passes_per_step, int) \
            or backward_passes_per_step < 1:
        raise ValueError(f"bluefog DistributedOptimizer: backward_passes_per_step must be an int "
                         f">= 1, got {backward_passes_per_step!r}")
    if isinstance(optimizer, tf.compat.v1.train.Optimizer):
        if backward_passes_per_step > 1:
            raise ValueError("bluefog DistributedOptimizer: backward_passes_per_step > 1 needs a "
                             "Keras optimizer (it uses Keras' gradient accumulation)")
        if isinstance(optimizer, _DistributedV1Optimizer):
            raise ValueError("bluefog DistributedOptimizer: this optimizer is already "
                             "distributed; wrap the optimizer only once")
        _check_initialized("DistributedOptimizer")
        return _DistributedV1Optimizer(optimizer, name or "Distributed" +
                                       type(optimizer).__name__, use_locking, how)

    keras = _keras()
    if isinstance(optimizer, type) and issubclass(optimizer, keras.optimizers.Optimizer):
        raise ValueError(f"bluefog DistributedOptimizer: pass an optimizer instance such as "
                         f"{optimizer.__name__}(learning_rate=...), not the class")
    if not isinstance(optimizer, keras.optimizers.Optimizer):
        hint = " (an optimizer name string is not accepted: pass an instance)" \
            if isinstance(optimizer, str) else ""
        raise ValueError(f"bluefog DistributedOptimizer: expected a keras.optimizers.Optimizer or "
                         f"tf.compat.v1.train.Optimizer instance, got {type(optimizer).__name__}"
                         f"{hint}")
    decentralized = sys.modules.get("bluefog.tensorflow.decentralized")
    decentralized_cls = getattr(decentralized, "_DecentralizedKerasOptimizer", None)
    if isinstance(optimizer, _DistributedKerasOptimizer) or (
            decentralized_cls is not None and isinstance(optimizer, decentralized_cls)):
        raise ValueError("bluefog DistributedOptimizer: this optimizer is already distributed "
                         "(it is a bluefog optimizer that communicates); wrap the plain optimizer "
                         "only once")
    _check_initialized("DistributedOptimizer")
    _patch_loss_scale_optimizer(keras)
    base = type(optimizer)
    overrides: Dict[str, Any] = {}
    if backward_passes_per_step > 1:
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
        overrides["gradient_accumulation_steps"] = backward_passes_per_step
    if overrides or getattr(optimizer, "gradient_accumulation_steps", None):
        compat.check_keras_gradient_accumulation("bluefog DistributedOptimizer")
    new = _copy_keras_optimizer(optimizer, _distributed_keras_class(base), overrides)
    new._bluefog_name = name or "Distributed" + base.__name__
    new._bluefog_how = how
    return new


# --------------------------------------------------------------------------------------------
# broadcast_variables
# --------------------------------------------------------------------------------------------

def _broadcast_in_graph(tensors: Sequence, root_rank: int, prefix: str) -> List:
    k = _next_graph_index(prefix)
    return [mpi_ops.broadcast(t, root_rank, name=f"{prefix}.{k}.{j}")
            for j, t in enumerate(tensors)]


def _eager_broadcast_fn(root_rank: int) -> Callable:
    key = ("broadcast", "broadcast_variables", root_rank)
    with _lock:
        fn = _eager_functions.get(key)
        if fn is None:
            def bcast(tensors):
                return _broadcast_in_graph(tensors, root_rank, "broadcast_variables")

            fn = tf.function(bcast, reduce_retracing=True, autograph=False)
            _eager_functions[key] = fn
    return fn


def _is_variable(v) -> bool:
    if isinstance(v, tf.Variable):
        return True
    try:
        return compat.is_keras_variable(v)
    except ImportError:  # pragma: no cover - keras always comes with tensorflow >= 2.16
        return False


def broadcast_variables(variables, root_rank: int):
    """Sets every variable in ``variables`` to its value on ``root_rank``, on every rank.

    Accepts ``tf.Variable`` and Keras variables (e.g. ``model.variables`` or
    ``optimizer.variables``). Every rank must pass the same variables, in the same order.

    Eager mode: assigns at once and returns None. Graph mode (inside ``tf.function`` or a v1
    graph): returns an op grouping the assignments, to be run (in a Session) on every rank.
    """
    if isinstance(root_rank, bool) or not isinstance(root_rank, int):
        raise TypeError(f"bluefog broadcast_variables: root_rank must be an int, got "
                        f"{root_rank!r}")
    if _is_variable(variables):
        raise TypeError("bluefog broadcast_variables: expected a list of variables, got a single "
                        "variable; pass [variable]")
    try:
        variables = list(variables)
    except TypeError:
        raise TypeError(f"bluefog broadcast_variables: expected a list of variables, got "
                        f"{type(variables).__name__}") from None
    for j, v in enumerate(variables):
        if not _is_variable(v):
            raise TypeError(f"bluefog broadcast_variables: element {j} is a {type(v).__name__}, "
                            "not a tf.Variable or keras.Variable")
    _check_initialized("broadcast_variables")
    if not 0 <= root_rank < basics.size():
        raise ValueError(f"rank {basics.rank()}: bluefog broadcast_variables: root_rank "
                         f"{root_rank} is outside [0, {basics.size()})")
    if tf.executing_eagerly():
        if not variables or basics.size() == 1:
            return None
        values = _eager_broadcast_fn(root_rank)([tf.convert_to_tensor(v) for v in variables])
        for v, value in zip(variables, values):
            v.assign(value)
        return None
    values = _broadcast_in_graph([tf.convert_to_tensor(v) for v in variables], root_rank,
                                 "broadcast_variables")
    return tf.group(*[v.assign(value) for v, value in zip(variables, values)])
