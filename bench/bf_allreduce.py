"""bluefog allreduce timings, run on every rank under mpirun; rank 0 prints JSON lines.

Measured the way a training step pays for it: per-call time from Python, eager and inside a
tf.function, median over repetitions of a batch of calls, the batch time being the slowest
rank's. Started by bench/run.py; see docs/benchmarks.md.
"""

import argparse
import json
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

tf.config.threading.set_intra_op_parallelism_threads(1)
tf.config.threading.set_inter_op_parallelism_threads(2)

import bluefog.tensorflow as bf  # noqa: E402


def sizes_up_to(max_bytes):
    b, out = 4, []
    while b <= max_bytes:
        out.append(b)
        b *= 4
    if 1024 not in out:
        out.append(1024)
    return sorted(out)


def slowest(seconds: float) -> float:
    return float(tf.reduce_max(bf.allgather(tf.constant([seconds]), name="bench.max")).numpy())


def timed(step, budget: float, reps: int) -> float:
    """Median seconds per call of `step` over `reps` batches, each rank agreeing on batch size."""
    for _ in range(3):
        step()
    t0 = time.perf_counter()
    step()
    step()
    estimate = slowest((time.perf_counter() - t0) / 2)
    iters = max(1, min(10000, int(budget / reps / max(estimate, 1e-7))))
    samples = []
    for _ in range(reps):
        bf.allreduce(tf.constant(0.0), name="bench.barrier")
        t0 = time.perf_counter()
        for _ in range(iters):
            step()
        samples.append(slowest((time.perf_counter() - t0) / iters))
    return float(np.median(samples))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--max-bytes", type=int, default=64 << 20)
    p.add_argument("--reps", type=int, default=7)
    p.add_argument("--budget", type=float, default=0.5)
    args = p.parse_args()
    bf.init()
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

    for nbytes in sizes_up_to(args.max_bytes):
        x = tf.fill([nbytes // 4], float(me + 1))
        expected = n * (n + 1) / 2
        got = bf.allreduce(x, average=False, name=f"check.{nbytes}").numpy()
        assert np.all(got == expected), f"wrong allreduce result at {nbytes} bytes"
        emit(impl="bf_eager", bytes=nbytes, median_s=timed(
            lambda x=x, nb=nbytes: bf.allreduce(x, average=False, name=f"e.{nb}"),
            args.budget, args.reps))
        fn = tf.function(lambda t, nb=nbytes: bf.allreduce(t, average=False, name=f"f.{nb}"))
        emit(impl="bf_function", bytes=nbytes, median_s=timed(lambda: fn(x), args.budget, args.reps))

    # Eager dispatch floor: what any TF op costs from Python, for the latency comparison.
    tiny = tf.constant([1.0])
    emit(impl="tf_identity", bytes=4, median_s=timed(lambda: tf.identity(tiny), args.budget, args.reps))

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
    emit(impl="bf_function_100x1KiB", median_s=timed(fused_step, args.budget, args.reps))
    emit(impl="bf_grouped_100x1KiB", median_s=timed(grouped_step, args.budget, args.reps))
    emit(impl="tf_function_100_ops", median_s=timed(tf_only_step, args.budget, args.reps))

    def eager_step():
        for k, t in enumerate(smalls):
            bf.allreduce(t, average=False, name=f"small_eager.{k}")

    emit(impl="bf_eager_100x1KiB", median_s=timed(eager_step, args.budget, args.reps))
    bf.shutdown()


if __name__ == "__main__":
    main()
