"""Python objects between ranks: ``broadcast_object`` and ``allgather_object``.

For what is not a tensor: a resume epoch read from a checkpoint on rank 0, a config dict, each
rank's file list or metrics. The object is pickled into a uint8 tensor and sent with the
tensor collectives (its length first, so the ranks' objects may differ in size). They run
eagerly, or in a ``tf.compat.v1`` graph through a session (``session=``, or the default
session), as Horovod's do; not inside a ``tf.function``. Every rank must call them in the same
order (or with the same ``name``).

Unpickling runs code chosen by the sender: use these only between ranks of one job.
"""

from __future__ import annotations

import pickle
from typing import Any, Callable, List, Optional

import numpy as np
import tensorflow as tf

from bluefog.common import basics
from bluefog.tensorflow import mpi_ops
from bluefog.tensorflow.op_library import request_name
from bluefog.tensorflow.op_rules import op_error_prefix

__all__ = ["broadcast_object", "allgather_object"]


def _runner(op: str, name: str, session) -> Callable:
    """How to get the value of a tensor built here: ``.numpy()`` eagerly; in a v1 graph, the
    given or default session runs it."""
    what = op_error_prefix(op, name, of_tensor=False)
    if tf.executing_eagerly():
        return lambda t: t.numpy()
    if tf.inside_function():
        raise RuntimeError(f"{what}: works in eager mode only, or in a tf.compat.v1 graph "
                           "through a session (it pickles Python objects); call it outside "
                           "tf.function")
    session = session or tf.compat.v1.get_default_session()
    if session is None:
        raise RuntimeError(f"{what}: in graph mode it runs its collectives through a session; "
                           "pass session=sess or call it inside `with sess.as_default():`")
    return session.run


def _pickled(obj: Any):
    """(uint8 array, None) or (None, the reason pickling failed)."""
    try:
        data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as e:  # any pickling failure is the caller's object
        return None, f"{type(e).__name__}: {e}"
    return np.frombuffer(data, dtype=np.uint8), None


def _unpicklable(op: str, name: str, ranks: List[int], reason: Optional[str]) -> TypeError:
    mine = f" (here: {reason})" if reason else ""
    return TypeError(f"{op_error_prefix(op, name, of_tensor=False)}: the object of rank(s) "
                     f"{ranks} cannot be pickled{mine}; pass picklable objects")


def broadcast_object(obj: Any = None, root_rank: int = 0, name: Optional[str] = None,
                     session=None, process_set=None) -> Any:
    """``obj`` of ``root_rank``, on every rank (the other ranks' ``obj`` is ignored).

    In a ``tf.compat.v1`` graph, ``session`` (default: the default session) runs the
    collectives it adds to the graph. ``process_set``: among that set's ranks only
    (``root_rank`` a job-wide rank in it).
    """
    name = request_name("broadcast_object", name)
    run = _runner("broadcast_object", name, session)
    me = basics.rank()
    data, reason = _pickled(obj) if me == root_rank else (None, None)
    # The length goes first (-1: the root could not pickle), so every rank fails together.
    sent = -1 if reason else (0 if data is None else data.size)
    length = mpi_ops.broadcast(tf.constant([sent], tf.int64), root_rank=root_rank,
                               name=name + ".length", process_set=process_set)
    n = int(run(length)[0])
    if n < 0:
        raise _unpicklable("broadcast_object", name, [root_rank], reason)
    payload = tf.constant(data) if data is not None else tf.zeros([n], tf.uint8)
    received = mpi_ops.broadcast(payload, root_rank=root_rank, name=name + ".data",
                                 process_set=process_set)
    if me == root_rank:
        run(received)  # the root takes part too, but keeps its own object
        return obj
    return pickle.loads(run(received).tobytes())


def allgather_object(obj: Any, name: Optional[str] = None, session=None,
                     process_set=None) -> List[Any]:
    """Every rank's ``obj``, as a list indexed by rank (``session`` as for
    ``broadcast_object``); with ``process_set``, the objects of that set's ranks, in its rank
    order."""
    name = request_name("allgather_object", name)
    run = _runner("allgather_object", name, session)
    data, reason = _pickled(obj)
    lengths = run(mpi_ops.allgather(tf.constant([-1 if reason else data.size], tf.int64),
                                    name=name + ".lengths", process_set=process_set))
    if (lengths < 0).any():
        raise _unpicklable("allgather_object", name, [int(r) for r in np.flatnonzero(lengths < 0)],
                           reason)
    gathered = run(mpi_ops.allgather(tf.constant(data), name=name + ".data",
                                     process_set=process_set)).tobytes()
    out, start = [], 0
    for n in lengths:
        out.append(pickle.loads(gathered[start:start + int(n)]))
        start += int(n)
    return out
