"""Adasum: the adaptive summation of Maleki et al. (2021), as Horovod defines it for CPUs.

``bf.allreduce(t, op=bf.Adasum)`` (and ``grouped_allreduce``, ``DistributedOptimizer``,
``DistributedGradientTape`` with ``op=bf.Adasum``) combines the ranks' tensors by a recursive
pairwise reduction over ``log2(size)`` levels. At level ``k`` (distance ``d = 2**k``) every rank
``r`` exchanges its current tensor with rank ``r XOR d`` and both replace it with::

    adasum(a, b) = (1 - a.b / (2 |a|^2)) a + (1 - a.b / (2 |b|^2)) b

where ``a`` is the tensor of the lower of the two ranks; a squared norm below 1e-8 leaves its
coefficient at 1. After the last level every rank holds the same result. Orthogonal tensors are
summed, equal tensors are returned as they are (not doubled), and everything in between is
scaled accordingly, which is what lets Adasum train with larger effective batches without
scaling the learning rate.

As in Horovod the dot products and norms are taken per tensor (not over the whole set of
tensors of a call), in float64, while the tensors of a grouped call travel together: one
``neighbor_allgather`` with the partner rank per level and dtype. Only float tensors, and only
power-of-two rank counts (1, 2, 4, 8, ...), are supported.
"""

from __future__ import annotations

from typing import List, Optional, Sequence

import tensorflow as tf

from bluefog.common import basics
from bluefog.tensorflow.neighbor_ops import neighbor_allgather
from bluefog.tensorflow.op_rules import UnsupportedReductionError, op_error_prefix, to_tensor

__all__ = ["Adasum", "adasum_allreduce", "check_adasum_size"]

# The value of allreduce's `op` that selects Adasum (Horovod's name).
Adasum = "adasum"
# Squared norms below this leave the coefficient of their tensor at 1 (as Horovod's CPU code).
_NORM_GUARD = 1e-8


def check_adasum_size(what: str) -> None:
    """Raises ValueError unless the number of ranks is a power of two (``what`` names the op)."""
    n = basics.size()
    if n & (n - 1):
        raise ValueError(f"{what}: op=bf.Adasum needs a power-of-two number of ranks (1, 2, 4, "
                         f"8, ...), but this job has {n} ranks; use op=bf.Average instead or "
                         "run on a power-of-two number of ranks")


def _combine(mine: tf.Tensor, theirs: tf.Tensor, sizes: List[int], me_first: bool) -> tf.Tensor:
    """adasum(a, b) per segment of the flat buffers ``mine``/``theirs`` (segments ``sizes``);
    ``a`` is the lower rank's buffer, so both ranks compute bit-identical results."""
    a, b = (mine, theirs) if me_first else (theirs, mine)
    ids = tf.repeat(tf.range(len(sizes)), sizes)
    a64, b64 = tf.cast(a, tf.float64), tf.cast(b, tf.float64)
    dot = tf.math.segment_sum(a64 * b64, ids)
    anorm = tf.math.segment_sum(a64 * a64, ids)
    bnorm = tf.math.segment_sum(b64 * b64, ids)
    one = tf.ones_like(dot)
    acoef = tf.where(anorm >= _NORM_GUARD, 1.0 - dot / (2.0 * tf.where(anorm > 0, anorm, one)),
                     one)
    bcoef = tf.where(bnorm >= _NORM_GUARD, 1.0 - dot / (2.0 * tf.where(bnorm > 0, bnorm, one)),
                     one)
    acoef = tf.cast(tf.gather(acoef, ids), a.dtype)
    bcoef = tf.cast(tf.gather(bcoef, ids), a.dtype)
    return acoef * a + bcoef * b


def _adasum_flat(flat: tf.Tensor, sizes: List[int], name: str) -> tf.Tensor:
    me, n = basics.rank(), basics.size()
    distance, level = 1, 0
    while distance < n:
        partner = me ^ distance
        theirs = neighbor_allgather(flat, src_ranks=[partner], dst_ranks=[partner],
                                    name=f"{name}.adasum.{level}")
        flat = _combine(flat, theirs, sizes, me < partner)
        distance, level = distance * 2, level + 1
    return flat


def adasum_allreduce(tensors: Sequence, name: str, what: str) -> List[Optional[tf.Tensor]]:
    """The Adasum of every tensor of ``tensors`` over all ranks (None entries stay None).

    ``name`` is the request-name prefix (every rank must pass the same); ``what`` starts the
    error messages. Raises ValueError for a rank count that is not a power of two,
    UnsupportedReductionError for ``tf.IndexedSlices`` and TypeError for non-float tensors.
    Tensors of one dtype are flattened into one buffer and exchanged together.
    """
    check_adasum_size(what)
    results: List[Optional[tf.Tensor]] = [None] * len(tensors)
    by_dtype: dict = {}
    for i, t in enumerate(tensors):
        if t is None:
            continue
        if isinstance(t, tf.IndexedSlices):
            raise UnsupportedReductionError(
                f"{what}: op=bf.Adasum is not defined for tf.IndexedSlices (tensor {i}); convert "
                "it to a dense tensor first (sparse_as_dense=True on the optimizer or tape)")
        t = to_tensor(t, "allreduce", f"{name}.{i}")
        if not t.dtype.is_floating:
            raise TypeError(f"{op_error_prefix('allreduce', f'{name}.{i}')}: op=bf.Adasum "
                            f"needs float tensors, got {t.dtype.name}")
        if basics.size() == 1:
            results[i] = tf.identity(t)
            continue
        by_dtype.setdefault(t.dtype, []).append((i, t))
    for dtype, items in sorted(by_dtype.items(), key=lambda kv: kv[0].name):
        sizes = [int(t.shape.num_elements()) if t.shape.is_fully_defined() else -1
                 for _, t in items]
        if -1 in sizes:
            raise ValueError(f"{what}: op=bf.Adasum needs tensors of fully known shape; "
                             f"tensor {items[sizes.index(-1)][0]} has shape "
                             f"{items[sizes.index(-1)][1].shape}")
        flat = tf.concat([tf.reshape(t, [-1]) for _, t in items], axis=0)
        out = _adasum_flat(flat, sizes, f"{name}.{dtype.name}")
        for (i, t), part in zip(items, tf.split(out, sizes)):
            results[i] = tf.reshape(part, tf.shape(t))
    return results
