"""The collectives as TensorFlow ops: allreduce, allgather, broadcast, and their gradients.

Each op is a C++ AsyncOpKernel that hands the tensor to the bluefog runtime; this module only
names requests, validates arguments and registers gradients.
"""

from __future__ import annotations

import collections
import contextlib
import threading
from typing import Optional, Union

import tensorflow as tf

from bluefog.common import basics
from bluefog.tensorflow import compat
from bluefog.tensorflow.compression import Compression
from bluefog.tensorflow.compression import check as compression_check

_ops = compat.load_ops(basics.library_dir())
_OP_TYPES = ("BluefogAllreduce", "BluefogGroupedAllreduce", "BluefogAllgather", "BluefogBroadcast",
             "BluefogNeighborAllreduce", "BluefogNeighborAllgather",
             "BluefogNeighborAllgatherGrad")


def _allow_concurrent_collectives_in_functions() -> None:
    """Lets tf.function run independent collectives concurrently.

    The ops are stateful (so grappler never constant-folds or merges them), and tf.function
    chains stateful ops in program order, which would run a step's gradient allreduces one at a
    time and defeat fusion. The runtime matches requests by name, so their order does not matter:
    declare them order-insensitive, as TensorFlow does for its own collectives.
    """
    from tensorflow.python.framework import auto_control_deps

    # "Must run, order-insensitive": not chained to other stateful ops, but still run even when
    # nothing consumes the result (another rank may be waiting for this collective).
    must_run = getattr(auto_control_deps, "MUST_RUN_ORDER_INSENSITIVE_STATEFUL_OPS", None)
    if isinstance(must_run, frozenset):
        auto_control_deps.MUST_RUN_ORDER_INSENSITIVE_STATEFUL_OPS = must_run | set(_OP_TYPES)


_allow_concurrent_collectives_in_functions()

# The reductions of allreduce's `op` (Horovod's names). Average and Sum are `average=True/False`.
Average = "average"
Sum = "sum"
Min = "min"
Max = "max"
Product = "product"
_REDUCE_OPS = (Average, Sum, Min, Max, Product)


def _reduce_op(op, average: bool, what: str):
    """(average, reduce_op attr) for `op` (None: `average` decides)."""
    if op is None:
        return average, "sum"
    if op not in _REDUCE_OPS:
        raise ValueError(f"{what}: op must be one of bf.Average, bf.Sum, bf.Min, bf.Max, "
                         f"bf.Product, got {op!r}")
    if op in (Average, Sum):
        return op == Average, "sum"
    return False, op


NUMERIC_DTYPES = frozenset([tf.uint8, tf.int8, tf.uint16, tf.int16, tf.int32, tf.int64,
                            tf.float16, tf.bfloat16, tf.float32, tf.float64])
ALL_DTYPES = NUMERIC_DTYPES | {tf.bool}

_name_lock = threading.Lock()
_name_counters: dict = {}


def _request_name(op: str, name: Optional[str]) -> str:
    """The name every rank uses to match this request.

    Without a name, the n-th unnamed call of `op` in this process is called "op.noname.n": it
    matches across ranks as long as every rank issues its unnamed collectives in one order.
    """
    if name is not None:
        if not isinstance(name, str) or not name:
            raise ValueError(f"rank {_rank_or_unknown()}: bluefog {op}: name must be a non-empty "
                             f"str or None, got {name!r}")
        return name
    with _name_lock:
        n = _name_counters.get(op, 0)
        _name_counters[op] = n + 1
    return f"{op}.noname.{n}"


_name_tensors: "collections.OrderedDict[str, tf.Tensor]" = collections.OrderedDict()
_NAME_CACHE_SIZE = 4096


def _name_input(name: str):
    """The op's name input. In eager mode a ready string tensor: handing the generated op a
    Python str makes TensorFlow take its slow dispatch path (~50 us more per call)."""
    if not tf.executing_eagerly():
        return name
    with _name_lock:
        t = _name_tensors.get(name)
        if t is not None:
            _name_tensors.move_to_end(name)
            return t
    t = tf.constant(name)
    if ".noname." not in name:  # unnamed calls never repeat a name
        with _name_lock:
            _name_tensors[name] = t
            if len(_name_tensors) > _NAME_CACHE_SIZE:
                _name_tensors.popitem(last=False)
    return t


_consts: "collections.OrderedDict[tuple, tf.Tensor]" = collections.OrderedDict()


def _const(values, dtype: tf.DType):
    """A small constant op input (ranks, weights); cached in eager mode, where the same
    topology lists repeat every step and building a tensor costs more than the collective."""
    if not tf.executing_eagerly():
        return tf.constant(values, dtype, shape=None if isinstance(values, float) else
                           [len(values)])
    key = (dtype, values if isinstance(values, float) else tuple(values))
    with _name_lock:
        t = _consts.get(key)
        if t is not None:
            return t
    t = tf.constant(values, dtype, shape=None if isinstance(values, float) else [len(values)])
    with _name_lock:
        _consts[key] = t
        if len(_consts) > _NAME_CACHE_SIZE:
            _consts.popitem(last=False)
    return t


def _rank_or_unknown() -> str:
    return str(basics.rank()) if basics.is_initialized() else "?"


def _check_dtype(tensor: tf.Tensor, op: str, name: str, allowed: frozenset) -> None:
    if tensor.dtype not in allowed:
        supported = ", ".join(sorted(d.name for d in allowed))
        raise TypeError(f"rank {_rank_or_unknown()}: bluefog {op} of tensor '{name}': dtype "
                        f"{tensor.dtype.name} is not supported; supported dtypes: {supported}")


def _device_scope(device: str):
    return tf.device(device) if device else contextlib.nullcontext()


def _to_tensor(tensor, op: str, name: str) -> tf.Tensor:
    try:
        return tf.convert_to_tensor(tensor)
    except (TypeError, ValueError) as e:
        raise TypeError(f"rank {_rank_or_unknown()}: bluefog {op} of tensor '{name}': expected a "
                        f"tf.Tensor, tf.Variable or array-like, got {type(tensor).__name__}: {e}"
                        ) from None


def allreduce(tensor: Union[tf.Tensor, tf.Variable, tf.IndexedSlices], average: bool = True,
              name: Optional[str] = None, device: str = "",
              compression=Compression.none, op=None) -> Union[tf.Tensor, tf.IndexedSlices]:
    """Sum, or with ``average=True`` the mean, of ``tensor`` over all ranks.

    Every rank must call it with the same name (or in the same order when unnamed), dtype and
    shape. Integer averages truncate toward zero. A ``tf.IndexedSlices`` is reduced by gathering
    its values and indices from every rank; the result is an ``IndexedSlices`` representing the
    sum (or mean) of the dense tensors (for an integer mean, the rows of each index are added
    before the division, and each index appears once in the result). ``compression``
    (``bf.Compression.fp16``/``.bf16``) sends floats in 16 bits and returns the input's dtype;
    ranks must agree on it.
    ``op`` (``bf.Average``, ``bf.Sum``, ``bf.Min``, ``bf.Max``, ``bf.Product``), when given,
    decides the reduction instead of ``average``; ranks must agree on it. Floating-point min
    and max return NaN where any rank has NaN.
    """
    name = _request_name("allreduce", name)
    if not isinstance(average, bool):
        raise TypeError(f"rank {_rank_or_unknown()}: bluefog allreduce of tensor '{name}': "
                        f"average must be a bool, got {average!r}")
    reduce_op = "sum"
    if op is not None or compression is not Compression.none:
        what = f"rank {_rank_or_unknown()}: bluefog allreduce of tensor '{name}'"
        average, reduce_op = _reduce_op(op, average, what)
        if compression is not Compression.none:
            compression = compression_check(compression, what)
    if isinstance(tensor, tf.IndexedSlices):
        if reduce_op != "sum":
            raise ValueError(f"rank {_rank_or_unknown()}: bluefog allreduce of tensor "
                             f"'{name}': op {reduce_op} is not defined for tf.IndexedSlices; "
                             "convert it to a dense tensor first (tf.convert_to_tensor)")
        return _allreduce_indexed_slices(tensor, average, name, device, compression)
    if not isinstance(tensor, tf.Tensor):
        tensor = _to_tensor(tensor, "allreduce", name)
    _check_dtype(tensor, "allreduce", name, NUMERIC_DTYPES)
    if compression is Compression.none and not device and op is None:  # the common path, lean
        return _ops.bluefog_allreduce(tensor, tensor_name=_name_input(name), average=average)
    sent, context = compression.compress(tensor)
    with _device_scope(device):
        out = _ops.bluefog_allreduce(sent, tensor_name=_name_input(name), average=average,
                                     reduce_op=reduce_op)
    return compression.decompress(out, context)


def grouped_allreduce(tensors, average: bool = True, name: Optional[str] = None,
                      device: str = "", compression=Compression.none, op=None) -> list:
    """Allreduce of every tensor in ``tensors``, as few TF ops and collectives as possible.

    Equivalent to ``[allreduce(t, average, compression=...) for t in tensors]`` but dense
    tensors of one dtype (after compression) go through a single op, so the runtime receives
    them together and fuses them. Every rank must pass the same number of tensors with the same
    shapes and dtypes in the same order. ``IndexedSlices`` and ``None`` entries are handled one
    by one (``None`` stays ``None``). ``op`` as for ``allreduce``.
    """
    name = _request_name("grouped_allreduce", name)
    if not isinstance(average, bool):
        raise TypeError(f"rank {_rank_or_unknown()}: bluefog grouped_allreduce '{name}': "
                        f"average must be a bool, got {average!r}")
    what = f"rank {_rank_or_unknown()}: bluefog grouped_allreduce '{name}'"
    average, reduce_op = _reduce_op(op, average, what)
    if compression is not Compression.none:
        compression = compression_check(compression, what)
    if not isinstance(tensors, (list, tuple)):
        raise TypeError(f"rank {_rank_or_unknown()}: bluefog grouped_allreduce '{name}': tensors "
                        f"must be a list or tuple of tensors, got {type(tensors).__name__}")
    results: list = [None] * len(tensors)
    contexts: list = [None] * len(tensors)
    by_dtype: dict = {}
    for i, t in enumerate(tensors):
        if t is None:
            continue
        if isinstance(t, tf.IndexedSlices):
            if reduce_op != "sum":
                raise ValueError(f"{what}: op {reduce_op} is not defined for tf.IndexedSlices "
                                 f"(tensor {i}); convert it to a dense tensor first")
            results[i] = _allreduce_indexed_slices(t, average, f"{name}.sparse.{i}", device,
                                                   compression)
            continue
        t = _to_tensor(t, "grouped_allreduce", f"{name}.{i}")
        _check_dtype(t, "grouped_allreduce", f"{name}.{i}", NUMERIC_DTYPES)
        # Grouped and named by the dtype before compression: ranks that disagree on compression
        # then meet under one name and get a dtype error, instead of waiting for each other.
        dtype = t.dtype
        if compression is not Compression.none:
            t, contexts[i] = compression.compress(t)
        by_dtype.setdefault(dtype, []).append((i, t))
    with _device_scope(device):
        for dtype, items in sorted(by_dtype.items(), key=lambda kv: kv[0].name):
            outs = _ops.bluefog_grouped_allreduce([t for _, t in items], average=average,
                                                  tensor_name=_name_input(f"{name}.{dtype.name}"),
                                                  reduce_op=reduce_op)
            for (i, _), out in zip(items, outs):
                results[i] = out
    if compression is not Compression.none:
        for i, _ in (item for items in by_dtype.values() for item in items):
            results[i] = compression.decompress(results[i], contexts[i])
    return results


def _allreduce_indexed_slices(slices: tf.IndexedSlices, average: bool, name: str,
                              device: str, compression=Compression.none) -> tf.IndexedSlices:
    sent, context = compression.compress(slices.values)
    with _device_scope(device):
        values = compression.decompress(allgather(sent, name=name + ".values"), context)
        indices = allgather(slices.indices, name=name + ".indices")
    if average:
        if not values.dtype.is_floating:
            # Integer division truncates, so dividing each gathered row before the rows of one
            # index are added (as converting to dense does) is wrong: 5/2 + 5/2 = 4, not 5.
            # Add the rows of each index first; the result then has each index once.
            indices, position = tf.unique(indices)
            values = tf.math.unsorted_segment_sum(values, position, tf.shape(indices)[0])
        values = _divide(values, basics.size())
    return tf.IndexedSlices(values, indices, dense_shape=slices.dense_shape)


def _divide(tensor: tf.Tensor, n: int) -> tf.Tensor:
    if tensor.dtype.is_floating:
        return tensor / tf.cast(n, tensor.dtype)
    return tf.truncatediv(tensor, tf.cast(n, tensor.dtype))


def allgather(tensor: Union[tf.Tensor, tf.Variable], name: Optional[str] = None) -> tf.Tensor:
    """Concatenation along dimension 0 of ``tensor`` from every rank, in rank order.

    Ranks may pass different sizes of dimension 0; rank and the other dimensions must match.
    """
    name = _request_name("allgather", name)
    tensor = _to_tensor(tensor, "allgather", name)
    _check_dtype(tensor, "allgather", name, ALL_DTYPES)
    if tensor.shape.rank == 0:
        raise ValueError(f"rank {_rank_or_unknown()}: bluefog allgather of tensor '{name}': "
                         "allgather concatenates along dimension 0 and needs a tensor of rank "
                         ">= 1; reshape the scalar to [1] first")
    return _ops.bluefog_allgather(tensor, tensor_name=_name_input(name))


def broadcast(tensor: Union[tf.Tensor, tf.Variable], root_rank: int,
              name: Optional[str] = None) -> tf.Tensor:
    """The value of ``tensor`` on ``root_rank``, returned on every rank.

    Every rank must pass the same name, ``root_rank``, dtype and shape.
    """
    name = _request_name("broadcast", name)
    tensor = _to_tensor(tensor, "broadcast", name)
    _check_dtype(tensor, "broadcast", name, ALL_DTYPES)
    if isinstance(root_rank, bool) or not isinstance(root_rank, int):
        raise TypeError(f"rank {_rank_or_unknown()}: bluefog broadcast of tensor '{name}': "
                        f"root_rank must be an int, got {root_rank!r}")
    if basics.is_initialized() and not 0 <= root_rank < basics.size():
        raise ValueError(f"rank {basics.rank()}: bluefog broadcast of tensor '{name}': root_rank "
                         f"{root_rank} is outside [0, {basics.size()})")
    return _ops.bluefog_broadcast(tensor, tensor_name=_name_input(name), root_rank=root_rank)


def _forward_name(op, index: int = -1) -> Optional[str]:
    """The backward request's name: the forward request's (op input `index`) + ".grad"."""
    value = tf.get_static_value(op.inputs[index])
    if value is None:
        return None
    if hasattr(value, "item"):  # a numpy scalar or 0-d array
        value = value.item()
    return (value.decode() if isinstance(value, bytes) else str(value)) + ".grad"



def _reduce_op_attr(op) -> str:
    value = op.get_attr("reduce_op")
    return value.decode() if isinstance(value, bytes) else value


def _extremum_or_product_grad(x, y, grad, reduce_op: str, base: Optional[str]):
    """d(sum over ranks of loss_r)/dx for y = min/max/product over ranks of x.

    min, max: the summed upstream gradient goes to the ranks whose x equals the result, split
    evenly between ties. product: it is multiplied by the product of the other ranks' x,
    computed from every rank's x (so zeros are handled exactly).
    """
    def sub(suffix):
        return None if base is None else base + suffix

    summed = allreduce(grad, average=False, name=sub(""))
    if reduce_op in (Min, Max):
        hit = tf.cast(tf.equal(x, y), grad.dtype)
        ties = allreduce(hit, average=False, name=sub(".ties"))
        return summed * hit / tf.maximum(ties, tf.ones_like(ties))
    everyone = allgather(tf.expand_dims(x, 0), name=sub(".inputs"))  # [size, ...]
    before = tf.math.cumprod(everyone, axis=0, exclusive=True)
    after = tf.math.cumprod(everyone, axis=0, exclusive=True, reverse=True)
    others = (before * after)[basics.rank()]
    return summed * tf.cast(others, grad.dtype)


@tf.RegisterGradient("BluefogAllreduce")
def _allreduce_grad(op, grad):
    """The gradient of a sum over ranks is the sum of the upstream gradients over ranks."""
    reduce_op = _reduce_op_attr(op)
    if reduce_op == "sum":
        return [allreduce(grad, average=op.get_attr("average"), name=_forward_name(op)), None]
    return [_extremum_or_product_grad(op.inputs[0], op.outputs[0], grad, reduce_op,
                                      _forward_name(op)), None]


@tf.RegisterGradient("BluefogGroupedAllreduce")
def _grouped_allreduce_grad(op, *grads):
    base = _forward_name(op)
    reduce_op = _reduce_op_attr(op)
    if reduce_op == "sum":
        reduced = grouped_allreduce(list(grads), average=op.get_attr("average"), name=base)
        return reduced + [None]
    return [None if g is None else
            _extremum_or_product_grad(op.inputs[i], op.outputs[i], tf.convert_to_tensor(g),
                                      reduce_op, None if base is None else f"{base}.{i}")
            for i, g in enumerate(grads)] + [None]


@tf.RegisterGradient("BluefogAllgather")
def _allgather_grad(op, grad):
    """Each rank's input receives its own slice of the upstream gradient summed over ranks."""
    base = _forward_name(op)
    summed = allreduce(grad, average=False, name=base)
    first_dims = allgather(tf.shape(op.inputs[0], out_type=tf.int64)[:1],
                           name=None if base is None else base + ".dims")
    me = basics.rank()
    start = tf.reduce_sum(first_dims[:me])
    return [summed[start:start + first_dims[me]], None]


@tf.RegisterGradient("BluefogBroadcast")
def _broadcast_grad(op, grad):
    """Only the root's input influences the result: it receives the summed gradient."""
    summed = allreduce(grad, average=False, name=_forward_name(op))
    if basics.rank() == op.get_attr("root_rank"):
        return [summed, None]
    # The zeros must wait for the allreduce, or graphs would prune it on non-root ranks and the
    # root would wait forever.
    with tf.control_dependencies([summed]):
        return [tf.zeros_like(summed), None]
