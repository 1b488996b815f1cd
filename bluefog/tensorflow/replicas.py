"""Are the replicas equal? ``check_replicas``, and the spread of replicas that differ by design.

Data-parallel training keeps every rank's model equal by averaging the gradients and starting
from one broadcast; nothing else checks that the bits stay equal. ``check_replicas`` does, for
about the cost of one small allgather: every rank fingerprints each variable's bytes locally
(``BluefogReplicaRecords``, a 64-bit fingerprint in C++: a change confined to one 8-byte word,
such as one ulp of one element, always changes it) and the ranks allgather one row per variable
(dtype, shape, fingerprint). Every rank then reaches the same verdict from the same gathered
rows, so a mismatch raises on every rank together, and different shapes or variable counts are
reported as such instead of hanging a collective.

Decentralized optimizers keep different replicas on purpose; for them ``replica_spread``
measures how far apart they are (used by ``keras.callbacks.ReplicaCheckCallback``).
"""

from __future__ import annotations

import collections
from typing import List, Optional, Sequence

import numpy as np
import tensorflow as tf

from bluefog.common import basics
from bluefog.tensorflow import mpi_ops
from bluefog.tensorflow.op_library import ops, request_name
from bluefog.tensorflow.op_rules import op_error_prefix

__all__ = ["ReplicaMismatchError", "check_replicas", "replica_spread"]

# The row layout of BluefogReplicaRecords (csrc/tensorflow/replica_ops.cc).
_DTYPE, _NDIMS, _ELEMENTS, _SHAPE, _BYTES, _DIMS = 0, 1, 2, 3, 4, 5
_SHOWN_DIMS = 7
_ROW = _DIMS + _SHOWN_DIMS
# Variables named in a message per differing rank, at most.
_LISTED = 5


class ReplicaMismatchError(RuntimeError):
    """``check_replicas`` found ranks whose variables differ from the others' (raised on every
    rank, with the same message but for the leading "rank R: ")."""


def _as_list(variables, what: str) -> list:
    if isinstance(variables, (tf.Variable, tf.Tensor)) or hasattr(variables, "dtype"):
        return [variables]
    try:
        out = list(variables)
    except TypeError:
        raise TypeError(f"bluefog {what}: variables must be a variable, a tensor or a list of "
                        f"them, got {type(variables).__name__}") from None
    for i, v in enumerate(out):
        if not hasattr(v, "dtype") or not hasattr(v, "shape"):
            raise TypeError(f"bluefog {what}: variables[{i}] is a {type(v).__name__}, not a "
                            "variable or tensor")
    return out


def _label(v, i: int) -> str:
    name = getattr(v, "path", None) or getattr(v, "name", None)
    return f"variable {i} '{name}'" if isinstance(name, str) and name else f"variable {i}"


def _set_ranks(process_set) -> List[int]:
    return list(range(basics.size())) if process_set is None else list(process_set.ranks)


def check_replicas(variables, name: Optional[str] = None, process_set=None):
    """Checks that every rank holds bitwise-equal ``variables``; raises on every rank if not.

    Every rank fingerprints the bytes of each variable (64 bits, in C++; any change confined
    to one 8-byte word, such as one ulp of one element, is always caught, other changes
    escape with probability about 2^-64) and the ranks compare dtypes, shapes and fingerprints
    through one allgather. Returns normally (``None`` eagerly) when they all agree. Otherwise
    raises ``ReplicaMismatchError`` on every rank, naming the ranks that differ from the
    majority (from the lowest rank on a tie, so from rank 0 at two ranks) and, for each, the
    first differing variable (index and name) and what differs: the number of variables, a
    dtype, a shape, or the values.

    Every rank must call it at the same point with the same variables in the same order
    (their values may differ: that is what it finds). ``variables``: a variable or tensor, or
    a list of them (``model.trainable_weights``; dtypes with a fixed byte layout: numbers and
    bool). ``name``: the allgather's name (default: a per-process counter, which matches when
    every rank calls its unnamed collectives in one order). ``process_set``: compare among
    that set's ranks only.

    Inside a ``tf.function`` it runs as part of the function and fails it with the same
    message (TensorFlow reports the error as ``tf.errors.UnknownError`` there); in a
    ``tf.compat.v1`` graph it returns a tensor to run. Costs one local pass over the bytes and
    an allgather of 96 bytes per variable per rank.
    """
    what = "check_replicas"
    items = _as_list(variables, what)
    name = request_name(what, name)
    labels = [_label(v, i) for i, v in enumerate(items)]
    tensors = [tf.convert_to_tensor(v) for v in items]
    for i, t in enumerate(tensors):
        if t.dtype in (tf.string, tf.resource, tf.variant):
            raise TypeError(f"{op_error_prefix(what, name, of_tensor=False)}: {labels[i]} has "
                            f"dtype {t.dtype.name}, which has no fixed bytes to compare; pass "
                            "numeric or bool variables")
    ranks = _set_ranks(process_set)
    with tf.device("/cpu:0"):
        rows = ops.bluefog_replica_records(tensors)
        mine = tf.concat([tf.constant([len(tensors)], tf.int64), tf.reshape(rows, [-1])], 0)
    gathered = mpi_ops.allgather(mine, name=name, process_set=process_set)

    def verdict(values):
        _verdict(np.asarray(values), ranks, labels, name)
        return np.int64(len(labels))

    if tf.executing_eagerly():
        verdict(gathered.numpy())
        return None
    return tf.numpy_function(verdict, [gathered], tf.int64, stateful=True,
                             name="bluefog_check_replicas")


def _split(values: np.ndarray, count: int, name: str) -> List[np.ndarray]:
    """Each rank's rows from the gathered vector (each part: its row count, then the rows)."""
    parts, pos = [], 0
    for _ in range(count):
        n = int(values[pos])
        parts.append(values[pos + 1:pos + 1 + n * _ROW].reshape(n, _ROW))
        pos += 1 + n * _ROW
    if pos != values.size:
        raise basics.BluefogError(f"{op_error_prefix('check_replicas', name, of_tensor=False)}: "
                                  f"the gathered records have {values.size} values, expected "
                                  f"{pos}; this is a bug in bluefog")
    return parts


def _describe(row: np.ndarray) -> str:
    dtype = tf.dtypes.as_dtype(int(row[_DTYPE])).name
    ndims = int(row[_NDIMS])
    dims = [int(d) for d in row[_DIMS:_DIMS + min(ndims, _SHOWN_DIMS)]]
    shown = ", ".join(str(d) for d in dims) + (", ..." if ndims > _SHOWN_DIMS else "")
    return f"{dtype} [{shown}]"


def _differences(part: np.ndarray, ref: np.ndarray, labels: Sequence[str],
                 rank: int, ref_rank: int) -> str:
    if len(part) != len(ref):
        return (f"rank {rank} passed {len(part)} variables, rank {ref_rank} passed {len(ref)}; "
                "every rank must pass the same variables in the same order")
    diffs = [i for i in range(len(part)) if not np.array_equal(part[i], ref[i])]
    first = diffs[0]
    label = labels[first] if first < len(labels) else f"variable {first}"
    if not np.array_equal(part[first, :_BYTES], ref[first, :_BYTES]):
        return (f"rank {rank}'s {label} is {_describe(part[first])}, rank {ref_rank}'s is "
                f"{_describe(ref[first])}")
    listed = ", ".join(str(i) for i in diffs[:_LISTED]) + (", ..." if len(diffs) > _LISTED else "")
    return (f"rank {rank} differs from rank {ref_rank} first at {label} (its values; "
            f"{len(diffs)} of {len(part)} variables differ: {listed})")


def _verdict(values: np.ndarray, ranks: List[int], labels: Sequence[str], name: str) -> None:
    parts = _split(values, len(ranks), name)
    keys = [p.tobytes() + len(p).to_bytes(8, "little") for p in parts]
    counts = collections.Counter(keys)
    if len(counts) == 1:
        return
    # The largest group is the reference; on a tie the one holding the lowest rank.
    best = max(counts.values())
    ref_pos = next(j for j, k in enumerate(keys) if counts[k] == best)
    odd = [j for j, k in enumerate(keys) if k != keys[ref_pos]]
    ref_rank = ranks[ref_pos]
    agree = best - 1
    basis = (f"rank {ref_rank}, with which {agree} other rank(s) agree" if agree else
             f"rank {ref_rank}")
    details = "; ".join(_differences(parts[j], parts[ref_pos], labels, ranks[j], ref_rank)
                        for j in odd)
    raise ReplicaMismatchError(
        f"{op_error_prefix('check_replicas', name, of_tensor=False)}: the "
        f"replicas differ: rank(s) {[ranks[j] for j in odd]} differ from {basis}: {details}. "
        "Replicas that should be equal diverged: look for a gradient that is not averaged, an "
        "update that depends on the rank's data outside the optimizer, or variables not "
        "broadcast at the start (bf.broadcast_variables); with a decentralized optimizer they "
        "differ by design (measure their spread instead)")


def replica_spread(variables, name: Optional[str] = None, process_set=None) -> np.ndarray:
    """For each floating-point variable, ``max_i ||x_i - mean|| / ||mean||`` over the ranks
    ``i`` (the absolute ``max_i ||x_i - mean||`` where the mean is zero), the same array on
    every rank; eager only. The variables of other dtypes are skipped. Costs an allreduce of
    the variables (in float64) and one of a value per variable."""
    what = "replica_spread"
    items = [v for v in _as_list(variables, what) if tf.as_dtype(v.dtype).is_floating]
    if not tf.executing_eagerly():
        raise RuntimeError(f"{op_error_prefix(what, name, of_tensor=False)}: runs eagerly only")
    if not items:
        return np.zeros([0])
    name = request_name(what, name)
    flat = tf.concat([tf.reshape(tf.cast(tf.convert_to_tensor(v), tf.float64), [-1])
                      for v in items], 0)
    mean = mpi_ops.allreduce(flat, average=True, name=name + ".mean", process_set=process_set)
    x, m = flat.numpy(), mean.numpy()
    starts = np.cumsum([0] + [int(np.prod(v.shape)) for v in items])[:-1]
    sizes = np.diff(np.append(starts, x.size))
    d2 = np.array([np.sum((x[s:s + n] - m[s:s + n]) ** 2) for s, n in zip(starts, sizes)])
    m2 = np.array([np.sum(m[s:s + n] ** 2) for s, n in zip(starts, sizes)])
    ratio = np.sqrt(d2) / np.where(m2 > 0, np.sqrt(m2), 1.0)
    return mpi_ops.allreduce(tf.constant(ratio), op=mpi_ops.Max, name=name + ".max",
                             process_set=process_set).numpy()
