"""Grouped allreduce of N tensors of one size, in a tf.function: time per step.

Run under mpirun; compare fusion on and off in separate launches, e.g. (see docs/benchmarks.md):

    for f in 67108864 0; do BLUEFOG_FUSION_THRESHOLD=$f mpirun -x BLUEFOG_FUSION_THRESHOLD \\
        --allow-run-as-root --oversubscribe --bind-to none -np 2 \\
        .venv/bin/python bench/fusion_sizes.py 16 1048576; done

Rank 0 prints one JSON line; the time is the median over repetitions of the slowest rank's.
"""

import argparse
import json
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import numpy as np
import tensorflow as tf

tf.config.threading.set_intra_op_parallelism_threads(1)
tf.config.threading.set_inter_op_parallelism_threads(2)

import bluefog.tensorflow as bf  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("count", type=int, help="number of tensors")
    p.add_argument("bytes", type=int, help="bytes per float32 tensor")
    p.add_argument("--reps", type=int, default=7)
    args = p.parse_args()
    bf.init()
    me, n = bf.rank(), bf.size()
    xs = [tf.Variable(tf.fill([args.bytes // 4], float(me + k))) for k in range(args.count)]

    @tf.function
    def step():
        return bf.grouped_allreduce(xs, average=True, name="fusion_sizes")

    for _ in range(3):
        out = step()
    for k, t in enumerate(out):
        assert np.allclose(t.numpy(), (n - 1) / 2 + k), "wrong allreduce result"
    iters = max(1, int(0.5 / max(args.count * args.bytes * 1e-9, 1e-4) / args.reps))
    samples = []
    for _ in range(args.reps):
        bf.allreduce(tf.constant(0.0), name="bench.barrier")
        t0 = time.perf_counter()
        for _ in range(iters):
            step()
        elapsed = (time.perf_counter() - t0) / iters
        samples.append(float(tf.reduce_max(bf.allgather(tf.constant([elapsed]), name="bench.max"))))
    if me == 0:
        print(json.dumps({"ranks": n, "count": args.count, "bytes": args.bytes,
                          "fusion_threshold": os.environ.get("BLUEFOG_FUSION_THRESHOLD", "default"),
                          "median_s": float(np.median(samples))}))
    bf.shutdown()


if __name__ == "__main__":
    main()
