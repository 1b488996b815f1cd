"""What compressors that run their own collectives share: residuals (error feedback), the
check that every rank uses the same compressor, and the byte counts of ``bf.compression_stats``.

A ``ReducingCompressor`` (``bf.Compression.int8``, ``.int4``, ``.topk``, ``.powersgd``) is not a
cast around the allreduce: it replaces it. ``allreduce``, ``grouped_allreduce``, the tape and
the optimizers hand it the float tensors (cast to float32) and it returns their sum or mean.
Each keeps, per request name and tensor, the residual: what compression left out, added to the
same tensor at the next call. Residuals live in ``tf.Variable``s created on first use, so they
need tensors of fully defined shape and a stable request name (unnamed eager calls get a new
name each time, so they run without a residual).
"""

from __future__ import annotations

import abc
import threading
from typing import Dict, List, Optional

import numpy as np
import tensorflow as tf

from bluefog.tensorflow.op_library import name_input, ops, process_set_attrs, set_size

__all__ = ["ReducingCompressor", "compression_stats", "reset_compression_stats"]

_DESCRIPTOR_BYTES = 64
_lock = threading.Lock()
# describe() -> (bytes sent, bytes a float32 ring allreduce would have sent): int64 variables.
_stats: Dict[str, tuple] = {}


def compression_stats() -> Dict[str, dict]:
    """Bytes this rank's compressed allreduces put on the wire, per compressor setting.

    Returns ``{setting: {"sent_bytes": int, "uncompressed_bytes": int, "ratio": float}}``, the
    setting as ``describe()`` names it (``"int8(block=256)"``). ``uncompressed_bytes`` is what a
    float32 ring allreduce of the same tensors sends from one rank (``2 (n-1)/n`` times their
    bytes); ``ratio`` is sent over uncompressed (None before anything was sent, and with one
    rank, where nothing is). Counted since the start or ``bf.reset_compression_stats()``.
    """
    out = {}
    with _lock:
        items = list(_stats.items())
    for setting, (sent, raw) in items:
        s, r = int(sent.numpy()), int(raw.numpy())
        out[setting] = {"sent_bytes": s, "uncompressed_bytes": r,
                        "ratio": (s / r) if r else None}
    return out


def reset_compression_stats() -> None:
    """Sets every count of ``bf.compression_stats()`` back to zero."""
    with _lock:
        items = list(_stats.values())
    for sent, raw in items:
        sent.assign(0)
        raw.assign(0)


def ring_bytes(elements: int, n: int) -> int:
    """Bytes one rank sends in a float32 ring allreduce of ``elements`` values over n ranks."""
    return 2 * (n - 1) * 4 * elements // n


class ReducingCompressor(abc.ABC):
    """A compressor that reduces by collectives of its own, with error feedback.

    Subclasses give ``describe()`` (the setting, compared across ranks) and ``_reduce``.
    ``compress``/``decompress`` exist for the ``compression=`` interface only: ops that just
    cast around their collective (``reducescatter``, ``neighbor_allreduce``) refuse it.
    """

    def __init__(self):
        self._variables: Dict[str, tf.Variable] = {}
        self._agreed: set = set()  # check names agreed on in eager mode
        self._lock = threading.Lock()

    # Whether _reduce's outputs already fail on non-finite values (else reduce checks them).
    _checks_finite = False

    @abc.abstractmethod
    def describe(self) -> str:
        """The setting, e.g. ``"int8(block=256)"``: every rank's must be the same."""

    def __repr__(self) -> str:
        return f"bf.Compression.{self.describe()}"

    def compress(self, tensor):
        """Refused: this compressor runs its own collectives (see the class docstring)."""
        raise TypeError(f"{self!r} reduces through collectives of its own and works with "
                        "allreduce, grouped_allreduce, DistributedGradientTape and "
                        "DistributedOptimizer only; use bf.Compression.fp16 or .bf16 here")

    def decompress(self, tensor, context):
        """Refused, as ``compress``."""
        return self.compress(tensor)

    def residuals(self) -> Dict[str, np.ndarray]:
        """This rank's residuals (what error feedback carries to the next call), by key
        ``"<request name>.<tensor index>"`` (and the compressor's own state under other keys)."""
        with self._lock:
            return {k: v.numpy() for k, v in self._variables.items()
                    if not k.startswith("agreed:")}

    # Plain Python over static shapes (tf.cond where a branch is needed): autograph would only
    # spend seconds converting it inside the caller's tf.function.
    @tf.autograph.experimental.do_not_convert
    def reduce(self, tensors: List[tf.Tensor], average: bool, name: str, check_name: str,
               process_set=None, what: str = "") -> List[tf.Tensor]:
        """The sum (or mean) over ranks of each float tensor of ``tensors``, in its dtype.

        ``check_name``: the request name of the agreement check, the first collective this
        issues (``allreduce`` passes the name its uncompressed path would use, so a rank with
        another compression= meets it there and gets an error instead of a hang).
        """
        set_attrs = process_set_attrs(process_set, what) if process_set is not None else {}
        n = set_size(process_set)
        for t in tensors:
            if not t.shape.is_fully_defined():
                raise ValueError(f"{what}: {self!r} needs tensors of known shape, got "
                                 f"{t.shape} (error feedback keeps a residual of that shape)")
        agreed = self._agree(check_name, set_attrs, what)
        with tf.control_dependencies([agreed]):
            inputs = [tf.cast(t, tf.float32) if t.dtype != tf.float32 else tf.identity(t)
                      for t in tensors]
        outs, updates = self._reduce(inputs, average, name, n, set_attrs, what)
        # A NaN or infinity on any rank reaches every rank's result: all fail alike.
        message = (f"{what}: a NaN or an infinity in the input of some rank (compressed "
                   "allreduces need finite floats; look for a diverging loss)")
        # New ops under the dependencies (tf.cast to the same dtype makes none), so a v1 graph
        # that fetches the results also runs the residual updates.
        with tf.control_dependencies(updates):
            outs = [o if self._checks_finite else tf.debugging.check_numerics(o, message)
                    for o in outs]
            return [tf.cast(o, t.dtype) if t.dtype != tf.float32 else tf.identity(o)
                    for o, t in zip(outs, tensors)]

    @abc.abstractmethod
    def _reduce(self, tensors, average, name, n, set_attrs, what):
        """(outputs, update ops) for float32 tensors of known shape."""

    # Helpers for subclasses.

    def _variable(self, key: str, shape, initial=None, keep: bool = True) -> Optional[tf.Variable]:
        """The float32 variable ``key`` of ``shape`` (zeros, or ``initial()``), made on first use;
        None for names that never repeat (unnamed eager calls) unless ``keep`` is False."""
        if ".noname." in key and keep:
            return None
        shape = tf.TensorShape(shape)
        with self._lock:
            v = self._variables.get(key)
            if v is None:
                with tf.init_scope():
                    value = initial() if initial is not None else tf.zeros(shape, tf.float32)
                    v = tf.Variable(value, trainable=False, name="bf_compression_state")
                self._variables[key] = v
        if v.shape != shape:
            raise ValueError(f"{self!r}: request '{key}' was a tensor of shape {v.shape} and "
                             f"now is {shape}; give tensors of other shapes other names")
        return v

    def _count(self, sent: int, raw: int) -> List:
        """Ops adding to this setting's byte counts."""
        setting = self.describe()
        with _lock:
            pair = _stats.get(setting)
            if pair is None:
                with tf.init_scope():
                    pair = (tf.Variable(0, dtype=tf.int64, trainable=False),
                            tf.Variable(0, dtype=tf.int64, trainable=False))
                _stats[setting] = pair
        return [pair[0].assign_add(int(sent)), pair[1].assign_add(int(raw))]

    def _agree(self, check_name: str, set_attrs: dict, what: str):
        """Runs, on the first call under ``check_name``, an allgather of the setting, and
        raises on every rank when they differ. Returns an op (or tensor) to depend on."""
        if tf.executing_eagerly():
            if check_name not in self._agreed:
                self._check(check_name, set_attrs, what)
                if ".noname." not in check_name:
                    self._agreed.add(check_name)
            return tf.constant(True)
        flag = self._variable(f"agreed:{check_name}", [], keep=False)

        def check():
            done = self._check(check_name, set_attrs, what)
            with tf.control_dependencies([done]):
                return flag.assign(1.0).read_value() > 0

        return tf.cond(flag > 0, lambda: tf.constant(True), check)

    def _check(self, check_name: str, set_attrs: dict, what: str):
        mine = self.describe().encode()[:_DESCRIPTOR_BYTES].ljust(_DESCRIPTOR_BYTES, b"\0")
        gathered = ops.bluefog_allgather(tf.constant(np.frombuffer(mine, np.uint8)[None]),
                                         tensor_name=name_input(check_name), **set_attrs)

        def compare(rows):
            names = [bytes(r).rstrip(b"\0").decode(errors="replace") for r in rows]
            if len(set(names)) > 1:
                listed = ", ".join(f"rank {i} {s}" for i, s in enumerate(names))
                raise ValueError(f"{what}: ranks disagree on compression: {listed}. Pass the "
                                 "same compression= on every rank")
            return np.bool_(True)

        if tf.executing_eagerly():
            return compare(gathered.numpy())
        return tf.numpy_function(compare, [gathered], tf.bool, stateful=True)
