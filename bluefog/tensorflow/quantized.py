"""``bf.Compression.int8`` and ``.int4``: allreduce of per-block quantized floats.

How one call reduces (n ranks; the tensors of a grouped call are concatenated first):

1. x = tensor + residual, padded to n chunks of whole blocks; quantize (C++,
   csrc/compress/): 8- or 4-bit codes and one float32 scale per block. The residual becomes
   x - dequantized(x).
2. alltoall: chunk j's codes and scales go to rank j (one uint8 row per chunk).
3. Rank j dequantizes and sums the n copies of its chunk (C++), divides by n for a mean, adds
   its own residual for the chunk, and quantizes that again (keeping the new error).
4. allgather of the n quantized chunks; every rank dequantizes the same bytes, so all ranks
   return identical values.

Each rank sends 2 (n-1) chunks of codes and scales: about a quarter (int8) or an eighth (int4)
of a float32 ring allreduce's bytes, at every rank count.
"""

from __future__ import annotations

import tensorflow as tf

from bluefog.tensorflow.feedback import ReducingCompressor, ring_bytes
from bluefog.tensorflow.op_library import name_input, ops

__all__ = ["QuantizingCompressor"]


class QuantizingCompressor(ReducingCompressor):
    """Per-block ``bits``-bit quantization (8 or 4) with error feedback; see the module doc.

    ``block``: values per float32 scale (even for 4 bits); ``stochastic``: round up or down at
    random in proportion (unbiased; slower) instead of to the nearest code. Calling an instance
    returns a new one with other settings: ``bf.Compression.int8(block=128)``.
    """

    _checks_finite = True  # BluefogDequantizeOutputs refuses NaN scales

    def __init__(self, bits: int = 8, block: int = 256, stochastic: bool = False):
        super().__init__()
        if bits not in (8, 4):
            raise ValueError(f"bluefog compression: bits must be 8 or 4, got {bits!r}")
        if isinstance(block, bool) or not isinstance(block, int) or block < 2 or \
                (bits == 4 and block % 2):
            raise ValueError(f"bluefog compression: block must be an int >= 2 (even for 4 bits), "
                             f"got {block!r}")
        if not isinstance(stochastic, bool):
            raise TypeError(f"bluefog compression: stochastic must be a bool, got {stochastic!r}")
        self.bits, self.block, self.stochastic = bits, block, stochastic

    def __call__(self, block: int = 256, stochastic: bool = False) -> QuantizingCompressor:
        return QuantizingCompressor(self.bits, block, stochastic)

    def describe(self) -> str:
        extra = ",stochastic" if self.stochastic else ""
        return f"int{self.bits}(block={self.block}{extra})"

    def _attrs(self, what):
        # A NaN or infinity on one rank must fail every rank, not leave the others waiting
        # in the alltoall: its block travels with a NaN scale, and dequantizing it fails.
        return {"bits": self.bits, "block": self.block, "stochastic": self.stochastic,
                "nonfinite_to_nan": True, "what": what}

    def _split(self, rows, n, code_bytes, scale_count):
        """Codes [n, code_bytes] and scales [n, scale_count] of uint8 rows [n, row bytes]."""
        codes = rows[:, :code_bytes]
        scales = tf.reshape(tf.bitcast(tf.reshape(rows[:, code_bytes:], [n, scale_count, 4]),
                                       tf.float32), [n, scale_count])
        return codes, scales

    def _reduce(self, tensors, average, name, n, set_attrs, what):
        updates = []
        residuals = [self._variable(f"{name}.{i}", t.shape) for i, t in enumerate(tensors)]
        if any(r is None for r in residuals):  # unnamed eager calls: no residual
            residuals = []
        total = sum(t.shape.num_elements() for t in tensors)
        blocks = -(-total // self.block)
        chunk = max(1, -(-blocks // n)) * self.block  # values per rank's chunk: whole blocks
        code_bytes = chunk if self.bits == 8 else chunk // 2
        scale_count = chunk // self.block
        # Inputs plus residuals, concatenated and padded to n chunks, quantized in pieces in
        # C++ (no concatenated copy); the errors come back per tensor as the new residuals.
        codes, scales, errors = ops.bluefog_quantize_inputs(
            tensors, [r.read_value() for r in residuals], count=n * chunk, **self._attrs(what))
        updates += [r.assign(e) for r, e in zip(residuals, errors)]
        rows = tf.concat([tf.reshape(codes, [n, code_bytes]),
                          tf.reshape(tf.bitcast(tf.reshape(scales, [n, scale_count]), tf.uint8),
                                     [n, 4 * scale_count])], 1)
        received, _ = ops.bluefog_alltoall(rows, tensor_name=name_input(f"{name}.scatter"),
                                           splits=tf.zeros([0], tf.int64), **set_attrs)
        mine = ops.bluefog_dequantize_sum(
            *self._split(tf.reshape(received, [n, code_bytes + 4 * scale_count]), n, code_bytes,
                         scale_count),
            bits=self.bits, block=self.block, factor=1.0 / n if average else 1.0, what=what)
        owner = self._variable(f"{name}.owner", [chunk])
        owners = [] if owner is None else [owner.read_value()]
        codes2, scales2, error2 = ops.bluefog_quantize_inputs([mine], owners, count=chunk,
                                                              **self._attrs(what))
        if owner is not None:
            updates.append(owner.assign(error2[0]))
        row = tf.concat([codes2, tf.reshape(tf.bitcast(scales2, tf.uint8), [-1])], 0)
        gathered = ops.bluefog_allgather(row[None], tensor_name=name_input(f"{name}.gather"),
                                         **set_attrs)
        all_codes, all_scales = self._split(
            tf.reshape(gathered, [n, code_bytes + 4 * scale_count]), n, code_bytes, scale_count)
        # Fails alike on every rank when some rank's input held a NaN or an infinity.
        outs = ops.bluefog_dequantize_outputs(
            tf.reshape(all_codes, [-1]), tf.reshape(all_scales, [-1]),
            N=len(tensors), shapes=[t.shape for t in tensors], bits=self.bits,
            block=self.block, what=what)
        updates += self._count(2 * (n - 1) * (code_bytes + 4 * scale_count),
                               ring_bytes(total, n))
        return list(outs), updates
