"""The rules of the collective ops, stated once for the Python side.

* ``OP_RULES``: for every Python-level op, the TensorFlow op type it runs and the dtypes it
  accepts. The C++ core states the same rules (op registrations and the runtime's checks);
  ``tests/python/test_op_rules.py`` checks that both sides agree.
* ``op_error_prefix``: how every error about one request begins,
  ``"rank R: bluefog OP of tensor 'NAME'"``, so that a message from any rank says which rank,
  which op and which request failed.

Nothing here loads the compiled ops: this module only needs TensorFlow's dtypes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Optional

import tensorflow as tf

from bluefog.common import basics

__all__ = ["NUMERIC_DTYPES", "FLOAT_DTYPES", "ALL_DTYPES", "CORE_DTYPES", "OpRule", "OP_RULES",
           "accepted_dtypes", "tf_op_types", "rank_str", "op_error_prefix", "check_dtype",
           "to_tensor", "UnsupportedReductionError"]

# Every dtype that can be summed (bool cannot: a sum would silently saturate).
NUMERIC_DTYPES = frozenset([tf.uint8, tf.int8, tf.uint16, tf.int16, tf.int32, tf.int64,
                            tf.float16, tf.bfloat16, tf.float32, tf.float64])
# The dtypes a weighted combination (and a gradient) is defined for.
FLOAT_DTYPES = frozenset([tf.float16, tf.bfloat16, tf.float32, tf.float64])
# Every dtype the runtime can move: what the ops that only copy data accept.
ALL_DTYPES = NUMERIC_DTYPES | {tf.bool}
# The C++ core's DataType enum (csrc/core/types.h), by value: what the C API takes.
CORE_DTYPES = (tf.uint8, tf.int8, tf.uint16, tf.int16, tf.int32, tf.int64, tf.float16,
               tf.bfloat16, tf.float32, tf.float64, tf.bool)


@dataclasses.dataclass(frozen=True)
class OpRule:
    """What one Python-level op is in TensorFlow: its registered op type and accepted dtypes."""

    tf_op_type: str
    dtypes: frozenset
    # Collectives match across ranks by name, so tf.function may run them in any order; the
    # window ops act on shared buffers and must keep program order.
    order_insensitive: bool = True


# Keyed by the op's name as it appears in error messages and unnamed request names.
OP_RULES: Mapping[str, OpRule] = {
    "allreduce": OpRule("BluefogAllreduce", NUMERIC_DTYPES),
    "grouped_allreduce": OpRule("BluefogGroupedAllreduce", NUMERIC_DTYPES),
    "allgather": OpRule("BluefogAllgather", ALL_DTYPES),
    "broadcast": OpRule("BluefogBroadcast", ALL_DTYPES),
    "alltoall": OpRule("BluefogAlltoall", ALL_DTYPES),
    "reducescatter": OpRule("BluefogReducescatter", NUMERIC_DTYPES),
    "grouped_reducescatter": OpRule("BluefogGroupedReducescatter", NUMERIC_DTYPES),
    "neighbor_allreduce": OpRule("BluefogNeighborAllreduce", FLOAT_DTYPES),
    "hierarchical_neighbor_allreduce": OpRule("BluefogNeighborAllreduce", FLOAT_DTYPES),
    "neighbor_allgather": OpRule("BluefogNeighborAllgather", ALL_DTYPES),
    # Only reached through the registered gradient; listed so that the registration is checked.
    "neighbor_allgather.grad": OpRule("BluefogNeighborAllgatherGrad", FLOAT_DTYPES),
    "win_create": OpRule("BluefogWinCreate", FLOAT_DTYPES, order_insensitive=False),
    "win_put": OpRule("BluefogWinPut", FLOAT_DTYPES, order_insensitive=False),
    "win_accumulate": OpRule("BluefogWinPut", FLOAT_DTYPES, order_insensitive=False),
    "win_update": OpRule("BluefogWinUpdate", FLOAT_DTYPES, order_insensitive=False),
}


def accepted_dtypes(op: str) -> frozenset:
    """The dtypes ``op`` (a key of ``OP_RULES``) accepts. Raises KeyError for an unknown op."""
    return OP_RULES[op].dtypes


# Registered ops that take no tensor (so no dtype rule): join.
_TENSORLESS_OP_TYPES = frozenset(["BluefogJoin"])


def tf_op_types() -> frozenset:
    """The TensorFlow op types of the collectives, which tf.function may run in any order."""
    return (frozenset(rule.tf_op_type for rule in OP_RULES.values() if rule.order_insensitive)
            | _TENSORLESS_OP_TYPES)


def rank_str() -> str:
    """This process's rank for error messages; ``"?"`` before ``init()`` (or after shutdown)."""
    return str(basics.rank()) if basics.is_initialized() else "?"


def op_error_prefix(op: str, name: Optional[str] = None, of_tensor: bool = True) -> str:
    """The start of every error message about request ``name`` of ``op``.

    ``"rank R: bluefog OP of tensor 'NAME'"``; with ``of_tensor=False`` (a request that names a
    group of tensors or a Python object) ``"rank R: bluefog OP 'NAME'"``; without a name (an
    error before there is one, or about a whole wrapper) ``"rank R: bluefog OP"``. R is ``?``
    before ``init()``.
    """
    if name is None:
        return f"rank {rank_str()}: bluefog {op}"
    what = " of tensor" if of_tensor else ""
    return f"rank {rank_str()}: bluefog {op}{what} '{name}'"


def check_dtype(tensor: tf.Tensor, op: str, name: str) -> None:
    """Raises TypeError unless ``op`` accepts ``tensor``'s dtype (see ``OP_RULES``)."""
    allowed = accepted_dtypes(op)
    if tensor.dtype not in allowed:
        supported = ", ".join(sorted(d.name for d in allowed))
        raise TypeError(f"{op_error_prefix(op, name)}: dtype {tensor.dtype.name} is not "
                        f"supported; supported dtypes: {supported}")


def to_tensor(tensor, op: str, name: str) -> tf.Tensor:
    """``tensor`` as a ``tf.Tensor``; a TypeError naming the request when it cannot be one."""
    try:
        return tf.convert_to_tensor(tensor)
    except (TypeError, ValueError) as e:
        raise TypeError(f"{op_error_prefix(op, name)}: expected a tf.Tensor, tf.Variable or "
                        f"array-like, got {type(tensor).__name__}: {e}") from None


class UnsupportedReductionError(ValueError, NotImplementedError):
    """A reduction that is not defined for the input (e.g. min of a ``tf.IndexedSlices``).

    Both a ValueError and a NotImplementedError, so code written for Horovod (which raises the
    latter) and code written for bluefog catch it alike. Public as
    ``bf.UnsupportedReductionError`` (and ``mpi_ops.UnsupportedReductionError``); here so that
    adasum.py, below mpi_ops, can raise it too.
    """

    # Exception's own constructor: autograph re-raises an error from a traced function as its
    # own type only when it can rebuild it from the message alone (it checks for exactly this).
    __init__ = Exception.__init__
