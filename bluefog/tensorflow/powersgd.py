"""``bf.Compression.powersgd(rank=r)``: rank-r approximation of each gradient matrix.

A tensor of 2 or more dimensions is viewed as a matrix M (its first dimension by the rest);
with error feedback, M = tensor + residual. With Q the warm start (the previous call's, or the
same random matrix on every rank at first): P = M Q, allreduced (mean); P orthonormalized; Q =
M^T P, allreduced (mean); the result is P Q^T (times n for a sum), the same on every rank, and
the residual is M - P Q^T. Vectors, scalars and matrices too small to gain (r (a + b) >= a b)
are averaged uncompressed in the same allreduce as the P's. Each rank sends about
(a + b) r instead of a b values per matrix.
"""

from __future__ import annotations

import zlib

import tensorflow as tf

from bluefog.tensorflow.feedback import ReducingCompressor, ring_bytes
from bluefog.tensorflow.op_library import name_input, ops

__all__ = ["PowerSGDCompressor"]


def _mean(tensors, name, set_attrs):
    return ops.bluefog_grouped_allreduce(tensors, average=True, tensor_name=name_input(name),
                                         reduce_op="sum", prescale_factor=1.0,
                                         postscale_factor=1.0, **set_attrs)


class PowerSGDCompressor(ReducingCompressor):
    """Rank-``rank`` PowerSGD with error feedback and warm-started Q; see the module doc."""

    def __init__(self, rank: int = 1):
        super().__init__()
        if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
            raise ValueError(f"bluefog compression: powersgd's rank must be an int >= 1, got "
                             f"{rank!r}")
        self.rank = rank

    def describe(self) -> str:
        return f"powersgd(rank={self.rank})"

    def _reduce(self, tensors, average, name, n, set_attrs, what):
        r = self.rank
        matrices, plain, updates = [], [], []
        for i, t in enumerate(tensors):
            rows = int(t.shape[0]) if t.shape.rank >= 2 else 0
            cols = t.shape.num_elements() // rows if rows else 0
            if rows and r * (rows + cols) < rows * cols:
                matrices.append((i, rows, cols))
            else:
                plain.append(i)
        ms, qs, ps = {}, {}, []
        for i, rows, cols in matrices:
            m = tf.reshape(tensors[i], [rows, cols])
            residual = self._variable(f"{name}.{i}", [rows, cols])
            ms[i] = m if residual is None else m + residual
            seed = zlib.crc32(f"{name}.{i}".encode()) & 0x7fffffff
            # Every rank starts from the same Q: a seeded draw from the request name.
            qs[i] = self._variable(
                f"{name}.{i}.q", [cols, r], keep=False,
                initial=lambda c=cols, s=seed: tf.random.stateless_normal([c, r], [s, 0]))
            ps.append(tf.matmul(ms[i], qs[i]))
        sent = [tf.reshape(tensors[i], [-1]) for i in plain]
        reduced = _mean(ps + sent, f"{name}.p", set_attrs) if ps or sent else []
        outs = [None] * len(tensors)
        for j, i in enumerate(plain):
            out = reduced[len(ps) + j]
            outs[i] = tf.reshape(out if average else out * float(n), tensors[i].shape)
        if matrices:
            p_hat = [tf.linalg.qr(p)[0] for p in reduced[:len(ps)]]
            new_q = _mean([tf.matmul(ms[i], p, transpose_a=True)
                           for (i, _, _), p in zip(matrices, p_hat)], f"{name}.q", set_attrs)
            for (i, _, _), p, q in zip(matrices, p_hat, new_q):
                approx = tf.matmul(p, q, transpose_b=True)
                residual = self._variable(f"{name}.{i}", approx.shape)
                if residual is not None:
                    updates.append(residual.assign(ms[i] - approx))
                updates.append(qs[i].assign(q))
                outs[i] = tf.reshape(approx if average else approx * float(n), tensors[i].shape)
        low_rank = sum(r * (rows + cols) for _, rows, cols in matrices)
        plain_count = sum(tensors[i].shape.num_elements() for i in plain)
        total = sum(t.shape.num_elements() for t in tensors)
        updates += self._count(ring_bytes(low_rank + plain_count, n), ring_bytes(total, n))
        return outs, updates
