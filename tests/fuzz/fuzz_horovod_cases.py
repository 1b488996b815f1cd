"""Fuzz cases for Horovod's collectives beyond the seed (alltoall, reducescatter, scale
factors, process sets): misuse that must fail clearly on every rank, and valid calls whose
result is known in closed form. Drawn by fuzz_cases.make_case."""

from __future__ import annotations

import numpy as np
import tensorflow as tf

HOROVOD_KINDS = ("horovod_ops_bad", "alltoall_valid", "reducescatter_valid")


def make_horovod_case(kind: str, rng, tag, base_seed: int):
    from fuzz_cases import Case, small  # fuzz_cases imports this module

    if kind == "horovod_ops_bad":
        variant = int(rng.integers(8))

        def run(rank, size):
            import bluefog.tensorflow as bf
            x = small([size + 1, 2], tf.float32, base_seed + rank)
            if variant == 0:  # splits that do not add up to the rows
                return bf.alltoall(x, splits=[size + 2] + [0] * (size - 1), name=tag)
            if variant == 1:  # one split per rank, not more
                return bf.alltoall(x, splits=[0] * (size + 1), name=tag)
            if variant == 2:
                return bf.alltoall(small([], tf.float32, base_seed), name=tag)
            if variant == 3:
                return bf.reducescatter(small([], tf.float32, base_seed), name=tag)
            if variant == 4:
                return bf.reducescatter(tf.constant([True]), name=tag)
            if variant == 5:
                return bf.reducescatter(x, op=bf.Max, name=tag)
            if variant == 6:  # a negative split
                return bf.alltoall(x, splits=[-1, size + 2] + [0] * (size - 2), name=tag)
            return bf.allreduce(x, name=tag, process_set=bf.ProcessSet([0]))  # not registered
        return Case(kind, run, "error", f"Horovod-API misuse variant {variant}")

    if kind == "alltoall_valid":
        # Rank r sends (r + j) % 2 rows to rank j; row k of rank r holds 10 r + k.
        def run(rank, size):
            import bluefog.tensorflow as bf
            splits = [(rank + j) % 2 for j in range(size)]
            rows = np.arange(sum(splits), dtype=np.float32)[:, None] + 10 * rank
            return bf.alltoall(rows, splits=splits, name=tag)[0]

        def expect(rank, size):
            out = []
            for j in range(size):
                theirs = [(j + k) % 2 for k in range(size)]
                start = sum(theirs[:rank])
                out += [10 * j + start + k for k in range(theirs[rank])]
            return np.array(out, np.float32).reshape([-1, 1])
        return Case(kind, run, expect, "alltoall with uneven splits")

    if kind == "reducescatter_valid":
        rows_extra = int(rng.integers(3))

        def run(rank, size):
            import bluefog.tensorflow as bf
            return bf.reducescatter(np.full([size + rows_extra, 2], rank + 1.0, np.float64),
                                    op=bf.Sum, name=tag)

        def expect(rank, size):
            rows = size + rows_extra
            mine = rows // size + (1 if rank < rows % size else 0)
            return np.full([mine, 2], size * (size + 1) / 2)
        return Case(kind, run, expect, f"reducescatter of {rows_extra} extra rows")
    raise ValueError(f"not a Horovod fuzz kind: {kind}")
