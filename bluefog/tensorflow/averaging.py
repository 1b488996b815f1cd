"""Gradient averaging and collective naming shared by the training wrappers.

``DistributedGradientTape``, both forms of ``DistributedOptimizer``, ``broadcast_variables``
and the decentralized optimizers build on this module.

Naming. Every collective is matched across ranks by name, so the names used here must be the
same on every rank and unique among the collectives that may be in flight together:

* while tracing a ``tf.function`` or building a v1 graph, the ``k``-th averaging with prefix
  ``p`` in that graph is one grouped allreduce named ``"p.k"`` (its requests are derived from
  that name: one per dtype, one per sparse gradient). The counter ``k`` is kept per
  graph (``next_graph_index``), so a retrace (on one rank only, e.g. for a smaller last batch)
  produces the same names again, and two optimizers or tapes used in one step get different
  names;
* in eager mode the averaging runs in a cached ``tf.function`` per prefix
  (``eager_function``), so that all the gradients of one step are reduced concurrently, with
  the same naming inside it.

The prefix of an optimizer is the ``name`` given to its wrapper, or else the wrapper's default
name (``"DistributedAdam"``, ...) numbered by bluefog among the wrappers of that name made in
the process (``wrapping.collective_prefix``: Keras' own optimizer names count every optimizer
the process made, which ranks need not agree on); the prefix of a tape is
``"DistributedGradientTape"``.
"""

from __future__ import annotations

import dataclasses
import threading
import weakref
from collections.abc import Hashable, Sequence
from typing import Any, Callable, Dict, List, Optional

import tensorflow as tf

from bluefog.common import basics
from bluefog.common.process_sets import process_set_by_id
from bluefog.tensorflow import mpi_ops
from bluefog.tensorflow.compression import Compression
from bluefog.tensorflow.compression import check as compression_check
from bluefog.tensorflow.op_library import one_device, process_set_attrs, set_size
from bluefog.tensorflow.op_rules import op_error_prefix

__all__ = ["Averaging", "average_gradients", "averaging_options", "check_initialized",
           "check_name", "eager_function", "next_graph_index"]

_lock = threading.Lock()
# Graph (tf.function FuncGraph or v1 Graph) -> {prefix: number of collectives traced so far}.
_graph_counters: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
# Caller-chosen key -> tf.function used in eager mode.
_eager_functions: Dict[Hashable, Callable] = {}


def next_graph_index(prefix: str) -> int:
    """The how-many-th collective with ``prefix`` this is in the graph being built (from 0).

    Counted per graph (the default graph in eager mode), so that tracing a function again
    yields the same names.
    """
    graph = tf.compat.v1.get_default_graph()
    with _lock:
        counters = _graph_counters.setdefault(graph, {})
        k = counters.get(prefix, 0)
        counters[prefix] = k + 1
    return k


def eager_function(key: Hashable, python_function: Callable) -> Callable:
    """The ``tf.function`` of ``python_function`` cached under ``key`` (made on first use).

    Eager callers run their collectives inside one cached function so that they are issued
    together; the key must identify everything the function's names depend on.
    """
    with _lock:
        fn = _eager_functions.get(key)
        if fn is None:
            fn = tf.function(python_function, reduce_retracing=True, autograph=False)
            _eager_functions[key] = fn
    return fn


def check_initialized(what: str) -> None:
    """Raises ValueError unless ``bf.init()`` has run (``what`` names the caller)."""
    if not basics.is_initialized():
        raise ValueError(f"bluefog {what}: bluefog is not initialized; call bf.init() first "
                         "(on every rank)")


def check_name(name: Any, what: str) -> None:
    """Raises ValueError unless ``name`` (a wrapper's request-name prefix) is None or a
    non-empty str."""
    if name is not None and (not isinstance(name, str) or not name):
        raise ValueError(f"bluefog {what}: name must be a non-empty str or None, got {name!r}")


@dataclasses.dataclass(frozen=True)
class Averaging:
    """How a tape or an optimizer averages gradients. Hashable: it keys the eager functions."""

    device: str = ""
    compression: Any = Compression.none
    sparse_as_dense: bool = False
    # Horovod's gradient_predivide_factor f: gradients are multiplied by 1/f before the sum and
    # by f/size after it (one factor in C++ here), instead of one division by size.
    predivide: float = 1.0
    # The process set (its id; 0: every rank) the gradients are averaged over.
    process_set: int = 0
    # Horovod's op: bf.Average (default), bf.Sum or bf.Adasum.
    op: str = mpi_ops.Average
    # Horovod's scale_local_gradients: gradients of local variables are divided by size.
    scale_local: bool = True
    # Horovod's groups / num_groups as a count: the gradients go out as that many grouped
    # requests, split evenly in order (0: one).
    groups: int = 0


def _check_device(device, what: str) -> str:
    if device is None:
        return ""
    if not isinstance(device, str):
        raise TypeError(f"bluefog {what}: device must be a str such as '' or '/cpu:0', got "
                        f"{device!r}")
    return device


def resolve_device(device, device_dense, device_sparse, what: str) -> str:
    """``op_library.one_device`` for a tape or an optimizer (``what``)."""
    return one_device(device, device_dense, device_sparse, f"bluefog {what}")


def _groups_from_lists(groups, what: str) -> int:
    """Horovod's ``groups`` as lists of variables, checked (lists of variables, none in two
    lists); the gradients then go out as that many grouped requests, plus one for the
    variables in no list. The sums are the same whichever gradients travel together."""
    seen = set()
    for i, group in enumerate(groups):
        if not isinstance(group, (list, tuple)) or not group:
            raise ValueError(f"bluefog {what}: groups[{i}] must be a non-empty list of "
                             f"variables, got {group!r:.80}")
        for v in group:
            if not hasattr(v, "assign"):  # tf.Variable and Keras 3 variables (no .ref())
                raise ValueError(f"bluefog {what}: groups[{i}] holds {type(v).__name__}, not a "
                                 "variable")
            if id(v) in seen:
                raise ValueError(f"bluefog {what}: variable {getattr(v, 'name', v)} is in more "
                                 "than one group")
            seen.add(id(v))
    return len(groups) + 1


def resolve_groups(groups, num_groups, what: str) -> int:
    """Horovod's ``groups`` and its older ``num_groups``: how many grouped requests the
    gradients go out as (0: one). ``groups`` may be an int or, as in Horovod, lists of
    variables (checked, then counted: see ``_groups_from_lists``). Raises ValueError/TypeError
    for other values."""
    if groups is not None and num_groups:
        raise ValueError(f"bluefog {what}: pass groups or num_groups, not both")
    value = num_groups if groups is None else groups
    if value is None:
        return 0
    if isinstance(value, (list, tuple)):
        return _groups_from_lists(value, what)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"bluefog {what}: groups must be an int >= 0, got {value!r}")
    return value


def averaging_options(device, compression, sparse_as_dense, what: str,
                      gradient_predivide_factor: float = 1.0, process_set=None, op=None,
                      scale_local_gradients: bool = True, groups: int = 0) -> Averaging:
    """The checked averaging options of a tape or optimizer (``what``).

    Raises TypeError for a non-bool ``sparse_as_dense`` or ``scale_local_gradients``, a non-str
    ``device`` or a non-number ``gradient_predivide_factor``, ValueError for a factor that is
    not positive, an ``op`` other than bf.Average, bf.Sum and bf.Adasum, a factor or a
    compression combined with an op that is not bf.Average / bf.Adasum (as Horovod), and what
    ``compression.check`` raises for an unknown compression.
    """
    op = mpi_ops.Average if op is None else op
    if op not in (mpi_ops.Average, mpi_ops.Sum, mpi_ops.Adasum):
        raise ValueError(f"bluefog {what}: op must be bf.Average, bf.Sum or bf.Adasum, got "
                         f"{op!r}")
    if not isinstance(scale_local_gradients, bool):
        raise TypeError(f"bluefog {what}: scale_local_gradients must be a bool, got "
                        f"{scale_local_gradients!r}")
    if op != mpi_ops.Average and gradient_predivide_factor != 1.0:
        raise ValueError(f"bluefog {what}: gradient_predivide_factor is only supported with "
                         f"op=bf.Average, not op={op!r}")
    if op == mpi_ops.Adasum and compression is not Compression.none:
        raise ValueError(f"bluefog {what}: op=bf.Adasum does not support compression")
    if not isinstance(sparse_as_dense, bool):
        raise TypeError(f"bluefog {what}: sparse_as_dense must be a bool, got "
                        f"{sparse_as_dense!r}")
    f = gradient_predivide_factor
    if isinstance(f, bool) or not isinstance(f, (int, float)):
        raise TypeError(f"bluefog {what}: gradient_predivide_factor must be a number, got {f!r}")
    if not f > 0:
        raise ValueError(f"bluefog {what}: gradient_predivide_factor must be > 0, got {f!r}")
    set_id = process_set_attrs(process_set, f"bluefog {what}").get("process_set_id", 0)
    return Averaging(_check_device(device, what),
                     compression_check(compression, f"bluefog {what}"), sparse_as_dense,
                     float(f), set_id, op, scale_local_gradients, groups)


def _allreduce_in_graph(tensors: Sequence, prefix: str, how: Averaging) -> List:
    k = next_graph_index(prefix)
    if how.groups > 1 and len(tensors) > 1:
        # Horovod's groups: consecutive slices of the list, sizes differing by at most one.
        n = min(how.groups, len(tensors))
        bounds = [len(tensors) * i // n for i in range(n + 1)]
        out: List = []
        for i in range(n):
            out += _allreduce_group(tensors[bounds[i]:bounds[i + 1]], f"{prefix}.{k}.g{i}", how)
        return out
    return _allreduce_group(tensors, f"{prefix}.{k}", how)


def _allreduce_group(tensors: Sequence, name: str, how: Averaging) -> List:
    # One grouped request: the dense gradients of one dtype go through a single op, so the
    # runtime gets them together and fuses them.
    process_set = process_set_by_id(how.process_set) if how.process_set else None
    if how.op == mpi_ops.Adasum:
        if process_set is not None:
            raise ValueError(f"{op_error_prefix(name)}: op=bf.Adasum runs on the global "
                             "process set only")
        return mpi_ops.grouped_allreduce(list(tensors), name=name, op=mpi_ops.Adasum)
    if how.op == mpi_ops.Sum:
        return mpi_ops.grouped_allreduce(list(tensors), average=False, name=name,
                                         device=how.device, compression=how.compression,
                                         process_set=process_set)
    if how.predivide != 1.0:
        return mpi_ops.grouped_allreduce(list(tensors), average=False, name=name,
                                         device=how.device, compression=how.compression,
                                         prescale_factor=1.0 / how.predivide,
                                         postscale_factor=how.predivide / set_size(process_set),
                                         process_set=process_set)
    return mpi_ops.grouped_allreduce(list(tensors), average=True, name=name,
                                     device=how.device, compression=how.compression,
                                     process_set=process_set)


def _to_gradient(g, prefix: str, j: int):
    if g is None or isinstance(g, (tf.Tensor, tf.IndexedSlices)):
        return g
    try:
        return tf.convert_to_tensor(g)
    except (TypeError, ValueError) as e:
        raise TypeError(f"{op_error_prefix(prefix)}: gradient {j} is a {type(g).__name__}, "
                        f"which is not a tensor: {e}") from None


def _scale_local(g, n: int):
    if isinstance(g, tf.IndexedSlices):
        return tf.IndexedSlices(g.values / tf.cast(n, g.values.dtype), g.indices, g.dense_shape)
    return g / tf.cast(n, g.dtype)


def average_gradients(grads: Sequence, prefix: str, how: Averaging,
                      local: Optional[Sequence[bool]] = None) -> List:
    """The mean over ranks (or ``how.op``'s reduction) of every non-None entry of ``grads``;
    None entries stay None.

    ``prefix`` names the requests (see the module's docstring); every rank must pass the same
    structure of gradients. Entries whose ``local`` flag is true (gradients of worker-local
    variables) are not reduced: they are returned as they are, divided by ``size`` when
    ``how.scale_local`` (Horovod's ``scale_local_gradients``). Raises TypeError for an entry
    that is not a tensor.
    """
    grads = [_to_gradient(g, prefix, j) for j, g in enumerate(grads)]
    if how.sparse_as_dense:
        grads = [tf.convert_to_tensor(g) if isinstance(g, tf.IndexedSlices) else g
                 for g in grads]
    n = set_size(process_set_by_id(how.process_set)) if how.process_set else basics.size()
    if n == 1:
        return grads
    local = [False] * len(grads) if local is None else list(local)
    if any(local):
        grads = [(_scale_local(g, n) if how.scale_local else g)
                 if is_local and g is not None else g for g, is_local in zip(grads, local)]
    present = [j for j, g in enumerate(grads) if g is not None and not local[j]]
    if not present:
        return grads
    values = [grads[j] for j in present]
    if tf.executing_eagerly():
        def average(tensors):
            return _allreduce_in_graph(tensors, prefix, how)

        reduced = eager_function(("allreduce", prefix, how), average)(values)
    else:
        reduced = _allreduce_in_graph(values, prefix, how)
    out = list(grads)
    for j, r in zip(present, reduced):
        out[j] = r
    return out
