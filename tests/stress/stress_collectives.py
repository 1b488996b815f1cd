"""Randomized stress run of bluefog's collectives, every result checked against numpy.

    mpirun -np 3 .venv/bin/python tests/stress/stress_collectives.py --count 10000
    mpirun -np 3 .venv/bin/python tests/stress/stress_collectives.py --count 500   # short

Every rank draws the same sequence of cases from one shared seed: the operation (allreduce,
allgather, broadcast, grouped_allreduce, neighbor_allreduce; the allreduces sum, average, or
take the min, max or product), dtype, shape, name, root rank,
neighbour graph and weights. Each rank's input of case i is drawn from the seed (seed, i, rank),
so every rank can rebuild every other rank's input and compute the exact expected result with
numpy. Inputs are small integers and the weights dyadic, so sums are exact in every dtype;
averages are compared within the dtype's rounding.

Cases run in batches, each batch in one of three ways chosen from the seed: one after the other
in eager mode, concurrently from a pool of Python threads (eager), or all inside one
tf.function (TensorFlow then runs them concurrently). Concurrent batches exercise the runtime's
negotiation of requests that arrive in different orders on different ranks, and tensor fusion.

Names are random: short, long (longer than the 1 KiB negotiation slot, so the overflow path
runs), with spaces, slashes, dots and non-ASCII characters; batches run in eager mode
sometimes leave names out, so that unnamed collectives are matched by call order.

The resident set size (VmRSS, after gc and malloc_trim) is recorded at start, after a warm-up
and at the end; the run fails when it grows by more than --max-rss-growth-mb after the warm-up.
The warm-up first grows the runtime's grow-only buffers (fusion buffer, ring and neighbour
scratch) to their largest size with one call each, then runs the first 20% of the cases (so
TensorFlow's caches and bluefog's bounded name cache fill).

Memory is measured with one glibc malloc arena (--malloc-arenas 1, set with mallopt before
TensorFlow starts): with glibc's default of one arena per thread, large tensors freed by the
batch threads fragment the arenas and RSS creeps up (measured: +20 MB over 8,000 cases with the
default arenas, +4.5 MB and levelling off with one arena; no such creep without large tensors),
which would hide a real leak in allocator noise.

Any mismatch, any exception, or no progress for --stall-timeout seconds fails the run (exit
status non-zero).
Rank 0 prints a summary line starting with "STRESS SUMMARY".
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import sys
import threading
import time
import traceback

from process_memory import limit_malloc_arenas, rss_kb

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def _limit_malloc_arenas(argv) -> int:
    """Applies --malloc-arenas before TensorFlow starts its threads (see the docstring)."""
    n = 1
    for i, a in enumerate(argv):
        if a == "--malloc-arenas" and i + 1 < len(argv):
            n = int(argv[i + 1])
        elif a.startswith("--malloc-arenas="):
            n = int(a.split("=", 1)[1])
    limit_malloc_arenas(n)
    return n


_limit_malloc_arenas(sys.argv[1:])

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

OPS = ("allreduce", "allgather", "broadcast", "grouped_allreduce", "neighbor_allreduce")
REDUCTIONS = ("sum", "sum", "sum", "min", "max", "product")
OP_WEIGHTS = (0.3, 0.2, 0.2, 0.15, 0.15)
NUMERIC = (tf.uint8, tf.int8, tf.uint16, tf.int16, tf.int32, tf.int64,
           tf.float16, tf.bfloat16, tf.float32, tf.float64)
ALL = NUMERIC + (tf.bool,)
FLOATS = (tf.float16, tf.bfloat16, tf.float32, tf.float64)
NAME_CHARS = list("abcdefghijklmnopqrstuvwxyz0123456789_-./: ") + ["ü", "名", "Ω"]
# Relative tolerance for averages (sums of small integers are exact in every dtype).
RTOL = {tf.float16: 2e-3, tf.bfloat16: 1.6e-2, tf.float32: 1e-6, tf.float64: 1e-12}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--count", type=int, default=10000, help="number of collectives")
    p.add_argument("--seed", type=int, default=12345, help="seed shared by every rank")
    p.add_argument("--batch", type=int, default=16, help="largest number of cases per batch")
    p.add_argument("--function-fraction", type=float, default=0.05,
                   help="fraction of batches run inside one tf.function (each one is traced)")
    p.add_argument("--thread-fraction", type=float, default=0.45,
                   help="fraction of batches issued concurrently from Python threads")
    p.add_argument("--large-fraction", type=float, default=0.02,
                   help="fraction of tensors with up to --large-elements elements")
    p.add_argument("--large-elements", type=int, default=300_000)
    p.add_argument("--malloc-arenas", type=int, default=1,
                   help="glibc malloc arenas (M_ARENA_MAX); 0 keeps glibc's default")
    p.add_argument("--max-rss-growth-mb", type=float, default=24.0,
                   help="fail when VmRSS grows more than this after the warm-up")
    p.add_argument("--stall-timeout", type=float, default=120.0,
                   help="fail when no batch completes for this many seconds")
    p.add_argument("--no-saturate", dest="saturate", action="store_false",
                   help="skip growing the runtime's grow-only buffers to their full size first")
    p.add_argument("--ops", default=",".join(OPS),
                   help="comma-separated subset of the operations to draw from")
    p.add_argument("--json", help="rank 0 writes the summary as JSON to this file")
    return p.parse_args(argv)


def rss_mb() -> float:
    """VmRSS after returning freed heap memory to the system.

    Random tensor sizes fragment malloc's heap; without the trim, RSS would measure how much
    freed memory glibc keeps around rather than what the process still holds.
    """
    kb = rss_kb()
    return kb / 1024.0 if kb else float("nan")


# ------------------------------------------------------------------------------- case drawing


def draw_shape(rng, args, min_rank=0):
    if rng.random() < args.large_fraction:
        return [int(rng.integers(1, args.large_elements + 1))]
    ndim = int(rng.integers(min_rank, 4))
    # Zero-sized dimensions now and then.
    return [int(rng.integers(0, 6)) if rng.random() < 0.1 else int(rng.integers(1, 6))
            for _ in range(ndim)]


def draw_name(rng, index: int):
    """A name that is unique per case (prefix) and odd in the rest."""
    kind = rng.random()
    if kind < 0.6:
        tail = "".join(rng.choice(NAME_CHARS, size=int(rng.integers(0, 12))))
    elif kind < 0.95:
        tail = "x" * int(rng.integers(20, 80))
    else:  # longer than a negotiation slot on its own
        tail = "".join(rng.choice(NAME_CHARS, size=int(rng.integers(1100, 1500))))
    return f"stress.{index}:{tail}"


def draw_case(rng, index: int, size: int, args) -> dict:
    ops = [o for o in OPS if o in args.ops.split(",")]
    weights = np.array([OP_WEIGHTS[OPS.index(o)] for o in ops])
    op = ops[int(rng.choice(len(ops), p=weights / weights.sum()))]
    case = {"op": op, "index": index, "name": draw_name(rng, index)}
    if op in ("allreduce", "grouped_allreduce"):
        # Mostly sums (half of them averaged); also min, max and product.
        case["reduce"] = REDUCTIONS[int(rng.integers(len(REDUCTIONS)))]
    if op == "allreduce":
        case.update(dtype=NUMERIC[int(rng.integers(len(NUMERIC)))], shape=draw_shape(rng, args),
                    average=bool(rng.random() < 0.5))
    elif op == "grouped_allreduce":
        n = int(rng.integers(1, 6))
        case.update(dtypes=[NUMERIC[int(rng.integers(len(NUMERIC)))] for _ in range(n)],
                    shapes=[draw_shape(rng, args) for _ in range(n)],
                    average=bool(rng.random() < 0.5))
    elif op == "allgather":
        rest = draw_shape(rng, args)[:2]
        if int(np.prod(rest)) > 1000:
            rest = rest[:0]
        first = [int(rng.integers(0, 5)) for _ in range(size)]
        if rng.random() < args.large_fraction:
            first = [int(rng.integers(0, args.large_elements // 4)) for _ in range(size)]
        case.update(dtype=ALL[int(rng.integers(len(ALL)))], rest=rest, first=first)
    elif op == "broadcast":
        case.update(dtype=ALL[int(rng.integers(len(ALL)))], shape=draw_shape(rng, args),
                    root=int(rng.integers(size)))
    else:  # neighbor_allreduce on a random directed graph with dyadic weights
        adj = rng.random((size, size)) < 0.6
        np.fill_diagonal(adj, False)  # adj[s, d]: s sends to d
        recv_w = rng.integers(1, 5, size=(size, size)) / 4.0  # weight d applies to s's tensor
        send_w = rng.integers(1, 3, size=(size, size)) / 2.0  # scale s applies when sending to d
        case.update(dtype=FLOATS[int(rng.integers(len(FLOATS)))], shape=draw_shape(rng, args),
                    adj=adj, recv_w=recv_w, send_w=send_w,
                    self_w=rng.integers(0, 5, size=size) / 4.0,
                    scaled_send=bool(rng.random() < 0.5))
    return case


def values(dtype, shape, rng, spread: int = 4) -> np.ndarray:
    if dtype == tf.bool:
        return rng.random(shape) < 0.5
    low = 0 if (dtype.is_integer and dtype.is_unsigned) else -spread
    return rng.integers(low, low + 2 * spread + 1, size=shape).astype(dtype.as_numpy_dtype)


def case_input(case: dict, rank: int, seed: int):
    """This rank's input(s) for the case, reproducible on every rank."""
    rng = np.random.default_rng([seed, case["index"], rank])
    # Products over up to 6 ranks of values in [-1, 1] ([0, 2] unsigned) fit every dtype.
    spread = 1 if case.get("reduce") == "product" else 4
    if case["op"] == "grouped_allreduce":
        return [values(d, s, rng, spread) for d, s in zip(case["dtypes"], case["shapes"])]
    if case["op"] == "allgather":
        return values(case["dtype"], [case["first"][rank]] + case["rest"], rng)
    return values(case["dtype"], case["shape"], rng, spread)


# ------------------------------------------------------------------------------- expectations


def reduce_expected(inputs, dtype, average: bool, size: int, reduce: str = "sum") -> np.ndarray:
    if reduce != "sum":
        return {"min": np.min, "max": np.max, "product": np.prod}[reduce](
            [x.astype(np.float64) for x in inputs], axis=0)
    total = np.sum([x.astype(np.float64) for x in inputs], axis=0)
    if average:
        total = total / size
        if dtype.is_integer:
            total = np.trunc(total)
    return total


def expected(case: dict, rank: int, size: int, seed: int):
    inputs = [case_input(case, r, seed) for r in range(size)]
    op = case["op"]
    if op == "allreduce":
        return reduce_expected(inputs, case["dtype"], case["average"], size, case["reduce"])
    if op == "grouped_allreduce":
        return [reduce_expected([inp[k] for inp in inputs], d, case["average"], size,
                                case["reduce"])
                for k, d in enumerate(case["dtypes"])]
    if op == "allgather":
        return np.concatenate(inputs, axis=0)
    if op == "broadcast":
        return inputs[case["root"]]
    adj, recv_w, send_w = case["adj"], case["recv_w"], case["send_w"]
    out = case["self_w"][rank] * inputs[rank].astype(np.float64)
    for src in range(size):
        if adj[src, rank]:
            scale = send_w[src, rank] if case["scaled_send"] else 1.0
            out = out + recv_w[src, rank] * scale * inputs[src].astype(np.float64)
    return out


def matches(got: np.ndarray, want: np.ndarray, dtype) -> bool:
    got = np.asarray(got)
    if got.shape != np.shape(want):
        return False
    if dtype == tf.bool:
        return got.dtype == np.bool_ and np.array_equal(got, want)
    if got.dtype != dtype.as_numpy_dtype:
        return False
    g = got.astype(np.float64)
    if dtype.is_floating:
        return np.allclose(g, want, rtol=RTOL[dtype], atol=RTOL[dtype])
    return np.array_equal(g, want)


def check(case: dict, got, rank: int, size: int, seed: int) -> list:
    """Descriptions of the mismatches of one case (empty when right)."""
    want = expected(case, rank, size, seed)
    if case["op"] == "grouped_allreduce":
        bad = [k for k, (g, w, d) in enumerate(zip(got, want, case["dtypes"]))
               if not matches(g, w, d)]
        return [f"{case_summary(case)} tensor {k}" for k in bad]
    return [] if matches(got, want, case["dtype"]) else [case_summary(case)]


def case_summary(case: dict) -> str:
    shape = case.get("shape", case.get("shapes", case.get("rest")))
    dtype = case.get("dtype") or case.get("dtypes")
    dname = dtype.name if hasattr(dtype, "name") else [d.name for d in dtype]
    return (f"case {case['index']} {case['op']} {case.get('reduce', '')} dtype {dname} "
            f"shape {shape} name {case['name'][:40]!r}")


# ------------------------------------------------------------------------------- execution


def call(bf, case: dict, x, rank: int, name):
    """Issues the collective of `case` on input `x` (tensors); returns the op's output."""
    op = case["op"]
    if op in ("allreduce", "grouped_allreduce"):
        fn = bf.allreduce if op == "allreduce" else bf.grouped_allreduce
        if case["reduce"] == "sum":
            return fn(x, average=case["average"], name=name)
        return fn(x, op=getattr(bf, case["reduce"].capitalize()), name=name)
    if op == "allgather":
        return bf.allgather(x, name=name)
    if op == "broadcast":
        return bf.broadcast(x, root_rank=case["root"], name=name)
    adj, size = case["adj"], len(case["adj"])
    srcs = [s for s in range(size) if adj[s, rank]]
    dsts = [d for d in range(size) if adj[rank, d]]
    src_weights = {s: float(case["recv_w"][s, rank]) for s in srcs}
    dst_weights = ({d: float(case["send_w"][rank, d]) for d in dsts} if case["scaled_send"]
                   else dsts)
    return bf.neighbor_allreduce(x, self_weight=float(case["self_w"][rank]),
                                 src_weights=src_weights, dst_weights=dst_weights, name=name)


def to_tensors(x):
    return [tf.constant(a) for a in x] if isinstance(x, list) else tf.constant(x)


def to_numpy(y):
    return [t.numpy() for t in y] if isinstance(y, list) else y.numpy()


def run_eager(bf, batch, inputs, rank, unnamed: bool):
    return [to_numpy(call(bf, c, to_tensors(x), rank, None if unnamed else c["name"]))
            for c, x in zip(batch, inputs)]


def run_threads(bf, batch, inputs, rank, pool):
    futures = [pool.submit(lambda c=c, x=x: to_numpy(call(bf, c, to_tensors(x), rank, c["name"])))
               for c, x in zip(batch, inputs)]
    return [f.result() for f in futures]


def run_function(bf, batch, inputs, rank):
    tensors = [to_tensors(x) for x in inputs]

    @tf.function
    def step(ts):
        return [call(bf, c, t, rank, c["name"]) for c, t in zip(batch, ts)]

    return [to_numpy(y) for y in step(tensors)]


def saturate_buffers(bf, args, rank: int, size: int) -> None:
    """Grows bluefog's grow-only buffers to their largest size before memory is measured.

    The runtime keeps its fusion buffer (up to BLUEFOG_FUSION_THRESHOLD bytes), the ring
    allreduce's scratch segment and the neighbour exchange's scratch at the largest size seen so
    far, by design (no allocation per step). A random run reaches those sizes only now and then,
    which would look like growth; one call of each kind at the largest size settles them first.
    """
    big = args.large_elements
    threshold = int(os.environ.get("BLUEFOG_FUSION_THRESHOLD", 64 * 1024 * 1024))
    n = max(1, -(-threshold // (big * 8)) + 1)
    tensors = [tf.fill([big], float(rank + k)) for k in range(n)]
    out = bf.grouped_allreduce([tf.cast(t, tf.float64) for t in tensors], average=False,
                               name="stress.saturate.fusion")
    assert float(out[-1][0]) == sum(r + n - 1 for r in range(size)), "saturation allreduce"
    others = [r for r in range(size) if r != rank]
    bf.neighbor_allreduce(tf.ones([big], tf.float64), self_weight=0.5,
                          src_weights={r: 0.25 for r in others},
                          dst_weights={r: 0.5 for r in others}, name="stress.saturate.neighbor")
    bf.allgather(tf.ones([big // 4, 2], tf.float64), name="stress.saturate.allgather")


class Watchdog:
    """Ends the process when no batch completes for `timeout` seconds (a hang fails the run)."""

    def __init__(self, timeout: float, rank: int):
        self.timeout, self.rank = timeout, rank
        self.last = time.monotonic()
        self.where = "start"
        threading.Thread(target=self._watch, daemon=True).start()

    def progress(self, where: str):
        self.last, self.where = time.monotonic(), where

    def _watch(self):
        while True:
            time.sleep(1.0)
            if time.monotonic() - self.last > self.timeout:
                print(f"STRESS rank {self.rank}: no progress for {self.timeout:.0f} s "
                      f"(last: {self.where}); aborting", file=sys.stderr, flush=True)
                os._exit(3)


def main(argv=None) -> int:
    args = parse_args(argv)
    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(2)
    tf.get_logger().setLevel("ERROR")  # function batches retrace on purpose
    import bluefog.tensorflow as bf

    rss_start = rss_mb()
    t_start = time.monotonic()
    bf.init()
    rank, size = bf.rank(), bf.size()
    if args.saturate:
        saturate_buffers(bf, args, rank, size)
    watchdog = Watchdog(args.stall_timeout, rank)
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=args.batch)

    rng = np.random.default_rng(args.seed)  # the shared stream: identical on every rank
    warmup_at = max(1, args.count // 5)
    rss_warm = None
    trace_every = max(1, args.count // 10)
    rss_trace = [rss_mb()]  # after init, then every 10% of the cases
    done = mismatches = errors = 0
    by_op = {op: 0 for op in OPS}
    by_mode = {"eager": 0, "unnamed": 0, "threads": 0, "function": 0}
    problems = []
    while done < args.count:
        n = min(int(rng.integers(1, args.batch + 1)), args.count - done)
        batch = [draw_case(rng, done + k, size, args) for k in range(n)]
        u = rng.random()
        mode = ("function" if u < args.function_fraction else
                "threads" if u < args.function_fraction + args.thread_fraction else
                "unnamed" if rng.random() < 0.2 else "eager")
        inputs = [case_input(c, rank, args.seed) for c in batch]
        try:
            if mode == "function":
                results = run_function(bf, batch, inputs, rank)
            elif mode == "threads":
                results = run_threads(bf, batch, inputs, rank, pool)
            else:
                results = run_eager(bf, batch, inputs, rank, unnamed=(mode == "unnamed"))
        except Exception as e:  # a wrong exception is as much a failure as a wrong value
            errors += 1
            problems.append(f"batch at case {done} ({mode}): {type(e).__name__}: {e}"[:500])
            traceback.print_exc()
            break  # the ranks may now be out of step; stop rather than hang
        for c, got in zip(batch, results):
            bad = check(c, got, rank, size, args.seed)
            mismatches += len(bad)
            problems.extend(bad[: max(0, 20 - len(problems))])
            by_op[c["op"]] += 1
        by_mode[mode] += n
        done += n
        watchdog.progress(f"case {done} ({mode})")
        if rss_warm is None and done >= warmup_at:
            rss_warm = rss_mb()
        while len(rss_trace) <= 10 and done >= (len(rss_trace)) * trace_every:
            rss_trace.append(rss_mb())
    wall = time.monotonic() - t_start
    rss_end = rss_mb()
    rss_warm = rss_end if rss_warm is None else rss_warm

    # Every rank's figures, gathered to rank 0 (a collective itself, so run only when no rank
    # stopped early: errors are rank-local and would make this collective hang).
    rss_trace = (rss_trace + [rss_end] * 11)[:11]
    mine = np.array([done, mismatches, errors, rss_start, rss_warm, rss_end, wall] + rss_trace,
                    np.float64)
    if errors == 0:
        table = bf.allgather(tf.constant(mine[None, :]), name="stress.summary").numpy()
    else:
        table = mine[None, :]
    ok_memory = bool(np.all(table[:, 5] - table[:, 4] <= args.max_rss_growth_mb))
    ok = bool(np.all(table[:, 1] == 0) and np.all(table[:, 2] == 0) and
              np.all(table[:, 0] == args.count) and ok_memory)
    for p in problems:
        print(f"STRESS rank {rank}: MISMATCH/ERROR {p}", file=sys.stderr, flush=True)
    summary = {
        "ok": ok, "size": size, "count": args.count, "seed": args.seed,
        "completed_per_rank": table[:, 0].astype(int).tolist(),
        "mismatches": int(table[:, 1].sum()), "errors": int(table[:, 2].sum()),
        "rss_start_mb": np.round(table[:, 3], 1).tolist(),
        "rss_after_warmup_mb": np.round(table[:, 4], 1).tolist(),
        "rss_end_mb": np.round(table[:, 5], 1).tolist(),
        "rss_growth_after_warmup_mb": np.round(table[:, 5] - table[:, 4], 1).tolist(),
        "max_rss_growth_mb": args.max_rss_growth_mb, "malloc_arenas": args.malloc_arenas,
        "rss_every_10pct_mb": np.round(table[:, 7:], 1).tolist(),
        "wall_s": round(float(table[:, 6].max()), 1),
        "collectives_per_s": round(args.count / max(float(table[:, 6].max()), 1e-9), 1),
        "by_op": by_op, "by_mode": by_mode,
    }
    if rank == 0 or errors:
        print("STRESS SUMMARY " + json.dumps(summary), flush=True)
        if args.json and rank == 0:
            with open(args.json, "w") as f:
                json.dump(summary, f, indent=1)
    pool.shutdown(wait=False)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
