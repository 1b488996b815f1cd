"""``bf.Compression.topk(ratio)``: each rank sends the largest-magnitude values of each tensor.

Per tensor, x = tensor + residual; the ``ceil(ratio * size)`` entries of largest magnitude are
sent as (value, index) pairs and zeroed in x, which becomes the residual (error feedback). One
allgather carries every rank's pairs of every tensor of the call; each rank adds them up into
dense tensors (the same sums on every rank). Each rank sends (n-1) times 8 bytes per kept value:
below a float32 ring allreduce's 8 (n-1)/n bytes per value only while ratio < 1/n, so it pays
at small ratios (0.01 and below) and few ranks.
"""

from __future__ import annotations

import math

import tensorflow as tf

from bluefog.tensorflow.feedback import ReducingCompressor, ring_bytes
from bluefog.tensorflow.op_library import name_input, ops

__all__ = ["TopKCompressor"]


class TopKCompressor(ReducingCompressor):
    """Top-k by magnitude with error feedback, ``ratio`` (0 < ratio <= 1) of each tensor's
    values per call (at least one); see the module doc."""

    def __init__(self, ratio: float = 0.01):
        super().__init__()
        if isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or \
                not 0 < ratio <= 1:
            raise ValueError(f"bluefog compression: topk's ratio must be in (0, 1], got "
                             f"{ratio!r}")
        self.ratio = float(ratio)

    def describe(self) -> str:
        return f"topk(ratio={self.ratio:g})"

    def _reduce(self, tensors, average, name, n, set_attrs, what):
        values, indices, sizes, updates = [], [], [], []
        offset = 0
        for i, t in enumerate(tensors):
            flat = tf.reshape(t, [-1])
            size = int(flat.shape[0])
            residual = self._variable(f"{name}.{i}", [size])
            x = flat if residual is None else flat + residual
            k = max(1, math.ceil(self.ratio * size))
            _, index = tf.math.top_k(tf.abs(x), k=k, sorted=False)
            kept = tf.gather(x, index)
            if residual is not None:
                updates.append(residual.assign(
                    tf.tensor_scatter_nd_update(x, index[:, None], tf.zeros([k], tf.float32))))
            values.append(kept)
            indices.append(index + offset)
            sizes.append(size)
            offset += size
        kept_count = sum(int(v.shape[0]) for v in values)
        # Values travel as their bits, beside the indices, in one int32 row per rank.
        row = tf.concat([tf.bitcast(tf.concat(values, 0), tf.int32), tf.concat(indices, 0)], 0)
        gathered = tf.reshape(
            ops.bluefog_allgather(row[None], tensor_name=name_input(f"{name}.gather"),
                                  **set_attrs), [n, 2 * kept_count])
        all_values = tf.bitcast(tf.reshape(gathered[:, :kept_count], [-1]), tf.float32)
        all_indices = tf.reshape(gathered[:, kept_count:], [-1])
        dense = tf.math.unsorted_segment_sum(all_values, all_indices, offset)
        if average:
            dense = dense / float(n)
        parts = tf.split(dense, sizes) if len(sizes) > 1 else [dense]
        updates += self._count((n - 1) * 8 * kept_count, ring_bytes(offset, n))
        return [tf.reshape(p, t.shape) for p, t in zip(parts, tensors)], updates
