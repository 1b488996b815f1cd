"""The fuzzer's cases: what tests/fuzz/fuzz_api.py draws and how each must behave (see its
docstring). Every rank draws the same cases from the shared seed."""

from __future__ import annotations

import numpy as np
import tensorflow as tf
from fuzz_horovod_cases import HOROVOD_KINDS, make_horovod_case
from fuzz_state_cases import STATE_KINDS, make_state_case

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
        "with space", "slash/and.dot", "tab\there", "ünïcødé 名前 Ω",
        "emoji \U0001F600", "'quote\"", "x" * 10_000, "%s %d {}", "\n", ".noname.0",
        "allreduce.noname.999999", "-", "::",
    ]
    return choices[int(rng.integers(len(choices)))]


def bad_names(rng):
    # A NUL is where a C string ends: two names differing after it must not meet, so it is refused.
    choices = ["", 0, 5, 1.5, b"bytes", ["list"], {"a": 1}, object(), True, tf.constant("t"),
               "nul\x00inside"]
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


def make_case(rng, index: int, size: int, family: str = "api") -> Case:
    """Case `index`: from the stateless API ("api"), the stateful one ("state": windows,
    process sets, join, splits, elastic states) or either ("all")."""
    if family == "state" or (family == "all" and rng.random() < 0.3):
        return make_state_case(STATE_KINDS[int(rng.integers(len(STATE_KINDS)))], rng, index,
                               size)
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
        # (None is valid: Horovod's default, "average unless op says otherwise".)
        avg = ["no", 1, 0, "yes", 1.0, np.bool_(True), [True]][int(rng.integers(7))]
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
            if variant == 2:  # destinations without sources (sources alone are Bluefog's
                # static weighting, valid)
                return bf.neighbor_allreduce(x, self_weight=0.5, dst_weights=[], name=tag)
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

    if kind in HOROVOD_KINDS:
        return make_horovod_case(kind, rng, tag, base_seed)

    # bad_device
    dev = ["/device:GPU:0", "nonsense", "/job:nowhere/task:7/device:CPU:0"][int(rng.integers(3))]

    def run(rank, size):
        import bluefog.tensorflow as bf
        return bf.allreduce(small([2], tf.float32, base_seed + rank), name=tag, device=dev)
    return Case(kind, run, lambda rank, size: np.sum(
        [small([2], tf.float32, base_seed + r).astype(np.float64) for r in range(size)],
        axis=0) / size, f"allreduce(device={dev!r})", may_raise=True)
