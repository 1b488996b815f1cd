"""Gradient compression for the allreduces: send floats in 16 bits, get them back in full width.

``bf.Compression.fp16`` and ``bf.Compression.bf16`` halve the bytes that a float32 allreduce
moves (a quarter for float64). The tensor is cast to the 16-bit type before the collective, the
collective sums (and averages) in that type, and the result is cast back to the input's dtype.
Integer tensors and tensors already 16 bits wide are sent as they are. With one rank,
``DistributedGradientTape`` and ``DistributedOptimizer`` send nothing, so they compress nothing.

Pick by range: float16 keeps 11 significant bits but only spans about 6e-8 to 65504, so tiny
gradients round to zero and a sum over ranks above 65504 becomes inf; bfloat16 keeps float32's
range with 8 significant bits. Use it where the network, not the CPU, limits the step: on one
machine the two casts can cost more than the halved copy saves (see docs/benchmarks.md).

A compressor is any class (or instance) with ``compress(tensor) -> (tensor, context)`` and
``decompress(tensor, context) -> tensor``.
"""

from __future__ import annotations

import abc
from typing import Any, Tuple

import tensorflow as tf

__all__ = ["Compression", "Compressor", "NoneCompressor", "FP16Compressor", "BF16Compressor"]


class Compressor(abc.ABC):
    """The interface: what goes over the wire, and how to undo it."""

    @staticmethod
    @abc.abstractmethod
    def compress(tensor: tf.Tensor) -> Tuple[tf.Tensor, Any]:
        """The tensor to send, and what decompress needs to undo the change."""

    @staticmethod
    @abc.abstractmethod
    def decompress(tensor: tf.Tensor, context: Any) -> tf.Tensor:
        """The received tensor in the form compress was given."""


class NoneCompressor(Compressor):
    """Sends the tensor unchanged."""

    @staticmethod
    def compress(tensor):
        return tensor, None

    @staticmethod
    def decompress(tensor, context):
        return tensor


class _CastCompressor(Compressor):
    """Casts floats wider than ``wire_dtype`` to it, and back afterwards."""

    wire_dtype = tf.float16

    @classmethod
    def compress(cls, tensor):
        dtype = tensor.dtype
        if dtype.is_floating and dtype.size > cls.wire_dtype.size:
            return tf.cast(tensor, cls.wire_dtype), dtype
        return tensor, None

    @staticmethod
    def decompress(tensor, context):
        return tensor if context is None else tf.cast(tensor, context)


class FP16Compressor(_CastCompressor):
    """float32/float64 travel as float16 (11 significant bits, range about 6e-8 to 65504)."""

    wire_dtype = tf.float16


class BF16Compressor(_CastCompressor):
    """float32/float64 travel as bfloat16 (8 significant bits, float32's range)."""

    wire_dtype = tf.bfloat16


class Compression:
    """The built-in compressors: ``none`` (the default), ``fp16`` and ``bf16``."""

    none = NoneCompressor
    fp16 = FP16Compressor
    bf16 = BF16Compressor


def check(compression, what: str):
    """``compression`` if it can compress and decompress; a TypeError naming `what` otherwise."""
    if compression is None:
        return NoneCompressor
    if callable(getattr(compression, "compress", None)) and \
            callable(getattr(compression, "decompress", None)):
        return compression
    raise TypeError(f"{what}: compression must be bf.Compression.none, .fp16 or .bf16 (or an "
                    f"object with compress/decompress), got {compression!r}")
