"""The collectives as TensorFlow ops: allreduce, allgather, broadcast.

Each op is a C++ AsyncOpKernel that hands the tensor to the bluefog runtime; this module only
names requests and validates arguments. Their gradients are in collective_grads.py.
"""

from __future__ import annotations

from typing import Optional, Union

import tensorflow as tf

from bluefog.common import basics, topology
from bluefog.tensorflow import adasum as _adasum
from bluefog.tensorflow import eager_calls
from bluefog.tensorflow.compression import Compression
from bluefog.tensorflow.compression import check as compression_check
from bluefog.tensorflow.feedback import ReducingCompressor
from bluefog.tensorflow.op_library import (
    device_scope,
    eager_inline_attrs,
    eager_name,
    name_input,
    one_device,
    ops,
    process_set_attrs,
    request_name,
    set_size,
)
from bluefog.tensorflow.op_rules import (
    UnsupportedReductionError,
    check_dtype,
    op_error_prefix,
    to_tensor,
)

# The reductions of allreduce's `op` (Horovod's names). Average and Sum are `average=True/False`.
Average = "average"
"""``op=`` of the reductions: the mean over the ranks (of a process set: over its ranks)."""
Sum = "sum"
"""``op=`` of the reductions: the sum over the ranks."""
Min = "min"
"""``op=`` of ``allreduce``: the elementwise minimum (NaN where any rank has NaN)."""
Max = "max"
"""``op=`` of ``allreduce``: the elementwise maximum (NaN where any rank has NaN)."""
Product = "product"
"""``op=`` of ``allreduce``: the elementwise product over the ranks."""
Adasum = _adasum.Adasum  # composed in Python from neighbor exchanges, see adasum.py
"""``op=`` of ``allreduce``, ``grouped_allreduce``, the tape and ``DistributedOptimizer``:
Horovod's adaptive summation (float tensors, power-of-two rank counts)."""
_REDUCE_OPS = (Average, Sum, Min, Max, Product)


def _check_scale(prescale_factor, postscale_factor, dtype: tf.DType, reduce_op: str,
                 what: str) -> float:
    """prescale_factor * postscale_factor, checked: the runtime applies one factor after the
    sum, which is what Horovod's two factors give for sums and averages (up to rounding)."""
    for label, value in (("prescale_factor", prescale_factor),
                         ("postscale_factor", postscale_factor)):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise TypeError(f"{what}: {label} must be a number, got {value!r}")
    scale = float(prescale_factor) * float(postscale_factor)
    if scale != 1.0 and (reduce_op != "sum" or not dtype.is_floating):
        raise ValueError(f"{what}: prescale_factor and postscale_factor apply to sums and "
                         f"averages of float tensors only, not to {reduce_op} of {dtype.name}")
    return scale


def scale_by(tensor: tf.Tensor, factor) -> tf.Tensor:
    """``tensor * factor`` as Horovod scales: integers in float64 math, truncated back to their
    dtype; float16 in float32 math; other floats in their own dtype."""
    if float(factor) == 1.0:
        return tensor
    if tensor.dtype.is_integer:
        return tf.cast(tf.cast(tensor, tf.float64) * float(factor), tensor.dtype)
    if tensor.dtype == tf.float16:
        return tf.cast(tf.cast(tensor, tf.float32) * float(factor), tf.float16)
    return tensor * tf.constant(float(factor), tensor.dtype)


def _integer_scaled(tensor: tf.Tensor, reduce_op: str, prescale_factor, postscale_factor,
                    what: str) -> bool:
    """Whether ``tensor`` is an integer sum or average with a scale factor, which is scaled
    here, around the op (the op's scaling is for floats)."""
    if not tensor.dtype.is_integer or reduce_op != "sum":
        return False
    _check_scale(prescale_factor, postscale_factor, tf.float32, reduce_op, what)
    return True


# Passed on every call: left out, the generated op wrapper passes the defaults as ints (1), which
# TensorFlow's eager fast path refuses for a float attribute, so every eager call took the slow
# fallback path (about 30-100 us more per call).
_UNSCALED = {"prescale_factor": 1.0, "postscale_factor": 1.0}
_UNSCALED_INLINE = {**_UNSCALED, "eager_inline": True}


def _scale_attrs(prescale_factor, postscale_factor) -> dict:
    """The scale attributes to pass, as floats."""
    if prescale_factor == 1.0 and postscale_factor == 1.0:
        return _UNSCALED
    return {"prescale_factor": float(prescale_factor), "postscale_factor": float(postscale_factor)}


def _horovod_device(device, device_dense, device_sparse, ignore_name_scope, op: str,
                    name: str) -> str:
    """``op_library.one_device`` for a collective; also checks ``ignore_name_scope``."""
    if not device_dense and not device_sparse and isinstance(ignore_name_scope, bool):
        return device  # the common case, kept cheap: this runs on every eager call
    what = op_error_prefix(op, name)
    if not isinstance(ignore_name_scope, bool):
        raise TypeError(f"{what}: ignore_name_scope must be a bool, got {ignore_name_scope!r}")
    return one_device(device, device_dense, device_sparse, what)


def _scale64(out, prescale_factor, postscale_factor):
    """float64 results are scaled here, in float64: the op's scale attributes are float32
    (TensorFlow's float attributes), which would round a factor such as 1/3 to about 3e-8."""
    scale = float(prescale_factor) * float(postscale_factor)
    return out if scale == 1.0 else out * tf.constant(scale, tf.float64)


def _reduce_op(op, average: bool, what: str):
    """(average, reduce_op attr) for `op` (None: `average` decides)."""
    if op is None:
        return average, "sum"
    if op not in _REDUCE_OPS:
        raise ValueError(f"{what}: op must be one of bf.Average, bf.Sum, bf.Min, bf.Max, "
                         f"bf.Product, bf.Adasum, got {op!r}")
    if op in (Average, Sum):
        return op == Average, "sum"
    return False, op


def allreduce(tensor: Union[tf.Tensor, tf.Variable, tf.IndexedSlices], average: bool = True,
              name: Optional[str] = None, device: str = "",
              compression=Compression.none, op=None, prescale_factor: float = 1.0,
              postscale_factor: float = 1.0,
              process_set=None, device_dense: str = "", device_sparse: str = "",
              ignore_name_scope: bool = False) -> Union[tf.Tensor, tf.IndexedSlices]:
    """Sum, or with ``average=True`` the mean, of ``tensor`` over all ranks.

    Every rank must call it with the same name (or in the same order when unnamed), dtype and
    shape. ``average=None`` (Horovod's default) means True. Integer averages truncate toward
    zero. A ``tf.IndexedSlices`` is reduced by gathering
    its values and indices from every rank; the result is an ``IndexedSlices`` representing the
    sum (or mean) of the dense tensors. ``compression`` (``bf.Compression.fp16``/``.bf16``)
    sends floats in 16 bits and returns the input's dtype; ``.int8``, ``.int4``, ``.topk``
    and ``.powersgd`` reduce floats compressed with error feedback (keyed by ``name``; see
    ``bf.Compression``); ranks must agree on it.
    ``op`` (``bf.Average``, ``bf.Sum``, ``bf.Min``, ``bf.Max``, ``bf.Product``), when given,
    decides the reduction instead of ``average``; ranks must agree on it. Floating-point min
    and max return NaN where any rank has NaN. ``prescale_factor`` and ``postscale_factor``
    (Horovod's) multiply the sum or mean of float tensors; bluefog applies their product once,
    in C++, after the sum. Integer tensors are scaled as Horovod scales them: each rank's input
    by ``prescale_factor`` and the result by ``postscale_factor``, in float64, truncated.
    ``process_set`` (a registered ``bf.ProcessSet``; default every rank) runs it over that
    set's ranks only, averaging over the set's size. ``op=bf.Adasum``
    combines float tensors by adaptive summation (``adasum.py``; power-of-two rank counts only,
    no compression, scale factors or process sets). Horovod's ``device_dense`` and
    ``device_sparse`` are other names for ``device`` (those given must agree);
    ``ignore_name_scope`` is accepted for its signature: request names never include the
    TensorFlow name scope here.
    """
    if ((op is None or (type(op) is str and (op == Sum or op == Average)))
            and compression is Compression.none and not device and not device_dense
            and not device_sparse and process_set is None and prescale_factor == 1.0
            and postscale_factor == 1.0 and ignore_name_scope is False
            and (average is True or average is False)):
        name_tensor = eager_name(tensor, name, "allreduce")
        if name_tensor is not None:  # the common eager call (op_library.eager_name)
            return _plain_allreduce(tensor, average if op is None else op == Average, name,
                                    name_tensor, True)
    name = request_name("allreduce", name)
    device = _horovod_device(device, device_dense, device_sparse, ignore_name_scope, "allreduce",
                             name)
    if average is None:  # Horovod's default when op= decides
        average = True
    if not isinstance(average, bool):
        raise TypeError(f"{op_error_prefix('allreduce', name)}: average must be a bool, got "
                        f"{average!r}")
    if op == Adasum:
        return _adasum_call([tensor], name, compression, prescale_factor, postscale_factor,
                            process_set,
                            op_error_prefix("allreduce", name))[0]
    reduce_op = "sum"
    if op is not None or compression is not Compression.none:
        what = op_error_prefix("allreduce", name)
        average, reduce_op = _reduce_op(op, average, what)
        if compression is not Compression.none:
            compression = compression_check(compression, what)
    scaled = prescale_factor != 1.0 or postscale_factor != 1.0
    set_attrs = (process_set_attrs(process_set, op_error_prefix("allreduce", name))
                 if process_set is not None else {})
    if isinstance(tensor, tf.IndexedSlices):
        if reduce_op != "sum":
            raise UnsupportedReductionError(
                f"{op_error_prefix('allreduce', name)}: op {reduce_op} is not defined for "
                "tf.IndexedSlices; convert it to a dense tensor first (tf.convert_to_tensor)")
        if scaled and not tensor.values.dtype.is_floating:
            raise UnsupportedReductionError(
                f"{op_error_prefix('allreduce', name)}: prescale_factor and postscale_factor are "
                f"not supported for a tf.IndexedSlices of {tensor.values.dtype.name} (as in "
                "Horovod); convert it to a dense tensor first (tf.convert_to_tensor)")
        scale = (_check_scale(prescale_factor, postscale_factor, tensor.values.dtype, reduce_op,
                              op_error_prefix("allreduce", name)) if scaled else 1.0)
        if isinstance(compression, ReducingCompressor):
            compression = Compression.none  # IndexedSlices are gathered uncompressed
        return _allreduce_indexed_slices(tensor, average, name, device, compression, scale,
                                         process_set)
    if not isinstance(tensor, tf.Tensor):
        tensor = to_tensor(tensor, "allreduce", name)
    check_dtype(tensor, "allreduce", name)
    if isinstance(compression, ReducingCompressor):
        if tensor.dtype.is_floating:
            return _reduced(compression, [tensor], average, name, name, reduce_op,
                            prescale_factor * postscale_factor, process_set, device,
                            op_error_prefix("allreduce", name))[0]
        compression = Compression.none  # integers are reduced uncompressed
    if compression is Compression.none and not device and reduce_op == "sum" and not scaled \
            and not set_attrs:  # op None, bf.Sum or bf.Average (Adasum returned above)
        return _plain_allreduce(tensor, average, name, None, tf.executing_eagerly())
    if scaled and _integer_scaled(tensor, reduce_op, prescale_factor, postscale_factor,
                                  op_error_prefix("allreduce", name)):
        out = allreduce(scale_by(tensor, prescale_factor), average=average, name=name,
                        device=device, compression=compression, op=op, process_set=process_set)
        return scale_by(out, postscale_factor)
    if scaled:
        _check_scale(prescale_factor, postscale_factor, tensor.dtype, reduce_op,
                     op_error_prefix("allreduce", name))
    sent, context = compression.compress(tensor)
    in_op = (_scale_attrs(prescale_factor, postscale_factor) if sent.dtype != tf.float64
             else _UNSCALED)
    with device_scope(device):
        out = ops.bluefog_allreduce(sent, tensor_name=name_input(name), average=average,
                                    reduce_op=reduce_op, **in_op, **set_attrs,
                                    **eager_inline_attrs())
    if scaled and sent.dtype == tf.float64:
        out = _scale64(out, prescale_factor, postscale_factor)
    return compression.decompress(out, context)


def _plain_allreduce(tensor: tf.Tensor, average: bool, name: str, name_tensor, eager: bool):
    """A checked allreduce with every argument but ``name`` and ``average`` (``op`` Sum or
    Average becomes ``average``) at its default: the one place where an eager call may skip the
    op (eager_calls), else the op. ``name_tensor``: the name's cached input when the lean path
    found one (op_library.eager_name), else None."""
    if eager and type(tensor) is eager_calls.EagerTensor:
        out = eager_calls.allreduce(tensor, name, average)
        if out is not None:
            if name_tensor is None and ".noname." not in name:
                name_input(name)  # the name's later calls take the lean path (eager_name)
            return out
    return ops.bluefog_allreduce(
        tensor, tensor_name=name_input(name) if name_tensor is None else name_tensor,
        average=average, **(_UNSCALED_INLINE if eager else _UNSCALED))


def grouped_allreduce(tensors, average: bool = True, name: Optional[str] = None,
                      device: str = "", compression=Compression.none, op=None,
                      prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                      process_set=None, device_dense: str = "", device_sparse: str = "",
                      ignore_name_scope: bool = False) -> list:
    """Allreduce of every tensor in ``tensors``, as few TF ops and collectives as possible.

    Equivalent to ``[allreduce(t, average, compression=...) for t in tensors]`` but dense
    tensors of one dtype (after compression) go through a single op, so the runtime receives
    them together and fuses them. Every rank must pass the same number of tensors with the same
    shapes and dtypes in the same order. ``IndexedSlices`` and ``None`` entries are handled one
    by one (``None`` stays ``None``). ``op``, ``prescale_factor``, ``postscale_factor`` and
    ``process_set`` as for ``allreduce``.
    """
    name = request_name("grouped_allreduce", name)
    device = _horovod_device(device, device_dense, device_sparse, ignore_name_scope,
                             "grouped_allreduce", name)
    what = op_error_prefix("grouped_allreduce", name, of_tensor=False)
    if average is None:  # Horovod's default when op= decides
        average = True
    if not isinstance(average, bool):
        raise TypeError(f"{what}: average must be a bool, got {average!r}")
    if op == Adasum:
        if not isinstance(tensors, (list, tuple)):
            raise TypeError(f"{what}: tensors must be a list or tuple of tensors, got "
                            f"{type(tensors).__name__}")
        return _adasum_call(tensors, name, compression, prescale_factor, postscale_factor,
                            process_set, what)
    average, reduce_op = _reduce_op(op, average, what)
    set_attrs = process_set_attrs(process_set, what)
    if compression is not Compression.none:
        compression = compression_check(compression, what)
    if not isinstance(tensors, (list, tuple)):
        raise TypeError(f"{what}: tensors must be a list or tuple of tensors, got "
                        f"{type(tensors).__name__}")
    results: list = [None] * len(tensors)
    contexts: list = [None] * len(tensors)
    by_dtype: dict = {}
    reducing = compression if isinstance(compression, ReducingCompressor) else None
    if reducing is not None:
        compression = Compression.none  # what reducing leaves: integers and IndexedSlices
    compressed: list = []
    for i, t in enumerate(tensors):
        if t is None:
            continue
        if isinstance(t, tf.IndexedSlices):
            if reduce_op != "sum":
                raise UnsupportedReductionError(
                    f"{what}: op {reduce_op} is not defined for tf.IndexedSlices (tensor {i}); "
                    "convert it to a dense tensor first")
            scale = _check_scale(prescale_factor, postscale_factor, t.values.dtype, reduce_op,
                                 what)
            results[i] = _allreduce_indexed_slices(t, average, f"{name}.sparse.{i}", device,
                                                   compression, scale, process_set)
            continue
        t = to_tensor(t, "grouped_allreduce", f"{name}.{i}")
        check_dtype(t, "grouped_allreduce", f"{name}.{i}")
        if t.dtype.is_integer and reduce_op == "sum":  # scaled here, as Horovod scales ints
            _check_scale(prescale_factor, postscale_factor, tf.float32, reduce_op, what)
            t = scale_by(t, prescale_factor)
        else:
            _check_scale(prescale_factor, postscale_factor, t.dtype, reduce_op, what)
        if reducing is not None and t.dtype.is_floating:
            compressed.append((i, t))
            continue
        # Grouped and named by the dtype before compression: ranks that disagree on compression
        # then meet under one name and get a dtype error, instead of waiting for each other.
        dtype = t.dtype
        if compression is not Compression.none:
            t, contexts[i] = compression.compress(t)
        by_dtype.setdefault(dtype, []).append((i, t))
    with device_scope(device):
        for dtype, items in sorted(by_dtype.items(), key=lambda kv: kv[0].name):
            f64 = items[0][1].dtype == tf.float64
            integer = items[0][1].dtype.is_integer
            in_op = (_scale_attrs(prescale_factor, postscale_factor) if not (f64 or integer)
                     else _UNSCALED)
            outs = ops.bluefog_grouped_allreduce([t for _, t in items], average=average,
                                                 tensor_name=name_input(f"{name}.{dtype.name}"),
                                                 reduce_op=reduce_op, **in_op, **set_attrs)
            for (i, _), out in zip(items, outs):
                results[i] = (_scale64(out, prescale_factor, postscale_factor) if f64 else
                              scale_by(out, postscale_factor) if integer else out)
    if compression is not Compression.none:
        for i, _ in (item for items in by_dtype.values() for item in items):
            results[i] = compression.decompress(results[i], contexts[i])
    if compressed:
        # The agreement check takes the name that the first dtype group of an uncompressed call
        # would (floats sort first), so a rank without this compression meets it there.
        first = min(t.dtype.name for _, t in compressed)
        outs = _reduced(reducing, [t for _, t in compressed], average, f"{name}.compressed",
                        f"{name}.{first}", reduce_op, prescale_factor * postscale_factor,
                        process_set, device, what)
        for (i, _), out in zip(compressed, outs):
            results[i] = out
    return results


@tf.autograph.experimental.do_not_convert
def _reduced(compression: ReducingCompressor, tensors: list, average: bool, name: str,
             check_name: str, reduce_op: str, scale: float, process_set, device: str,
             what: str) -> list:
    """Float tensors summed or averaged by a compressor with error feedback (feedback.py)."""
    if reduce_op != "sum":
        raise ValueError(f"{what}: {compression!r} computes sums and averages only, not "
                         f"{reduce_op}; use bf.Compression.none for op={reduce_op}")
    if scale != 1.0:
        _check_scale(scale, 1.0, tf.float32, reduce_op, what)
    with device_scope(device):
        outs = compression.reduce(list(tensors), average, name, check_name, process_set, what)
    return [scale_by(o, scale) for o in outs]


def _adasum_call(tensors, name: str, compression, prescale_factor, postscale_factor,
                 process_set, what: str) -> list:
    """op=bf.Adasum (see adasum.py); compression, scale factors and process sets are refused
    with it."""
    if compression is not Compression.none:
        raise ValueError(f"{what}: op=bf.Adasum does not support compression")
    if prescale_factor != 1.0 or postscale_factor != 1.0:
        raise ValueError(f"{what}: op=bf.Adasum does not support prescale_factor or "
                         "postscale_factor")
    if process_set_attrs(process_set, what):
        raise ValueError(f"{what}: op=bf.Adasum runs on the global process set only")
    return _adasum.adasum_allreduce(list(tensors), name, what)


def _allreduce_indexed_slices(slices: tf.IndexedSlices, average: bool, name: str,
                              device: str, compression=Compression.none,
                              scale: float = 1.0, process_set=None) -> tf.IndexedSlices:
    sent, context = compression.compress(slices.values)
    with device_scope(device):
        values = compression.decompress(
            allgather(sent, name=name + ".values", process_set=process_set), context)
        indices = allgather(slices.indices, name=name + ".indices", process_set=process_set)
    if average:
        if values.dtype.is_floating:
            values = _divide(values, set_size(process_set))
        else:
            # As Horovod (values / size): true division, so integer rows become floating point
            # (float32 up to 16 bits, float64 above). The rows of each index are added first,
            # so that the result has each index once and equals the dense sum over size.
            indices, position = tf.unique(indices)
            values = tf.math.unsorted_segment_sum(values, position, tf.shape(indices)[0])
            values = tf.math.truediv(values, tf.cast(set_size(process_set), values.dtype))
    if scale != 1.0:
        values = values * tf.cast(scale, values.dtype)
    return tf.IndexedSlices(values, indices, dense_shape=slices.dense_shape)


def _divide(tensor: tf.Tensor, n: int) -> tf.Tensor:
    if tensor.dtype.is_floating:
        return tensor / tf.cast(n, tensor.dtype)
    return tf.truncatediv(tensor, tf.cast(n, tensor.dtype))


def barrier(process_set=None) -> None:
    """Returns once every rank (of ``process_set``, default all) has called it (Horovod's
    ``hvd.barrier``). Calls match by order, like unnamed collectives."""
    name = request_name("barrier", None)
    set_attrs = process_set_attrs(process_set, op_error_prefix("barrier", name))
    ops.bluefog_allreduce(tf.constant(0, tf.int32), tensor_name=name_input(name), average=False,
                          **_UNSCALED, **set_attrs, **eager_inline_attrs())


def allgather(tensor: Union[tf.Tensor, tf.Variable], name: Optional[str] = None,
              process_set=None, ignore_name_scope: bool = False) -> tf.Tensor:
    """Concatenation along dimension 0 of ``tensor`` from every rank, in rank order.

    Ranks may pass different sizes of dimension 0; rank and the other dimensions must match.
    ``process_set``: gather over that set's ranks only (in their order).
    """
    if process_set is None and ignore_name_scope is False:
        name_tensor = eager_name(tensor, name, "allgather")
        if name_tensor is not None and tensor.shape.rank:  # op_library.eager_name
            return ops.bluefog_allgather(tensor, tensor_name=name_tensor, eager_inline=True)
    name = request_name("allgather", name)
    _horovod_device("", "", "", ignore_name_scope, "allgather", name)
    tensor = to_tensor(tensor, "allgather", name)
    check_dtype(tensor, "allgather", name)
    if tensor.shape.rank == 0:
        raise ValueError(f"{op_error_prefix('allgather', name)}: allgather concatenates along "
                         "dimension 0 and needs a tensor of rank >= 1; reshape the scalar to [1] "
                         "first")
    set_attrs = process_set_attrs(process_set, op_error_prefix("allgather", name))
    return ops.bluefog_allgather(tensor, tensor_name=name_input(name), **set_attrs,
                                 **eager_inline_attrs())


def broadcast(tensor: Union[tf.Tensor, tf.Variable], root_rank: int,
              name: Optional[str] = None, process_set=None,
              ignore_name_scope: bool = False) -> tf.Tensor:
    """The value of ``tensor`` on ``root_rank``, returned on every rank.

    Every rank must pass the same name, ``root_rank``, dtype and shape. With ``process_set``,
    over that set's ranks only; ``root_rank`` is then a job-wide rank in the set.
    """
    name = request_name("broadcast", name)
    _horovod_device("", "", "", ignore_name_scope, "broadcast", name)
    tensor = to_tensor(tensor, "broadcast", name)
    check_dtype(tensor, "broadcast", name)
    if isinstance(root_rank, bool) or not isinstance(root_rank, int):
        raise TypeError(f"{op_error_prefix('broadcast', name)}: root_rank must be an int, got "
                        f"{root_rank!r}")
    if basics.is_initialized() and not 0 <= root_rank < basics.size():
        raise ValueError(f"{op_error_prefix('broadcast', name)}: root_rank {root_rank} is "
                         f"outside [0, {basics.size()})")
    set_attrs = process_set_attrs(process_set, op_error_prefix("broadcast", name))
    if set_attrs and root_rank not in process_set.ranks:
        raise ValueError(f"{op_error_prefix('broadcast', name)}: root_rank {root_rank} is not "
                         f"in {process_set}")
    return ops.bluefog_broadcast(tensor, tensor_name=name_input(name), root_rank=root_rank,
                                 **set_attrs, **eager_inline_attrs())


_agreements = [0]


def _forget_agreements() -> None:
    _agreements[0] = 0


basics.register_reinit_hook(_forget_agreements)


def _topology_allgather(pair) -> list:
    """Every rank's int pair, for set_topology's agreement check (eager even while tracing)."""
    _agreements[0] += 1
    with tf.init_scope():
        rows = allgather(tf.constant([pair], tf.int64),
                         name=f"set_topology.agree.{_agreements[0]}")
        return [tuple(int(v) for v in row) for row in rows.numpy()]


topology.register_agreement(_topology_allgather)
