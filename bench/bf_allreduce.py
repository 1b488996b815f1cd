"""bluefog allreduce timings, run on every rank under mpirun; rank 0 prints JSON lines.

Measured the way a training step pays for it: per-call time from Python, eager and inside a
tf.function, median over repetitions of a batch of calls, the batch time being the slowest
rank's. With --mpi-lib (bench/mpi_allreduce.cc built as a library), raw MPI_Allreduce on
buffers allocated once is timed in this same process, its batches interleaved with bluefog's,
so both see the same machine: these VMs drift by 2-4x within minutes. Started by
bench/run.py; see docs/benchmarks.md.
"""

import argparse
import ctypes
import json
import os
import resource

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import numpy as np
import tensorflow as tf

tf.config.threading.set_intra_op_parallelism_threads(1)
tf.config.threading.set_inter_op_parallelism_threads(2)

import bluefog.tensorflow as bf  # noqa: E402
from bluefog.common import basics  # noqa: E402
from bluefog.tensorflow.op_library import name_input, ops  # noqa: E402

from timing import core_switched, per_call, slowest, timed  # noqa: E402

CHAIN = 8
# Calls of a size class until its path choice is past the first two decisions: 16 untimed,
# 32 timed, the first choice, 256 calls, 32 timed again (PathChooser::kChooseCalls,
# kFirstRecheck in core/path_chooser.h), with some to spare.
STEADY_CALLS = 350


def chained(t, factor, name):
    """CHAIN multiplications by `factor`, each followed by an allreduce of its result (a
    temporary the kernel may reduce in place) when `name` is given."""
    for k in range(CHAIN):
        t = t * factor
        if name:
            t = bf.allreduce(t, average=False, name=f"{name}.{k}")
    return t


def sizes_up_to(max_bytes):
    b, out = 4, []
    while b <= max_bytes:
        out.append(b)
        b *= 4
    if 1024 not in out:
        out.append(1024)
    return sorted(out)


def through_op(x, name: str, inline: bool = True):
    """An eager allreduce of `x` through the TensorFlow op, as bf.allreduce makes it when it
    cannot skip the op (bluefog/tensorflow/eager_calls.py); `inline=False`: the request handed
    to the background thread (as graph ops do, and eager ones before BLUEFOG_EAGER_INLINE)."""
    attrs = {"prescale_factor": 1.0, "postscale_factor": 1.0}
    if inline:
        attrs["eager_inline"] = True
    return lambda: ops.bluefog_allreduce(x, tensor_name=name_input(name), average=False, **attrs)


def unshared(run):
    """`run` with the shared path off (large eager outputs then take the staged or the direct
    path, as before 2026-12-02)."""
    return core_switched(run, lambda: basics._tune("shared", 0),
                         lambda: basics._tune("shared", 1))


def plain_stores(run):
    """`run` with streaming stores off (BLUEFOG_STREAMING_STORES=0: outputs written with plain
    stores, as before 2026-12-02)."""
    before = basics._tuning("streaming_stores")  # the configured threshold, restored after
    return core_switched(run, lambda: basics._tune("streaming_stores", 0),
                         lambda: basics._tune("streaming_stores", before))


def handed_over(run):
    """`run` with graph kernels handing every request to the background thread (tuning knob
    graph_join_us 0), as before they joined rounds themselves (2026-12-05)."""
    before = basics._tuning("graph_join_us")
    return core_switched(run, lambda: basics._tune("graph_join_us", 0),
                         lambda: basics._tune("graph_join_us", before))


def raw_mpi(lib, nbytes: int, calls: int = 1, out_of_place: bool = False):
    """A batch runner for `calls` raw MPI_Allreduce of `nbytes` each, looped in C++."""
    def run(iters: int) -> float:
        seconds = lib.bench_mpi_allreduce(nbytes, calls, iters, int(out_of_place))
        if seconds < 0:
            raise SystemExit("raw MPI_Allreduce failed")
        return seconds
    return run


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--max-bytes", type=int, default=64 << 20)
    p.add_argument("--sizes", help="comma-separated sizes in bytes to time instead of every "
                   "power of 4 up to --max-bytes (e.g. 4,1048576 for the per-call overhead)")
    p.add_argument("--reps", type=int, default=7)
    p.add_argument("--budget", type=float, default=0.5)
    p.add_argument("--mpi-lib", help="bench/mpi_allreduce.cc built with -DBENCH_LIBRARY")
    p.add_argument("--no-steady", action="store_true",
                   help="time from a size's first calls, while its path is still being chosen")
    args = p.parse_args()
    bf.init()
    lib = None
    if args.mpi_lib:
        lib = ctypes.CDLL(args.mpi_lib)
        lib.bench_mpi_allreduce.restype = ctypes.c_double
        lib.bench_mpi_allreduce.argtypes = [ctypes.c_longlong] * 3 + [ctypes.c_int]
    n, me = bf.size(), bf.rank()
    out = []

    def emit(**record):
        record["ranks"] = n
        out.append(record)
        if me == 0:
            print(json.dumps(record), flush=True)

    # Warm up the runtime, TF's eager caches and the allocator, so the first row is not charged
    # for one-time costs.
    warm = tf.constant([1.0])
    for _ in range(300):
        bf.allreduce(warm, name="bench.warmup")

    factor = tf.constant(1.0 / n)  # keeps a chain's values constant (see chained)
    sizes = ([int(b) for b in args.sizes.split(",")] if args.sizes
             else sizes_up_to(args.max_bytes))
    for nbytes in sizes:
        x = tf.fill([nbytes // 4], float(me + 1))
        expected = n * (n + 1) / 2
        got = bf.allreduce(x, average=False, name=f"check.{nbytes}").numpy()
        assert np.all(got == expected), f"wrong allreduce result at {nbytes} bytes"
        fn = tf.function(lambda t, nb=nbytes: bf.allreduce(t, average=False, name=f"f.{nb}"))

        def eager(x=x, nb=nbytes):
            return bf.allreduce(x, average=False, name=f"e.{nb}")

        # An input TensorFlow may overwrite: a temporary made in the step (as gradients are),
        # which the kernel takes as its output and reduces in place. Making it costs the
        # multiplication, timed alone as tf_function_scale.
        fn_temp = tf.function(
            lambda t, nb=nbytes: bf.allreduce(t * 2.0, average=False, name=f"t.{nb}"))
        fn_scale = tf.function(lambda t: t * 2.0)
        # The same, as a training step pays it: CHAIN allreduces of temporaries in one function
        # call, each feeding the next (so none fuse), against the function of the CHAIN
        # multiplications alone; per call, (chain - its multiplications) / CHAIN. Calling a
        # tf.function costs 0.3-0.6 ms on these VMs, which the single call above pays per
        # allreduce and a step pays once. The factor is an input, so grappler cannot fold the
        # multiplications together.
        fn_chain = tf.function(lambda t, s, nb=nbytes: chained(t, s, f"c.{nb}"))
        fn_chain_scale = tf.function(lambda t, s: chained(t, s, None))
        batches = {
            "bf_eager": per_call(eager),
            "bf_eager_op": per_call(through_op(x, f"e.{nbytes}")),
            "bf_eager_handoff": per_call(through_op(x, f"e.{nbytes}", inline=False)),
            "bf_eager_unshared": unshared(per_call(eager)),
            "bf_eager_plain": plain_stores(per_call(eager)),
            # How eager calls ran before 2026-12-01: the op's generated wrapper with its default
            # (int) scale attributes, which TensorFlow's fast path refuses (slow fallback), and
            # the request handed to the background thread.
            "bf_eager_before": per_call(
                lambda x=x, nb=nbytes: ops.bluefog_allreduce(
                    x, tensor_name=name_input(f"o.{nb}"), average=False)),
            "bf_function": per_call(lambda x=x, fn=fn: fn(x)),
            "bf_function_temp": per_call(lambda x=x, fn=fn_temp: fn(x)),
            "tf_function_scale": per_call(lambda x=x, fn=fn_scale: fn(x)),
            "bf_function_temp_handoff": handed_over(per_call(lambda x=x, fn=fn_temp: fn(x))),
            "bf_chain_temp": per_call(lambda x=x, fn=fn_chain: fn(x, factor)),
            "bf_chain_temp_handoff": handed_over(per_call(lambda x=x, fn=fn_chain: fn(x, factor))),
            "tf_chain_scale": per_call(lambda x=x, fn=fn_chain_scale: fn(x, factor)),
        }
        if lib:
            batches["mpi_inproc"] = raw_mpi(lib, nbytes)
            batches["mpi_inproc_oop"] = raw_mpi(lib, nbytes, out_of_place=True)
        got = fn_chain(x, factor).numpy()
        assert np.allclose(got, expected / n), f"wrong chained allreduce result at {nbytes} bytes"
        if nbytes >= 1 << 20 and not args.no_steady:
            # Steady state: past each one-host size class's first choice and the second one
            # 256 calls later (core/path_chooser.h), for outputs in the shared heap and for
            # the rest, so that no timed batch holds the trials' calls on the slower path.
            per_call(eager)(STEADY_CALLS)
            unshared(per_call(eager))(STEADY_CALLS)
        for impl, t in timed(bf, batches, args.budget, args.reps, max_iters=10000).items():
            emit(impl=impl, bytes=nbytes, median_s=t / CHAIN if "chain" in impl else t)
        # Page faults per call in steady state (fresh memory would fault on every page).
        for impl, step in (("bf_eager", eager), ("bf_function_temp", lambda x=x, f=fn_temp: f(x))):
            before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            for _ in range(10):
                step()
            faults = (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 10
            emit(impl="faults_" + impl, bytes=nbytes,
                 faults_per_call=float(slowest(bf, faults)))

    # Eager dispatch floor: what any TF op costs from Python, for the latency comparison.
    tiny = tf.constant([1.0])
    identity = {"id": per_call(lambda: tf.identity(tiny))}
    emit(impl="tf_identity", bytes=4,
         median_s=timed(bf, identity, args.budget, args.reps, max_iters=10000)["id"])

    # Many small tensors: 100 x 1 KiB in one tf.function step vs 100 separate eager calls. The
    # tensors are captured variables, as gradients are computed inside a real training step
    # (passing 100 Python arguments would time tf.function's argument handling instead).
    smalls = [tf.Variable(tf.fill([256], float(me + k))) for k in range(100)]

    @tf.function
    def fused_step():
        return [bf.allreduce(t, average=False, name=f"small.{k}") for k, t in enumerate(smalls)]

    @tf.function
    def grouped_step():
        return bf.grouped_allreduce(smalls, average=False, name="small.grouped")

    @tf.function
    def tf_only_step():
        return [t * 2.0 for t in smalls]

    for step in (fused_step, grouped_step):
        res = step()
        assert all(np.all(r.numpy() == n * (n - 1) / 2 + n * k) for k, r in enumerate(res))

    def eager_step():
        for k, t in enumerate(smalls):
            bf.allreduce(t, average=False, name=f"small_eager.{k}")

    batches = {"bf_function_100x1KiB": per_call(fused_step),
               "bf_grouped_100x1KiB": per_call(grouped_step),
               "tf_function_100_ops": per_call(tf_only_step),
               "bf_eager_100x1KiB": per_call(eager_step)}
    if lib:
        batches["mpi_inproc_100x1KiB"] = raw_mpi(lib, 1024, calls=100)
    for impl, t in timed(bf, batches, args.budget, args.reps, max_iters=10000).items():
        emit(impl=impl, median_s=t)
    bf.shutdown()


if __name__ == "__main__":
    main()
