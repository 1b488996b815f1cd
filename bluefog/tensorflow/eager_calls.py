"""Eager allreduces without TensorFlow's op dispatch.

An eager ``bf.allreduce`` of a CPU tensor with every argument but ``name`` and ``average`` (or
``op`` as ``bf.Sum`` or ``bf.Average``) at its default, checked by ``mpi_ops.allreduce`` (its
lean path for a name seen before, its full path otherwise), runs the same request in one call
into C++ instead of the ``BluefogAllreduce`` kernel: ``_eager.allreduce``
(``csrc/tensorflow/eager_calls.cc``, a CPython extension module beside the core) reads the input
where it lies (``EagerTensor._numpy()`` shares it), takes the output memory itself (an output
block of the core from 1 MiB, the shared heap's when it has room, so that peers push their parts
straight into it), runs the request with the GIL released and returns an object that lends that
memory and gives it back when the last array over it is gone. The result is an eager tensor over
that memory. TensorFlow's dispatch of one op cost 12-66 us on the development VM, as much as the
collective of 1 MiB in some launches (docs/design.md, "Eager calls run their own rounds";
docs/benchmarks.md).

Everything else the op does happens in C++ as before: the same request, the same rounds (run by
the calling thread when nothing else is pending), the same errors, raised by the extension as
the same ``tf.errors`` classes. A call that a gradient tape may record, or on another device,
takes the op, so that gradients and placement are TensorFlow's; so does every call when
``BLUEFOG_EAGER_C_API=0``.
"""

from __future__ import annotations

from typing import Optional

import numpy as np
import tensorflow as tf

from bluefog.common import extension
from bluefog.tensorflow import op_rules

try:  # private modules: without them every call takes the op
    from tensorflow.python.eager import record as _record
    from tensorflow.python.framework.ops import EagerTensor as _EagerTensor
except ImportError:  # pragma: no cover - every TensorFlow 2.16-2.21 has them
    _record = _EagerTensor = None
EagerTensor = _EagerTensor


_eager = extension.load_eager_extension()

# TensorFlow's DataType enum value -> the core's (op_rules.CORE_DTYPES is in the core's order).
_CORE_DTYPE = {dtype.as_datatype_enum: value for value, dtype in enumerate(op_rules.CORE_DTYPES)}

# BLUEFOG_EAGER_C_API as the running core read it at init, asked once (None until bf.init()).
_on: Optional[bool] = None if _record is not None else False


def allreduce(tensor, name: str, average: bool) -> Optional[tf.Tensor]:
    """The allreduce of ``tensor`` (an eager tensor of a dtype allreduce accepts, passed while
    executing eagerly: both checked by the caller) under ``name``, or None when the call must
    take the op instead."""
    global _on
    if not _on:
        if _on is None:
            _on = _eager.enabled()
        if not _on:
            return None
    if _record.could_possibly_record():
        return None
    device = tensor.device
    if not (device.endswith("CPU:0") and device.startswith("/job:localhost/")):
        return None  # another device, or another task's: the op places it
    data = tensor._numpy()
    if type(data) is not np.ndarray:  # a scalar tensor gives a numpy scalar: hold an array,
        data = np.asarray(data)  # whose memory stays valid until the call returns
    if not data.size:
        return None
    enum = tensor._datatype_enum()
    out = _eager.allreduce(name, _CORE_DTYPE[enum], data, average)
    return _EagerTensor(np.frombuffer(out, data.dtype).reshape(data.shape), device, enum)


def calls() -> int:
    """How many allreduces this process ran here (for tests)."""
    return _eager.calls()
