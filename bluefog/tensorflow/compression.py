"""Gradient compression for the allreduces: fewer bytes on the wire, the input's dtype back.

Two kinds of compressor.

Casts: ``bf.Compression.fp16`` and ``bf.Compression.bf16`` halve the bytes that a float32
allreduce moves (a quarter for float64). The tensor is cast to the 16-bit type before the
collective, the collective sums (and averages) in that type, and the result is cast back to the
input's dtype. Pick by range: float16 keeps 11 significant bits but only spans about 6e-8 to
65504, so tiny gradients round to zero and a sum over ranks above 65504 becomes inf; bfloat16
keeps float32's range with 8 significant bits.

Compressors with error feedback (``ReducingCompressor``): they replace the allreduce with
collectives of their own and keep, per request name and tensor, a residual (what was not sent),
added to the same tensor at the next call, so that nothing is lost over steps, only delayed.

- ``bf.Compression.int8`` / ``.int4``: per-block quantization (one float32 scale per 256
  values), reduced by an alltoall of the codes, a sum per chunk on its owner rank and an
  allgather: about 1/4 (int8) or 1/8 (int4) of a float32 allreduce's bytes at any rank count.
  Every element keeps an error below half a block's largest magnitude / 127 (/ 7).
  ``bf.Compression.int8(block=128, stochastic=True)`` picks other settings.
- ``bf.Compression.topk(ratio)``: each rank sends the ``ratio`` of each tensor's values with the
  largest magnitudes, as value and index pairs, through one allgather: fewer bytes than a
  float32 allreduce only while ``ratio < 1 / size``; meant for ratios of 0.01 and below.
- ``bf.Compression.powersgd(rank=r)``: a rank-r approximation of each matrix (tensors of 2+
  dimensions, viewed as first dimension by the rest) from two small allreduces; vectors are sent
  uncompressed. The fewest bytes for large layers; the approximation needs error feedback and
  some steps to warm up, and costs two matrix products and a QR per matrix per step.

These four compress float tensors only: integer tensors and ``tf.IndexedSlices`` are reduced
uncompressed (as with ``bf.Compression.none``); float16/float64/bfloat16 tensors are reduced in
float32 and cast back. A NaN or infinity in a tensor is an error naming it. Every rank must pass
the same compression (checked on the first call of each request name: a different one is an
error on every rank). ``bf.compression_stats()`` counts the bytes each setting sent. Error
feedback needs tensors of known shape and request names that repeat from step to step: the tape
and the optimizers name their requests so; an unnamed eager ``bf.allreduce`` runs without
residual. With one rank, ``DistributedGradientTape`` and ``DistributedOptimizer`` send nothing,
so they compress nothing.

When to use which: compression pays where the network, not the CPU, limits the step. On one
machine the quantization (about 3 GB/s per core for int8) can cost more than the smaller copy
saves (see docs/performance.md). int8 is the safe first choice (close to the uncompressed
training curve); int4 and topk trade accuracy per step for bytes; powersgd suits large dense
layers.

A compressor is any class (or instance) with ``compress(tensor) -> (tensor, context)`` and
``decompress(tensor, context) -> tensor``; or a ``ReducingCompressor``.
"""

from __future__ import annotations

import abc
from typing import Any, Tuple

import tensorflow as tf

from bluefog.tensorflow.feedback import ReducingCompressor
from bluefog.tensorflow.powersgd import PowerSGDCompressor
from bluefog.tensorflow.quantized import QuantizingCompressor
from bluefog.tensorflow.topk import TopKCompressor

__all__ = ["Compression", "Compressor", "NoneCompressor", "FP16Compressor", "BF16Compressor",
           "QuantizingCompressor", "TopKCompressor", "PowerSGDCompressor",
           "ReducingCompressor"]


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
    """The built-in compressors: ``none`` (the default), ``fp16`` and ``bf16`` (casts);
    ``int8``, ``int4``, ``topk(ratio)`` and ``powersgd(rank=r)`` (with error feedback; see the
    module doc). ``int8`` and ``int4`` are instances with the default settings; calling one
    (``int8(block=128, stochastic=True)``) gives another. Each instance keeps its own residuals:
    use one instance per model."""

    none = NoneCompressor
    fp16 = FP16Compressor
    bf16 = BF16Compressor
    int8 = QuantizingCompressor(8)
    int4 = QuantizingCompressor(4)

    @staticmethod
    def topk(ratio: float = 0.01) -> TopKCompressor:
        """Top-k by magnitude, ``ratio`` of each tensor's values per call, with error feedback."""
        return TopKCompressor(ratio)

    @staticmethod
    def powersgd(rank: int = 1) -> PowerSGDCompressor:
        """Rank-``rank`` PowerSGD of each matrix, with error feedback and warm start."""
        return PowerSGDCompressor(rank)


def check(compression, what: str):
    """``compression`` if it can compress and decompress; a TypeError naming `what` otherwise."""
    if compression is None:
        return NoneCompressor
    if callable(getattr(compression, "compress", None)) and \
            callable(getattr(compression, "decompress", None)):
        return compression
    if compression in (Compression.topk, Compression.powersgd):
        raise TypeError(f"{what}: call {compression.__name__} to make a compressor, e.g. "
                        f"bf.Compression.topk(0.01) or bf.Compression.powersgd(rank=4)")
    raise TypeError(f"{what}: compression must be bf.Compression.none, .fp16, .bf16, .int8, "
                    f".int4, .topk(ratio) or .powersgd(rank=r) (or an object with "
                    f"compress/decompress), got {compression!r}")
