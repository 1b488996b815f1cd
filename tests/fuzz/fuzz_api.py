"""Seeded fuzzer of bluefog's public TensorFlow API with bad and odd input, run under mpirun.

    mpirun -np 3 .venv/bin/python tests/fuzz/fuzz_api.py --cases 300 --seed 7

Every rank draws the same cases from the shared seed (per-rank differences are functions of the
rank drawn from that stream), so the ranks stay in step. A case is one call of a public function
(allreduce, grouped_allreduce, allgather, broadcast, neighbor_allreduce, neighbor_allgather)
with arguments that are either

* invalid the same way on every rank (wrong types, odd names, huge/negative/non-int root ranks,
  non-tensor inputs, unsupported dtypes, scalars to allgather, bad neighbour lists and weights):
  every rank must raise a clear exception;
* valid on every rank but inconsistent between ranks (shapes, dtypes, root ranks, operations,
  neighbour lists that do not mirror each other): every rank must raise, naming the
  disagreement;
* valid and consistent but odd (names with spaces, NUL bytes, non-ASCII or 10,000 characters;
  Python lists and numpy arrays instead of tensors; zero-sized tensors; infinities): every rank
  must return the right value.

A clear exception is a TypeError, ValueError, NotImplementedError, bluefog's BluefogError or a
tf.errors.OpError whose message names bluefog. After every case all ranks run a check-up
collective that gathers each rank's outcome, so a rank that succeeded where another raised, or a
runtime left broken by the bad call, is caught at once. A watchdog ends the process when a case
takes longer than --case-timeout seconds, so a hang fails instead of blocking. Exit status 0 when
every case behaved; rank 0 prints "FUZZ SUMMARY {json}".

Some bad input cannot fail on every rank: when only some ranks pass arguments that are invalid
locally (e.g. one rank passes root_rank=-1), those ranks raise at once and the others submit
and wait for them. Those cases are not drawn here (see BLUEFOG_STALL_SHUTDOWN_TIME).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
import traceback

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

NUMERIC = (tf.uint8, tf.int8, tf.uint16, tf.int16, tf.int32, tf.int64,
           tf.float16, tf.bfloat16, tf.float32, tf.float64)
FLOATS = (tf.float16, tf.bfloat16, tf.float32, tf.float64)
UNSUPPORTED = (tf.string, tf.complex64, tf.complex128, tf.uint32, tf.uint64)
CLEAR_TYPES = (TypeError, ValueError, NotImplementedError)


def bf_module():
    import bluefog.tensorflow as bf
    return bf


class Case:
    """One call. `run(rank, size)` makes it on this rank; `expect` is "error" or a function
    (rank, size) -> expected numpy result(s)."""

    def __init__(self, kind: str, run, expect, detail: str = "", may_raise: bool = False,
                 eager_only: bool = False):
        self.kind, self.run, self.expect, self.detail = kind, run, expect, detail
        self.eager_only = eager_only
        self.may_raise = may_raise  # a clear exception is as good as the right value


# ------------------------------------------------------------------------------- generators


def small(shape, dtype, seed):
    """Deterministic small integer values (exact in every dtype)."""
    rng = np.random.default_rng(seed)
    if dtype == tf.bool:
        return rng.random(shape) < 0.5
    low = 0 if (dtype.is_integer and dtype.is_unsigned) else -3
    return rng.integers(low, low + 7, size=shape).astype(dtype.as_numpy_dtype)


def rand_shape(rng, min_rank=0, max_rank=3):
    return [int(rng.integers(0, 4)) for _ in range(int(rng.integers(min_rank, max_rank + 1)))]


def odd_name(rng):
    choices = [
        "with space", "slash/and.dot", "tab\there", "nul\x00inside", "ünïcødé 名前 Ω",
        "emoji \U0001F600", "'quote\"", "x" * 10_000, "%s %d {}", "\n", ".noname.0",
        "allreduce.noname.999999", "-", "::",
    ]
    return choices[int(rng.integers(len(choices)))]


def bad_names(rng):
    choices = ["", 0, 5, 1.5, b"bytes", ["list"], {"a": 1}, object(), True, tf.constant("t")]
    return choices[int(rng.integers(len(choices)))]


def bad_tensors(rng):
    """Values that are not tensors of a supported dtype, whatever the op."""
    choices = [
        ("None", lambda: None), ("object()", lambda: object()), ("str", lambda: "hello"),
        ("dict", lambda: {"a": 1}), ("ragged list", lambda: [[1, 2], [3]]),
        ("mixed list", lambda: [1, "a"]), ("set", lambda: {1, 2}),
        ("function", lambda: (lambda: 1)), ("complex", lambda: np.ones(3, np.complex64)),
        ("string tensor", lambda: tf.constant(["a", "b"])),
        ("uint32 tensor", lambda: tf.constant([1, 2], tf.uint32)),
        ("uint64 tensor", lambda: tf.constant([1, 2], tf.uint64)),
        ("complex128 tensor", lambda: tf.constant([1j], tf.complex128)),
        ("object ndarray", lambda: np.array([object(), object()])),
        ("ragged tensor", lambda: tf.ragged.constant([[1.0], [2.0, 3.0]])),
        ("sparse tensor", lambda: tf.sparse.from_dense(tf.eye(2))),
        ("resource", lambda: tf.Variable(1.0).handle),
    ]
    return choices[int(rng.integers(len(choices)))]


def bad_roots(rng, size):
    choices = [-1, -(2 ** 31), size, size + 1, 2 ** 31, 2 ** 40, 2 ** 63, -(2 ** 63) - 1,
               1.0, 0.5, "0", None, [0], True, False, float("nan")]
    return choices[int(rng.integers(len(choices)))]


def make_case(rng, index: int, size: int) -> Case:
    kinds = [
        "bad_tensor", "bad_name", "odd_name", "bad_root", "bad_average", "scalar_allgather",
        "shape_differs", "dtype_differs", "root_differs", "op_differs", "gather_rest_differs",
        "python_input", "zero_size", "grouped_odd", "neighbor_bad", "neighbor_mismatch",
        "neighbor_gather_bad", "nonfinite", "unsupported_op_dtype", "bad_device",
        "reduce_op", "bad_reduce_op", "reduce_op_differs", "compression", "bad_compression",
        "horovod_ops_bad", "alltoall_valid", "reducescatter_valid",
    ]
    kind = kinds[int(rng.integers(len(kinds)))]
    # Mostly named; sometimes unnamed, which every rank numbers in call order.
    tag = f"fuzz.{index}" if rng.random() < 0.85 else None
    base_seed = int(rng.integers(2 ** 31))
    op = ["allreduce", "allgather", "broadcast", "grouped_allreduce"][int(rng.integers(4))]

    def one(op_name, x, name, rank, size, **kw):
        import bluefog.tensorflow as bf
        if op_name == "allreduce":
            return bf.allreduce(x, name=name, **kw)
        if op_name == "allgather":
            return bf.allgather(x, name=name, **kw)
        if op_name == "broadcast":
            return bf.broadcast(x, root_rank=kw.pop("root_rank", 0), name=name, **kw)
        return bf.grouped_allreduce([x], name=name, **kw)

    def expect_value(op_name, shape_of, dtype, average=True, root=0):
        """Expected result of a valid call where rank r passes small(shape_of(r), ...)."""
        def f(rank, size):
            xs = [small(shape_of(r), dtype, base_seed + r) for r in range(size)]
            if op_name == "allgather":
                return np.concatenate(xs, axis=0)
            if op_name == "broadcast":
                return xs[root]
            total = np.sum([x.astype(np.float64) for x in xs], axis=0)
            if average:
                total = total / size
                if dtype.is_integer:
                    total = np.trunc(total)
            return [total] if op_name == "grouped_allreduce" else total
        return f

    if kind == "bad_tensor":
        what, make = bad_tensors(rng)
        if what == "None" and op == "grouped_allreduce":  # None entries are allowed there
            what, make = "str", (lambda: "hello")
        return Case(kind, lambda rank, size: one(op, make(), tag, rank, size), "error",
                    f"{op}({what})")

    if kind == "bad_name":
        name = bad_names(rng)
        dtype = NUMERIC[int(rng.integers(len(NUMERIC)))]
        shape = rand_shape(rng, 1)
        return Case(kind, lambda rank, size: one(op, small(shape, dtype, base_seed + rank),
                                                 name, rank, size), "error",
                    f"{op}(name={name!r:.40})")

    if kind == "odd_name":
        name = f"fuzz.{index}:{odd_name(rng)}"
        dtype = NUMERIC[int(rng.integers(len(NUMERIC)))]
        shape = rand_shape(rng, 1)
        return Case(kind, lambda rank, size: one(op, small(shape, dtype, base_seed + rank),
                                                 name, rank, size),
                    expect_value(op, lambda r: shape, dtype), f"{op}(name={name!r:.60})")

    if kind == "bad_root":
        root = bad_roots(rng, size)
        shape = rand_shape(rng)
        return Case(kind, lambda rank, size: one("broadcast", small(shape, tf.float32, base_seed),
                                                 tag, rank, size, root_rank=root), "error",
                    f"broadcast(root_rank={root!r})")

    if kind == "bad_average":
        avg = [None, 1, 0, "yes", 1.0, np.bool_(True), [True]][int(rng.integers(7))]
        op2 = ["allreduce", "grouped_allreduce"][int(rng.integers(2))]
        return Case(kind, lambda rank, size: one(op2, small([2], tf.float32, base_seed), tag,
                                                 rank, size, average=avg), "error",
                    f"{op2}(average={avg!r})")

    if kind == "scalar_allgather":
        dtype = NUMERIC[int(rng.integers(len(NUMERIC)))]
        return Case(kind, lambda rank, size: one("allgather", small([], dtype, base_seed), tag,
                                                 rank, size), "error", "allgather(scalar)")

    if kind == "shape_differs":
        op2 = ["allreduce", "broadcast", "grouped_allreduce"][int(rng.integers(3))]
        shapes = [rand_shape(rng) for _ in range(size)]
        if size > 1 and all(s == shapes[0] for s in shapes):
            shapes[-1] = shapes[0] + [2]
        expect = "error" if size > 1 else expect_value(op2, lambda r: shapes[r], tf.float32)
        return Case(kind, lambda rank, size: one(op2, small(shapes[rank], tf.float32,
                                                            base_seed + rank), tag, rank, size),
                    expect, f"{op2} shapes {shapes}")

    if kind == "dtype_differs":
        op2 = ["allreduce", "broadcast", "allgather"][int(rng.integers(3))]
        dts = [NUMERIC[int(rng.integers(len(NUMERIC)))] for _ in range(size)]
        if size > 1 and all(d == dts[0] for d in dts):
            dts[-1] = tf.float64 if dts[0] != tf.float64 else tf.int32
        shape = rand_shape(rng, 1)
        expect = "error" if size > 1 else expect_value(op2, lambda r: shape, dts[0])
        return Case(kind, lambda rank, size: one(op2, small(shape, dts[rank], base_seed + rank),
                                                 tag, rank, size), expect,
                    f"{op2} dtypes {[d.name for d in dts]}")

    if kind == "root_differs":
        roots = [int(rng.integers(size)) for _ in range(size)]
        if size > 1 and all(r == roots[0] for r in roots):
            roots[-1] = (roots[0] + 1) % size
        shape = rand_shape(rng)
        expect = ("error" if size > 1 else
                  expect_value("broadcast", lambda r: shape, tf.int32, root=roots[0]))
        return Case(kind, lambda rank, size: one("broadcast", small(shape, tf.int32,
                                                                    base_seed + rank),
                                                 tag, rank, size, root_rank=roots[rank]),
                    expect, f"broadcast roots {roots}")

    if kind == "op_differs":
        # Named: unnamed calls of different ops get different names ("allreduce.noname.3",
        # "broadcast.noname.0"), never match, and wait (see the report on unnamed mismatches).
        tag = f"fuzz.{index}"
        ops = [["allreduce", "allgather", "broadcast"][int(rng.integers(3))] for _ in range(size)]
        if size > 1 and all(o == ops[0] for o in ops):
            ops[-1] = "broadcast" if ops[0] != "broadcast" else "allreduce"
        expect = "error" if size > 1 else expect_value(ops[0], lambda r: [3], tf.float32)
        return Case(kind, lambda rank, size: one(ops[rank], small([3], tf.float32,
                                                                  base_seed + rank),
                                                 tag, rank, size), expect, f"ops {ops}")

    if kind == "gather_rest_differs":
        shapes = [[int(rng.integers(0, 3))] + rand_shape(rng, 0, 2) for _ in range(size)]
        if size > 1 and all(s[1:] == shapes[0][1:] for s in shapes):
            shapes[-1] = shapes[-1] + [3]
        expect = "error" if size > 1 else expect_value("allgather", lambda r: shapes[r],
                                                       tf.float32)
        return Case(kind, lambda rank, size: one("allgather", small(shapes[rank], tf.float32,
                                                                    base_seed + rank),
                                                 tag, rank, size), expect,
                    f"allgather shapes {shapes}")

    if kind == "python_input":
        # Lists, numpy arrays and Python scalars are converted like tf.convert_to_tensor does.
        # No zero-sized dimension: a nested list cannot express the shape [0, 3].
        shape = [d + 1 for d in rand_shape(rng, 1, 2)]
        how = ["list", "ndarray", "variable"][int(rng.integers(3))]
        dtype = [tf.int32, tf.float32][int(rng.integers(2))]

        def run(rank, size):
            x = small(shape, dtype, base_seed + rank)
            if how == "list":
                x = x.tolist()
            elif how == "variable":
                x = tf.Variable(x)
            return one(op, x, tag, rank, size)
        # A tf.function that creates a variable is traced twice and must not create it again.
        return Case(kind, run, expect_value(op, lambda r: shape, dtype), f"{op}({how})",
                    eager_only=(how == "variable"))

    if kind == "zero_size":
        shape = rand_shape(rng, 1)
        shape[int(rng.integers(len(shape)))] = 0
        dtype = NUMERIC[int(rng.integers(len(NUMERIC)))]
        return Case(kind, lambda rank, size: one(op, small(shape, dtype, base_seed + rank), tag,
                                                 rank, size),
                    expect_value(op, lambda r: shape, dtype), f"{op} shape {shape}")

    if kind == "grouped_odd":
        variant = int(rng.integers(4))
        if variant == 0:  # empty list: nothing to do, an empty result
            return Case(kind, lambda rank, size: bf_module().grouped_allreduce([], name=tag),
                        lambda rank, size: [], "grouped_allreduce([])")
        if variant == 1:  # not a list of tensors (a tensor or array is not one either)
            k = int(rng.integers(6))
            what = ["5", "object()", "'abc'", "None", "a tensor", "a numpy array"][k]

            def run(rank, size):
                import bluefog.tensorflow as bf
                arg = [lambda: 5, object, lambda: "abc", lambda: None,
                       lambda: tf.constant([1.0, 2.0]), lambda: np.ones([2, 2])][k]()
                return bf.grouped_allreduce(arg, name=tag)
            return Case(kind, run, "error", f"grouped_allreduce({what})")
        if variant == 2:  # a list holding a non-tensor
            what, make = bad_tensors(rng)
            if what == "None":  # None entries are allowed (they stay None)
                what, make = "str", (lambda: "hello")
            return Case(kind, lambda rank, size: bf_module().grouped_allreduce(
                [tf.ones([2]), make()], name=tag), "error", f"grouped_allreduce([ones, {what}])")
        # mixed dtypes, a None entry, different shapes: valid
        dts = [NUMERIC[int(rng.integers(len(NUMERIC)))] for _ in range(3)]
        shapes = [rand_shape(rng) for _ in range(3)]

        def run(rank, size):
            import bluefog.tensorflow as bf
            xs = [small(s, d, base_seed + 10 * k + rank) for k, (s, d) in
                  enumerate(zip(shapes, dts))]
            return bf.grouped_allreduce([xs[0], None, xs[1], xs[2]], average=False, name=tag)

        def expect(rank, size):
            out = []
            for k, (s, d) in enumerate(zip(shapes, dts)):
                out.append(np.sum([small(s, d, base_seed + 10 * k + r).astype(np.float64)
                                   for r in range(size)], axis=0))
            return [out[0], None, out[1], out[2]]
        return Case(kind, run, expect, f"grouped mixed {[d.name for d in dts]} {shapes}")

    if kind == "reduce_op":
        # Min, max, product, sum and average of small integers: exact in every dtype (a product
        # over 3 ranks of values in [-3, 3] fits int8).
        rop = ["min", "max", "product", "sum", "average"][int(rng.integers(5))]
        op2 = ["allreduce", "grouped_allreduce"][int(rng.integers(2))]
        dtype = NUMERIC[int(rng.integers(len(NUMERIC)))]
        shape = rand_shape(rng)

        def run(rank, size):
            import bluefog.tensorflow as bf
            x = small(shape, dtype, base_seed + rank)
            return one(op2, x, tag, rank, size, op=getattr(bf, rop.capitalize()))

        def expect(rank, size):
            xs = np.stack([small(shape, dtype, base_seed + r).astype(np.float64)
                           for r in range(size)])
            if rop == "average":
                out = xs.sum(axis=0) / size
                out = np.trunc(out) if dtype.is_integer else out
            else:
                out = {"min": np.min, "max": np.max, "product": np.prod,
                       "sum": np.sum}[rop](xs, axis=0)
            return [out] if op2 == "grouped_allreduce" else out
        return Case(kind, run, expect, f"{op2}(op={rop}) {dtype.name} {shape}")

    if kind == "bad_reduce_op":
        bad = ["median", 3, "MAX", None, object(), True, "ADASUM"][int(rng.integers(7))]
        variant = int(rng.integers(3))

        def run(rank, size):
            import bluefog.tensorflow as bf
            if variant == 0 and bad is not None:
                return bf.allreduce(small([2], tf.float32, base_seed), op=bad, name=tag)
            if variant == 1 and bad is not None:
                return bf.grouped_allreduce([small([2], tf.float32, base_seed)], op=bad,
                                            name=tag)
            # min/max/product of IndexedSlices (or of bool) is not defined
            slices = tf.IndexedSlices(tf.ones([1, 2]), tf.constant([0]), tf.constant([3, 2]))
            return bf.allreduce(slices if variant != 1 else tf.constant([True]),
                                op=bf.Max, name=tag)
        return Case(kind, run, "error", f"allreduce(op={bad!r}) variant {variant}")

    if kind == "reduce_op_differs":
        tag = f"fuzz.{index}"
        ops = [["min", "max", "product", "sum"][int(rng.integers(4))] for _ in range(size)]
        if size > 1 and all(o == ops[0] for o in ops):
            ops[-1] = "max" if ops[0] != "max" else "min"

        def run(rank, size):
            import bluefog.tensorflow as bf
            return bf.allreduce(small([3], tf.float32, base_seed + rank),
                                op=getattr(bf, ops[rank].capitalize()), name=tag)
        expect = "error" if size > 1 else (
            lambda rank, size: small([3], tf.float32, base_seed).astype(np.float64))
        return Case(kind, run, expect, f"allreduce ops {ops}")

    if kind == "compression":
        kind_c = ["none", "fp16", "bf16"][int(rng.integers(3))]
        op2 = ["allreduce", "grouped_allreduce"][int(rng.integers(2))]
        dtype = NUMERIC[int(rng.integers(len(NUMERIC)))]
        shape = rand_shape(rng)

        def run(rank, size):
            import bluefog.tensorflow as bf
            return one(op2, small(shape, dtype, base_seed + rank), tag, rank, size,
                       compression=getattr(bf.Compression, kind_c))
        return Case(kind, run, expect_value(op2, lambda r: shape, dtype),
                    f"{op2}(compression={kind_c}) {dtype.name} {shape}")

    if kind == "bad_compression":
        bad = ["fp16", 16, object(), tf.float16, True][int(rng.integers(5))]
        where = int(rng.integers(3))

        def run(rank, size):
            import bluefog.tensorflow as bf
            if where == 0:
                return bf.allreduce(small([2], tf.float32, base_seed), compression=bad,
                                    name=tag)
            if where == 1:
                return bf.grouped_allreduce([small([2], tf.float32, base_seed)],
                                            compression=bad, name=tag)
            return bf.DistributedGradientTape(tf.GradientTape(), compression=bad)
        return Case(kind, run, "error", f"compression={bad!r} at {where}")

    if kind == "neighbor_bad":
        variant = int(rng.integers(9))
        bad_src = [{size: 0.5}, {-1: 0.5}, {"0": 0.5}, {0.0: 0.5}, [size + 3], "abc", 5][
            int(rng.integers(7))]

        def run(rank, size):
            import bluefog.tensorflow as bf
            x = small([3], tf.float32, base_seed + rank)
            if variant == 0:
                return bf.neighbor_allreduce(x, self_weight=0.5, src_weights=bad_src,
                                             dst_weights=[], name=tag)
            if variant == 1:  # self in the lists
                return bf.neighbor_allreduce(x, self_weight=0.5, src_weights={rank: 0.5},
                                             dst_weights=[rank], name=tag)
            if variant == 2:  # only one of the pair
                return bf.neighbor_allreduce(x, self_weight=0.5, src_weights={}, name=tag)
            if variant == 3:  # src_weights without self_weight
                return bf.neighbor_allreduce(x, src_weights={}, dst_weights=[], name=tag)
            if variant == 4:  # integer dtype cannot be averaged with weights
                return bf.neighbor_allreduce(small([3], tf.int32, base_seed), name=tag)
            if variant == 5:  # a rank listed twice
                return bf.neighbor_allreduce(x, self_weight=0.5, src_weights=[0, 0],
                                             dst_weights=[0, 0], name=tag)
            if variant == 6:  # a weight that is not a number
                return bf.neighbor_allreduce(x, self_weight="half", src_weights={},
                                             dst_weights=[], name=tag)
            if variant == 7:
                return bf.neighbor_allreduce(x, self_weight=0.5,
                                             src_weights={(rank + 1) % size: "w"},
                                             dst_weights=[(rank - 1) % size], name=tag)
            return bf.neighbor_allreduce(x, self_weight=0.5, src_weights={},
                                         dst_weights={(rank + 1) % size: None}, name=tag)
        return Case(kind, run, "error", f"neighbor_allreduce variant {variant} {bad_src!r}")

    if kind == "neighbor_mismatch":
        # Every rank receives from its left neighbour, but sends to nobody: never mirrored.
        def run(rank, size):
            import bluefog.tensorflow as bf
            x = small([2], tf.float64, base_seed + rank)
            left = (rank - 1) % size
            src = {left: 0.5} if size > 1 else {}
            return bf.neighbor_allreduce(x, self_weight=0.5, src_weights=src, dst_weights=[],
                                         name=tag)
        expect = "error" if size > 1 else (
            lambda rank, size: 0.5 * small([2], tf.float64, base_seed + rank).astype(np.float64))
        return Case(kind, run, expect, "neighbor_allreduce not mirrored")

    if kind == "neighbor_gather_bad":
        variant = int(rng.integers(3))

        def run(rank, size):
            import bluefog.tensorflow as bf
            if variant == 0:
                return bf.neighbor_allgather(small([], tf.float32, base_seed), name=tag)
            if variant == 1:
                return bf.neighbor_allgather(small([2], tf.float32, base_seed),
                                             src_ranks=[], name=tag)
            return bf.neighbor_allgather(small([2], tf.float32, base_seed), src_ranks=[rank],
                                         dst_ranks=[rank], name=tag)
        return Case(kind, run, "error", f"neighbor_allgather variant {variant}")

    if kind == "nonfinite":
        # inf and nan are values like any other: the sum follows IEEE arithmetic.
        vals = [np.inf, -np.inf, np.nan, 1e38, -0.0]
        v = vals[int(rng.integers(len(vals)))]
        dtype = [tf.float32, tf.float64][int(rng.integers(2))]

        def run(rank, size):
            import bluefog.tensorflow as bf
            return bf.allreduce(np.full([2], v if rank == 0 else 1.0, dtype.as_numpy_dtype),
                                average=False, name=tag)

        def expect(rank, size):
            return (np.full([2], v, np.float64) + (size - 1)).astype(dtype.as_numpy_dtype)
        return Case(kind, run, expect, f"allreduce with {v} ({dtype.name})")

    if kind == "unsupported_op_dtype":
        variant = int(rng.integers(3))

        def run(rank, size):
            import bluefog.tensorflow as bf
            if variant == 0:  # bool cannot be summed
                return bf.allreduce(tf.constant([True, False]), name=tag)
            if variant == 1:
                return bf.neighbor_allreduce(tf.constant([1, 2]), name=tag)
            return bf.allreduce(tf.constant(["a"]), name=tag)
        return Case(kind, run, "error", f"unsupported dtype variant {variant}")

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
            if variant == 6:  # scale factors on integers
                return bf.allreduce(tf.constant([1, 2]), prescale_factor=2.0, name=tag)
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

    # bad_device
    dev = ["/device:GPU:0", "nonsense", "/job:nowhere/task:7/device:CPU:0"][int(rng.integers(3))]

    def run(rank, size):
        import bluefog.tensorflow as bf
        return bf.allreduce(small([2], tf.float32, base_seed + rank), name=tag, device=dev)
    return Case(kind, run, lambda rank, size: np.sum(
        [small([2], tf.float32, base_seed + r).astype(np.float64) for r in range(size)],
        axis=0) / size, f"allreduce(device={dev!r})", may_raise=True)


# ------------------------------------------------------------------------------- checking


def is_clear(e: BaseException, bf) -> bool:
    """Whether `e` is an exception a user can act on: an argument error (TypeError, ValueError,
    NotImplementedError), BluefogError or a TF op error, whose message comes from bluefog (names
    bluefog and so the call and tensor), not a bare error from deep inside Python or TF."""
    if not isinstance(e, CLEAR_TYPES + (bf.BluefogError, tf.errors.OpError)):
        return False
    return "bluefog" in str(e).lower()


def is_clear_for(case: Case, e: BaseException, bf) -> bool:
    # A device string is handed to tf.device: TensorFlow's own error names the bad device.
    if case.kind == "bad_device" and isinstance(e, (ValueError, tf.errors.InvalidArgumentError)):
        return "device" in str(e)
    return is_clear(e, bf)


def same_value(got, want) -> bool:
    if isinstance(want, list):
        return (isinstance(got, (list, tuple)) and len(got) == len(want) and
                all(same_value(g, w) for g, w in zip(got, want)))
    if want is None:
        return got is None
    g = np.asarray(got.numpy() if hasattr(got, "numpy") else got)
    w = np.asarray(want)
    if g.shape != w.shape:
        return False
    if g.dtype == np.bool_:
        return np.array_equal(g, w)
    return np.allclose(g.astype(np.float64), w.astype(np.float64), rtol=1e-2, atol=1e-2,
                       equal_nan=True)


OUTCOME_OK, OUTCOME_ERROR = 1, 2


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description="bluefog API fuzzer (run under mpirun)")
    p.add_argument("--cases", type=int, default=300)
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--function-fraction", type=float, default=0.15,
                   help="fraction of cases also wrapped in a tf.function")
    p.add_argument("--case-timeout", type=float, default=60.0)
    p.add_argument("--verbose", action="store_true", help="rank 0 prints every case's outcome")
    args = p.parse_args(argv)
    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(2)
    tf.get_logger().setLevel("ERROR")
    import bluefog.tensorflow as bf
    bf.init()
    rank, size = bf.rank(), bf.size()

    current = {"case": "init", "since": time.monotonic()}

    def watchdog():
        while True:
            time.sleep(0.5)
            if time.monotonic() - current["since"] > args.case_timeout:
                print(f"FUZZ rank {rank}: HANG: {current['case']} did not finish within "
                      f"{args.case_timeout:.0f} s", file=sys.stderr, flush=True)
                os._exit(4)
    threading.Thread(target=watchdog, daemon=True).start()

    rng = np.random.default_rng(args.seed)
    failures, counts, unclear = [], {}, []
    t0 = time.monotonic()
    for i in range(args.cases):
        case = make_case(rng, i, size)
        in_function = rng.random() < args.function_fraction and not case.eager_only
        label = f"case {i} [{case.kind}{' in tf.function' if in_function else ''}] {case.detail}"
        current.update(case=label, since=time.monotonic())
        counts[case.kind] = counts.get(case.kind, 0) + 1
        outcome, got, error = OUTCOME_OK, None, None
        try:
            if in_function:
                got = tf.function(lambda: case.run(rank, size))()  # noqa: B023 - called at once
            else:
                got = case.run(rank, size)
            if isinstance(got, (list, tuple)):
                got = [g.numpy() if hasattr(g, "numpy") else g for g in got]
            elif hasattr(got, "numpy"):
                got = got.numpy()
        except Exception as e:  # noqa: BLE001 -- every exception is examined below
            outcome, error = OUTCOME_ERROR, e
        problem = None
        if case.expect == "error":
            if outcome == OUTCOME_OK:
                problem = "expected an exception, got a result"
            elif not is_clear_for(case, error, bf):
                problem = f"unclear exception {type(error).__name__}: {str(error)[:300]}"
        elif outcome == OUTCOME_ERROR and case.may_raise:
            if not is_clear_for(case, error, bf):
                problem = f"unclear exception {type(error).__name__}: {str(error)[:300]}"
        elif outcome == OUTCOME_ERROR:
            problem = f"unexpected {type(error).__name__}: {str(error)[:300]}"
        elif not same_value(got, case.expect(rank, size)):
            problem = f"wrong result {str(got)[:200]}"
        # Check-up: every rank's outcome, through a fresh collective that must still work.
        try:
            outcomes = bf.allgather(tf.constant([outcome], tf.int32),
                                    name=f"fuzz.checkup.{i}").numpy().tolist()
        except Exception as e:  # noqa: BLE001
            problem = (problem or "") + f"; check-up collective failed: {e}"[:300]
            outcomes = [outcome] * size
        if len(set(outcomes)) != 1:
            problem = (problem or "") + f"; ranks disagree on the outcome: {outcomes}"
        if args.verbose and rank == 0:
            what = (f"{type(error).__name__}: {str(error)[:160]!r}" if error is not None
                    else "ok")
            print(f"FUZZ {label[:120]} -> {what}", flush=True)
        if problem:
            failures.append(f"{label}: {problem}")
            if error is not None and "unclear" in problem:
                unclear.append(label)
                traceback.print_exception(type(error), error, error.__traceback__, limit=6)
    wall = time.monotonic() - t0
    current.update(case="summary", since=time.monotonic())
    n_fail = int(bf.allreduce(tf.constant(len(failures)), average=False,
                              name="fuzz.failures").numpy())
    for f in failures[:50]:
        print(f"FUZZ rank {rank}: FAIL {f}", file=sys.stderr, flush=True)
    if rank == 0:
        print("FUZZ SUMMARY " + json.dumps({
            "ok": n_fail == 0, "size": size, "cases": args.cases, "seed": args.seed,
            "failures_all_ranks": n_fail, "wall_s": round(wall, 1), "by_kind": counts}),
            flush=True)
    return 0 if n_fail == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
