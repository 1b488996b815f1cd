"""Horovod's collectives beyond the seed: alltoall, reducescatter and the grouped forms of
reducescatter and allgather, with their gradients.

Like the seed's collectives, each is a C++ AsyncOpKernel matched across ranks by name; this
module validates arguments, names requests and registers gradients.
"""

from __future__ import annotations

import contextlib
from typing import Optional, Sequence, Union

import numpy as np
import tensorflow as tf

from bluefog.common import basics
from bluefog.common.process_sets import process_set_by_id
from bluefog.tensorflow.compression import Compression
from bluefog.tensorflow.compression import check as compression_check
from bluefog.tensorflow.mpi_ops import Average, Sum, allgather, scale_by
from bluefog.tensorflow.op_library import (
    forward_name,
    name_input,
    ops,
    process_set_attrs,
    request_name,
    set_size,
)
from bluefog.tensorflow.op_rules import check_dtype, op_error_prefix, to_tensor

__all__ = ["UnevenSplitError", "alltoall", "reducescatter", "grouped_reducescatter",
           "grouped_allgather"]


def _check_rank_at_least_one(tensor: tf.Tensor, op: str, name: str) -> None:
    if tensor.shape.rank == 0:
        raise ValueError(f"{op_error_prefix(op, name)}: {op} splits dimension 0 over the ranks "
                         "and needs a tensor of rank >= 1; reshape the scalar to [1] first")


def _static_splits(splits, what: str) -> Optional[list]:
    """``splits`` as a list of ints when it is known before running (else None). Only its form
    is checked here (one dimension of integers); the values are checked in the negotiation,
    against every rank's splits, so that one rank's mistake fails the alltoall on every rank
    instead of leaving the others waiting."""
    if isinstance(splits, (tf.Tensor, tf.Variable)):
        if splits.shape.rank not in (None, 1) or not splits.dtype.is_integer:
            raise ValueError(f"{what}: splits must be a 1-D integer tensor (one row count per "
                             f"rank), got shape {splits.shape} and dtype {splits.dtype.name}")
        value = tf.get_static_value(splits)
        if value is None:
            return None
        splits = value
    array = np.asarray(splits)
    if array.ndim != 1 or not (np.issubdtype(array.dtype, np.integer) or array.size == 0):
        raise ValueError(f"{what}: splits must be a flat list of ints (one row count per rank), "
                         f"got {splits!r:.80}")
    return [int(s) for s in array]


class UnevenSplitError(tf.errors.InvalidArgumentError, ValueError):
    """An alltoall without ``splits`` whose dimension 0 is not a multiple of the number of
    ranks: an ``InvalidArgumentError`` (the type Horovod raises) that is also a ``ValueError``."""

    def __init__(self, message: str):
        super().__init__(None, None, message)


def alltoall(tensor: Union[tf.Tensor, tf.Variable], splits=None,
             name: Optional[str] = None, process_set=None, ignore_name_scope: bool = False):
    """Rank r sends rows ``[offset_j, offset_j + splits[j])`` of ``tensor`` to each rank j.

    Returns the concatenation, in rank order, of the rows every rank sent to this one. With
    ``splits`` given it returns ``(output, received_splits)``, the second being how many rows
    each rank sent (int32, one entry per rank), as Horovod does. ``splits`` (a list, array or
    int tensor with one entry per rank, summing to dimension 0) defaults to equal splits, which
    needs dimension 0 to be a multiple of the number of ranks (else ``UnevenSplitError``, an
    ``InvalidArgumentError`` and a ``ValueError``). ``ignore_name_scope`` is accepted for
    Horovod's signature: request names never include the TensorFlow name scope here. Ranks
    may send different numbers of rows; the other dimensions and the dtype must match on
    every rank. The gradient is the reverse alltoall. With
    ``process_set``, among that set's ranks (``splits`` then has one entry per rank of the set).
    """
    name = request_name("alltoall", name)
    what = op_error_prefix("alltoall", name)
    tensor = to_tensor(tensor, "alltoall", name)
    check_dtype(tensor, "alltoall", name)
    _check_rank_at_least_one(tensor, "alltoall", name)
    set_attrs = process_set_attrs(process_set, what)
    size = set_size(process_set) if basics.is_initialized() else None
    if splits is None:
        rows = tensor.shape[0]
        if size and rows is not None and rows % size:
            raise UnevenSplitError(f"{what}: dimension 0 has {rows} rows, which do not split "
                                   f"evenly over {size} ranks; pass splits (one row count per "
                                   f"rank)")
        splits_input = tf.zeros([0], tf.int64)
    else:
        static = _static_splits(splits, what)
        splits_input = (tf.constant(static, tf.int64, shape=[len(static)]) if static is not None
                        else tf.cast(tf.reshape(splits, [-1]), tf.int64))
    output, received = ops.bluefog_alltoall(tensor, tensor_name=name_input(name),
                                            splits=splits_input, **set_attrs)
    if splits is None:
        return output
    return output, tf.cast(received, tf.int32)


@tf.RegisterGradient("BluefogAlltoall")
def _alltoall_grad(op, grad, _):
    """Each received block goes back to the rank that sent it."""
    back, _unused = ops.bluefog_alltoall(grad, tensor_name=name_input(_grad_name(op, "alltoall")),
                                         splits=op.outputs[1],
                                         process_set_id=op.get_attr("process_set_id"))
    return [back, None, None]


def _grad_name(op, what: str) -> str:
    return forward_name(op, 1) or request_name(what + ".grad", None)


def _average_flag(op, what: str) -> bool:
    if op not in (Average, Sum):
        raise ValueError(f"{what}: op must be bf.Average or bf.Sum for a reducescatter, got "
                         f"{op!r}")
    return op == Average


def _horovod_extras(what: str, compression, device_dense, ignore_name_scope, prescale_factor,
                    postscale_factor):
    """Checks Horovod's extra reducescatter arguments; returns the checked compression."""
    if not isinstance(ignore_name_scope, bool):
        raise TypeError(f"{what}: ignore_name_scope must be a bool, got {ignore_name_scope!r}")
    if not isinstance(device_dense, str):
        raise TypeError(f"{what}: device_dense must be a device string, got {device_dense!r}")
    for label, value in (("prescale_factor", prescale_factor),
                         ("postscale_factor", postscale_factor)):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise TypeError(f"{what}: {label} must be a number, got {value!r}")
    if compression is not Compression.none:
        compression = compression_check(compression, what)
    return compression


def reducescatter(tensor: Union[tf.Tensor, tf.Variable], op=Average,
                  name: Optional[str] = None, process_set=None, device_dense: str = "",
                  compression=Compression.none, ignore_name_scope: bool = False,
                  prescale_factor: float = 1.0, postscale_factor: float = 1.0) -> tf.Tensor:
    """The sum (``op=bf.Sum``) or mean (``bf.Average``, the default) of ``tensor`` over ranks,
    of which each rank returns its slice of dimension 0.

    Every rank must pass the same shape and dtype. Dimension 0 is split as Horovod splits it:
    ``rows // size`` rows each, and one more for the first ``rows % size`` ranks (ranks beyond
    the rows get zero rows). Integer averages truncate toward zero. The gradient is the
    allgather of the upstream gradients (divided by the number of ranks for an average): the
    derivative of the sum of every rank's loss (Horovod's is ``size`` times that; see
    docs/training.md). ``process_set``: over that set's ranks only. Horovod's
    ``prescale_factor`` / ``postscale_factor`` multiply each rank's input / the result
    (integers in float64 math, truncated, as Horovod does); ``compression``
    (``bf.Compression.fp16``/``.bf16``) sends floats in 16 bits; ``device_dense`` places the
    op; ``ignore_name_scope`` is accepted for the signature (request names never include the
    name scope here).
    """
    name = request_name("reducescatter", name)
    what = op_error_prefix("reducescatter", name)
    average = _average_flag(op, what)
    compression = _horovod_extras(what, compression, device_dense, ignore_name_scope,
                                  prescale_factor, postscale_factor)
    tensor = to_tensor(tensor, "reducescatter", name)
    check_dtype(tensor, "reducescatter", name)
    _check_rank_at_least_one(tensor, "reducescatter", name)
    set_attrs = process_set_attrs(process_set, what)
    with tf.device(device_dense) if device_dense else contextlib.nullcontext():
        sent, context = compression.compress(scale_by(tensor, prescale_factor))
        out = ops.bluefog_reducescatter(sent, tensor_name=name_input(name), average=average,
                                        **set_attrs)
        return scale_by(compression.decompress(out, context), postscale_factor)


def _set_of(op):
    set_id = op.get_attr("process_set_id")
    return None if set_id == 0 else process_set_by_id(set_id)


def _gather_grad(grad, average: bool, name: Optional[str], process_set):
    gathered = allgather(grad, name=name, process_set=process_set)
    if average:
        gathered = gathered / tf.cast(set_size(process_set), gathered.dtype)
    return gathered


@tf.RegisterGradient("BluefogReducescatter")
def _reducescatter_grad(op, grad):
    return [_gather_grad(grad, op.get_attr("average"), forward_name(op), _set_of(op)), None]


def grouped_reducescatter(tensors: Sequence, op=Average, name: Optional[str] = None,
                          process_set=None, device_dense: str = "",
                          compression=Compression.none, ignore_name_scope: bool = False,
                          prescale_factor: float = 1.0, postscale_factor: float = 1.0) -> list:
    """``[reducescatter(t, op) for t in tensors]`` with the tensors of one dtype in one op.

    Every rank must pass the same number of tensors with the same shapes and dtypes, in the
    same order. ``device_dense``, ``compression``, ``ignore_name_scope``, ``prescale_factor``
    and ``postscale_factor`` as for ``reducescatter``.
    """
    name = request_name("grouped_reducescatter", name)
    what = op_error_prefix("grouped_reducescatter", name, of_tensor=False)
    average = _average_flag(op, what)
    compression = _horovod_extras(what, compression, device_dense, ignore_name_scope,
                                  prescale_factor, postscale_factor)
    set_attrs = process_set_attrs(process_set, what)
    if not isinstance(tensors, (list, tuple)):
        raise TypeError(f"{what}: tensors must be a list or tuple of tensors, got "
                        f"{type(tensors).__name__}")
    by_dtype: dict = {}
    contexts: list = [None] * len(tensors)
    with tf.device(device_dense) if device_dense else contextlib.nullcontext():
        for i, t in enumerate(tensors):
            t = to_tensor(t, "grouped_reducescatter", f"{name}.{i}")
            check_dtype(t, "grouped_reducescatter", f"{name}.{i}")
            _check_rank_at_least_one(t, "grouped_reducescatter", f"{name}.{i}")
            dtype = t.dtype  # grouped by the dtype before compression, as grouped_allreduce
            t, contexts[i] = compression.compress(scale_by(t, prescale_factor))
            by_dtype.setdefault(dtype, []).append((i, t))
        results: list = [None] * len(tensors)
        for dtype, items in sorted(by_dtype.items(), key=lambda kv: kv[0].name):
            outs = ops.bluefog_grouped_reducescatter(
                [t for _, t in items], average=average,
                tensor_name=name_input(f"{name}.{dtype.name}"), **set_attrs)
            for (i, _), out in zip(items, outs):
                results[i] = scale_by(compression.decompress(out, contexts[i]), postscale_factor)
    return results


@tf.RegisterGradient("BluefogGroupedReducescatter")
def _grouped_reducescatter_grad(op, *grads):
    base = forward_name(op)
    average = op.get_attr("average")
    process_set = _set_of(op)
    return [None if g is None else
            _gather_grad(tf.convert_to_tensor(g), average,
                         None if base is None else f"{base}.{i}", process_set)
            for i, g in enumerate(grads)] + [None]


def grouped_allgather(tensors: Sequence, name: Optional[str] = None,
                      process_set=None, ignore_name_scope: bool = False) -> list:
    """``[allgather(t) for t in tensors]``, named ``name.0`` ... ``name.N-1``.

    ``ignore_name_scope`` is accepted for Horovod's signature (request names never include the
    TensorFlow name scope here).

    Every rank must pass the same number of tensors, in the same order; as for ``allgather``,
    dimension 0 may differ between ranks. Ranks that pass different numbers of tensors get an
    error on every rank (``tf.errors.FailedPreconditionError`` eagerly,
    ``tf.errors.InvalidArgumentError`` in a graph), from one small allgather of the counts that
    runs first.
    """
    name = request_name("grouped_allgather", name)
    what = op_error_prefix("grouped_allgather", name, of_tensor=False)
    if not isinstance(tensors, (list, tuple)):
        raise TypeError(f"{what}: tensors must be a list or tuple of tensors, got "
                        f"{type(tensors).__name__}")
    n = len(tensors)
    # Separate requests: with different counts, some ranks would wait for names the others never
    # send. The counts' allgather (small enough to ride in the negotiation round) comes first.
    counts = allgather(tf.constant([n], tf.int32), name=f"{name}.count", process_set=process_set)
    advice = "Pass the same number of tensors to grouped_allgather on every rank."
    if tf.executing_eagerly():
        counts = counts.numpy().tolist()
        if any(c != n for c in counts):
            ranks = getattr(process_set, "ranks", None) or list(range(basics.size()))
            listed = ", ".join(f"rank {r} has {c}" for r, c in zip(ranks, counts))
            raise tf.errors.FailedPreconditionError(
                None, None, f"{what}: ranks disagree on the number of tensors: {listed}. {advice}")
        return [allgather(t, name=f"{name}.{i}", process_set=process_set)
                for i, t in enumerate(tensors)]
    agreed = tf.debugging.assert_equal(
        counts, n, message=f"{what}: ranks disagree on the number of tensors (each rank's count "
                           f"follows; this rank has {n}). {advice}")
    with tf.control_dependencies([agreed]):
        return [allgather(tf.identity(t), name=f"{name}.{i}", process_set=process_set)
                for i, t in enumerate(tensors)]
