"""``broadcast_variables``: every rank takes one rank's variable values.

So that all ranks start from the same model (and optimizer) state. The requests are named as
described in ``averaging``: ``"broadcast_variables.k.j"`` for variable ``j`` of the ``k``-th
broadcast in a graph.
"""

from __future__ import annotations

from typing import Callable, List, Optional, Sequence

import tensorflow as tf

from bluefog.common import basics
from bluefog.tensorflow import averaging, compat, mpi_ops
from bluefog.tensorflow.op_library import process_set_attrs
from bluefog.tensorflow.op_rules import op_error_prefix

__all__ = ["broadcast_variables", "broadcast_", "broadcast_global_variables"]


def _broadcast_in_graph(tensors: Sequence, root_rank: int, prefix: str,
                        process_set=None) -> List:
    k = averaging.next_graph_index(prefix)
    return [mpi_ops.broadcast(t, root_rank, name=f"{prefix}.{k}.{j}", process_set=process_set)
            for j, t in enumerate(tensors)]


def _eager_broadcast_fn(root_rank: int, process_set=None) -> Callable:
    def bcast(tensors):
        return _broadcast_in_graph(tensors, root_rank, "broadcast_variables", process_set)

    set_id = getattr(process_set, "process_set_id", 0) or 0
    return averaging.eager_function(("broadcast", "broadcast_variables", root_rank, set_id),
                                    bcast)


def _is_variable(v) -> bool:
    if isinstance(v, tf.Variable):
        return True
    try:
        return compat.is_keras_variable(v)
    except ImportError:  # pragma: no cover - keras always comes with tensorflow 2.21
        return False


# Per-rank random state that a broadcast must not copy: Keras' SeedGenerator state (dropout and
# the other random layers), so that each rank keeps drawing its own dropout masks.
_RANDOM_STATE_NAMES = ("seed_generator_state",)


def is_random_state(v) -> bool:
    """Whether ``v`` holds per-rank random state (a Keras ``SeedGenerator``'s state, as in
    ``Dropout``), which ``broadcast_variables`` leaves alone."""
    for attr in ("path", "name"):
        text = getattr(v, attr, None)
        if isinstance(text, str):
            base = text.split(":")[0].rsplit("/", 1)[-1]
            if base in _RANDOM_STATE_NAMES:
                return True
    return False


def broadcast_variables(variables, root_rank: int, process_set=None,
                        inplace: bool = False) -> Optional[tf.Operation]:
    """Sets every variable in ``variables`` to its value on ``root_rank``, on every rank.

    Accepts ``tf.Variable`` and Keras variables (e.g. ``model.variables`` or
    ``optimizer.variables``). Every rank must pass the same variables, in the same order.
    ``process_set``: over that registered set's ranks only (``root_rank`` a job-wide rank in
    it). ``inplace`` is accepted for Horovod's signature: the values are always assigned to the
    variables. Per-rank random state (Keras ``SeedGenerator`` state, e.g. a ``Dropout``
    layer's, which ``model.variables`` includes) is skipped, so every rank keeps drawing its
    own dropout masks.

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
    if not isinstance(inplace, bool):
        raise TypeError(f"bluefog broadcast_variables: inplace must be a bool, got {inplace!r}")
    variables = [v for v in variables if not is_random_state(v)]
    averaging.check_initialized("broadcast_variables")
    if not 0 <= root_rank < basics.size():
        raise ValueError(f"{op_error_prefix('broadcast_variables')}: root_rank {root_rank} is "
                         f"outside [0, {basics.size()})")
    if process_set is not None and not process_set_attrs(
            process_set, op_error_prefix("broadcast_variables")):
        process_set = None  # the global set
    if process_set is not None and root_rank not in process_set.ranks:
        raise ValueError(f"{op_error_prefix('broadcast_variables')}: root_rank {root_rank} is "
                         f"not in {process_set}")
    if tf.executing_eagerly():
        if not variables or basics.size() == 1:
            return None
        values = _eager_broadcast_fn(root_rank, process_set)(
            [tf.convert_to_tensor(v) for v in variables])
        for v, value in zip(variables, values):
            v.assign(value)
        return None
    values = _broadcast_in_graph([tf.convert_to_tensor(v) for v in variables], root_rank,
                                 "broadcast_variables", process_set)
    return tf.group(*[v.assign(value) for v, value in zip(variables, values)])


def broadcast_(variables, root_rank: int, name: Optional[str] = None, process_set=None):
    """Horovod's in-place broadcast: sets ``variables`` to their values on ``root_rank`` and
    returns them. ``name`` is accepted for Horovod's signature (the requests are named by the
    variables' order); ``process_set`` as for ``broadcast_variables``.

    Eager mode: assigns at once and returns the list of variables. Graph mode: returns the
    assigned values (``v.assign(...)`` of each), to be run on every rank. Every rank must pass
    the same variables in the same order.
    """
    variables = list(variables) if not _is_variable(variables) else variables
    if name is not None and not isinstance(name, str):
        raise TypeError(f"bluefog broadcast_: name must be a str, got {name!r}")
    op = broadcast_variables(variables, root_rank, process_set=process_set)
    if tf.executing_eagerly():
        return variables
    with tf.control_dependencies([op]):
        return [tf.identity(v) for v in variables]


def broadcast_global_variables(root_rank: int) -> tf.Operation:
    """The op that broadcasts every ``tf.compat.v1`` global variable from ``root_rank``.

    For TF1-style graphs run by a ``tf.compat.v1.Session`` (as Horovod's); run the returned op
    on every rank after initializing the variables. In eager mode there are no global
    variables: use ``bf.broadcast_variables(model.weights + optimizer.variables, root_rank)``.
    """
    if tf.executing_eagerly():
        raise RuntimeError("bluefog broadcast_global_variables: works in tf.compat.v1 graph mode "
                           "only (eager mode has no global variable collection); use "
                           "bf.broadcast_variables(model.weights + optimizer.variables, "
                           "root_rank) instead")
    variables = tf.compat.v1.global_variables()
    if not variables:
        return tf.no_op()
    return broadcast_variables(variables, root_rank)
