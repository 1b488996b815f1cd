"""Python objects between ranks: ``broadcast_object`` and ``allgather_object``.

For what is not a tensor: a resume epoch read from a checkpoint on rank 0, a config dict, each
rank's file list or metrics. The object is pickled into a uint8 tensor and sent with the
tensor collectives (its length first, so the ranks' objects may differ in size). Eager mode
only; every rank must call them in the same order (or with the same ``name``).

Unpickling runs code chosen by the sender: use these only between ranks of one job.
"""

from __future__ import annotations

import pickle
from typing import Any, List, Optional

import numpy as np
import tensorflow as tf

from bluefog.common import basics
from bluefog.tensorflow import mpi_ops
from bluefog.tensorflow.op_library import request_name
from bluefog.tensorflow.op_rules import op_error_prefix

__all__ = ["broadcast_object", "allgather_object"]


def _check(op: str, name: str) -> None:
    if not tf.executing_eagerly():
        raise RuntimeError(f"{op_error_prefix(op, name, of_tensor=False)}: works in eager mode "
                           "only (it pickles Python objects); call it outside tf.function")


def _pickled(obj: Any):
    """(uint8 array, None) or (None, the reason pickling failed)."""
    try:
        data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as e:  # noqa: BLE001 - any pickling failure is the caller's object
        return None, f"{type(e).__name__}: {e}"
    return np.frombuffer(data, dtype=np.uint8), None


def _unpicklable(op: str, name: str, ranks: List[int], reason: Optional[str]) -> TypeError:
    mine = f" (here: {reason})" if reason else ""
    return TypeError(f"{op_error_prefix(op, name, of_tensor=False)}: the object of rank(s) "
                     f"{ranks} cannot be pickled{mine}; pass picklable objects")


def broadcast_object(obj: Any = None, root_rank: int = 0, name: Optional[str] = None) -> Any:
    """``obj`` of ``root_rank``, on every rank (the other ranks' ``obj`` is ignored)."""
    name = request_name("broadcast_object", name)
    _check("broadcast_object", name)
    me = basics.rank()
    data, reason = _pickled(obj) if me == root_rank else (None, None)
    # The length goes first (-1: the root could not pickle), so every rank fails together.
    sent = -1 if reason else (0 if data is None else data.size)
    length = mpi_ops.broadcast(tf.constant([sent], tf.int64), root_rank=root_rank,
                               name=name + ".length")
    n = int(length.numpy()[0])
    if n < 0:
        raise _unpicklable("broadcast_object", name, [root_rank], reason)
    payload = tf.constant(data) if data is not None else tf.zeros([n], tf.uint8)
    received = mpi_ops.broadcast(payload, root_rank=root_rank, name=name + ".data")
    return obj if me == root_rank else pickle.loads(received.numpy().tobytes())


def allgather_object(obj: Any, name: Optional[str] = None) -> List[Any]:
    """Every rank's ``obj``, as a list indexed by rank."""
    name = request_name("allgather_object", name)
    _check("allgather_object", name)
    data, reason = _pickled(obj)
    lengths = mpi_ops.allgather(tf.constant([-1 if reason else data.size], tf.int64),
                                name=name + ".lengths").numpy()
    if (lengths < 0).any():
        raise _unpicklable("allgather_object", name, [int(r) for r in np.flatnonzero(lengths < 0)],
                           reason)
    gathered = mpi_ops.allgather(tf.constant(data), name=name + ".data").numpy().tobytes()
    out, start = [], 0
    for n in lengths:
        out.append(pickle.loads(gathered[start:start + int(n)]))
        start += int(n)
    return out
