"""Eager allreduces without TensorFlow's op dispatch.

An eager ``bf.allreduce`` of a CPU tensor with every argument but ``name`` and ``average`` at
its default (the lean path, ``op_library.eager_name``, for a name seen before; the full path's
checks first for a new name or an unnamed call) runs the same request through the C API instead
of the ``BluefogAllreduce`` kernel: the input's memory is read where it is
(``EagerTensor._numpy()`` shares it), the output is an output block of the core
(``bluefog_take_output``: the shared heap's when it has room, so that peers push their parts
straight into it) or, below 1 MiB, a new array, and the result is an eager tensor over that
memory. TensorFlow's dispatch of one op cost 12-66 us on the development VM, as much as the
collective of 1 MiB in some launches; this costs about 7 us (docs/design.md, "Eager calls run
their own rounds"; docs/benchmarks.md).

Everything else the op does happens in C++ as before: the same request, the same rounds (run by
the calling thread when nothing else is pending), the same errors, raised as the same
``tf.errors`` classes. A call that a gradient tape may record, or on another device, takes the
op, so that gradients and placement are TensorFlow's.
"""

from __future__ import annotations

import ctypes
from typing import Optional

import numpy as np
import tensorflow as tf

from bluefog.common import basics
from bluefog.tensorflow import op_rules

try:  # private modules: without them every call takes the op
    from tensorflow.python.eager import record as _record
    from tensorflow.python.framework.ops import EagerTensor as _EagerTensor
except ImportError:  # pragma: no cover - every TensorFlow 2.16-2.21 has them
    _record = _EagerTensor = None
EagerTensor = _EagerTensor

# Switched off by tests and benchmarks to time or check the op's own path (on every rank), and
# for good by the first call when BLUEFOG_EAGER_C_API=0.
DIRECT = {"on": _record is not None}

# TensorFlow's DataType enum value -> the core's (op_rules.CORE_DTYPES is in the core's order).
_CORE_DTYPE = {dtype.as_datatype_enum: value for value, dtype in enumerate(op_rules.CORE_DTYPES)}
_ERRORS = {1: tf.errors.InvalidArgumentError, 2: tf.errors.FailedPreconditionError,
           3: tf.errors.AbortedError, 4: tf.errors.InternalError}
_USE_THE_OP = 5  # bluefog_eager_allreduce without running anything (BLUEFOG_EAGER_C_API=0)
_POOLED_BYTES = 1 << 20  # core/output_blocks.h, kPooledOutputBytes
_ALIGN = 64  # TensorFlow shares (does not copy) a numpy array aligned to this many bytes
_MAX_CACHED = 256

_shapes: dict = {}
_block_types: dict = {}


def _give_back(block) -> None:
    lib = basics._lib
    if lib is not None:
        lib.bluefog_give_output(block.ptr)


def _block_type(nbytes: int):
    """A ctypes array type of ``nbytes`` bytes whose instances give their block back to the
    core when the last array over them is gone."""
    t = _block_types.get(nbytes)
    if t is None:
        t = type("OutputBlock", (ctypes.c_char * nbytes,),
                 {"__slots__": ("ptr",), "__del__": _give_back})
        if len(_block_types) < _MAX_CACHED:
            _block_types[nbytes] = t
    return t


def _shape_arg(shape: tuple):
    arg = _shapes.get(shape)
    if arg is None:
        arg = (ctypes.c_longlong * max(len(shape), 1))(*shape)
        if len(_shapes) < _MAX_CACHED:
            _shapes[shape] = arg
    return arg


def _address(array: np.ndarray) -> int:
    """The address of ``array``'s first byte (an ndarray, which owns or views that memory: a
    numpy scalar's ``__array_interface__`` describes a temporary copy): through the buffer
    protocol (a third of ``__array_interface__``'s cost) where the array offers a writable
    buffer; bfloat16 arrays offer none, read-only ones no writable one."""
    try:
        return ctypes.addressof(ctypes.c_char.from_buffer(array))
    except (TypeError, ValueError):
        return array.__array_interface__["data"][0]


def _output(lib, nbytes: int, np_dtype, shape: tuple):
    """(array, address) of a new output of ``nbytes`` bytes."""
    if nbytes >= _POOLED_BYTES:
        ptr = lib.bluefog_take_output(nbytes)
        if not ptr:
            raise tf.errors.ResourceExhaustedError(
                None, None, lib.bluefog_last_error().decode("utf-8", "replace"))
        block = _block_type(nbytes).from_address(ptr)
        block.ptr = ptr
        return np.frombuffer(block, np_dtype).reshape(shape), ptr
    raw = np.empty(nbytes + _ALIGN, np.uint8)
    base = ctypes.addressof(ctypes.c_char.from_buffer(raw))
    start = -base % _ALIGN
    return raw[start:start + nbytes].view(np_dtype).reshape(shape), base + start


def allreduce(tensor, name: str, average: bool) -> Optional[tf.Tensor]:
    """The allreduce of ``tensor`` (an eager tensor of a dtype allreduce accepts, passed while
    executing eagerly: both checked by the caller) under ``name``, or None when the call must
    take the op instead."""
    lib = basics._lib
    if lib is None or not DIRECT["on"] or _record.could_possibly_record():
        return None
    device = tensor.device
    if not (device.endswith("CPU:0") and device.startswith("/job:localhost/")):
        return None  # another device, or another task's: the op places it
    data = tensor._numpy()
    if type(data) is not np.ndarray:  # a scalar tensor gives a numpy scalar: hold an array,
        data = np.asarray(data)  # whose memory stays valid until the call returns
    nbytes = data.nbytes
    if nbytes == 0:
        return None
    shape = data.shape
    enum = tensor._datatype_enum()
    out, out_ptr = _output(lib, nbytes, data.dtype, shape)
    code = lib.bluefog_eager_allreduce(name.encode(), _CORE_DTYPE[enum], _shape_arg(shape),
                                       len(shape), _address(data), out_ptr, average)
    if code == _USE_THE_OP:  # BLUEFOG_EAGER_C_API=0: the op from now on
        DIRECT["on"] = False
        return None
    if code:
        message = lib.bluefog_last_error().decode("utf-8", "replace")
        raise _ERRORS.get(code, tf.errors.UnknownError)(None, None, message)
    return _EagerTensor(out, device, enum)


def calls() -> int:
    """How many allreduces this process ran here (for tests)."""
    return basics._load().bluefog_eager_allreduce_calls()
