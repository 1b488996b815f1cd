"""Gradient averaging with and without compression: time per step, side by side in one launch.

Run under mpirun (see docs/benchmarks.md for the rate-limited two-host set-up):

    mpirun --allow-run-as-root --oversubscribe --bind-to none -np 2 \\
        .venv/bin/python bench/compression.py --mib 16

A step is one grouped allreduce (average) of a list of float32 gradients inside a tf.function,
as DistributedGradientTape and DistributedOptimizer do it, with bf.Compression.none, .fp16 and
.bf16. The three are timed in turn within each repetition, so they share the machine's state;
a repetition's time is the slowest rank's. Rank 0 prints one JSON line with the medians and the
ratios to no compression (below 1: compression is faster).
"""

import argparse
import json
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import numpy as np
import tensorflow as tf

tf.config.threading.set_intra_op_parallelism_threads(1)
tf.config.threading.set_inter_op_parallelism_threads(2)

import bluefog.tensorflow as bf  # noqa: E402

from timing import interleaved  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--mib", type=float, default=16.0, help="total float32 gradient size")
    p.add_argument("--tensors", type=int, default=8, help="number of gradient tensors")
    p.add_argument("--reps", type=int, default=7)
    p.add_argument("--iters", type=int, default=5, help="steps per repetition")
    args = p.parse_args()
    bf.init()
    me, n = bf.rank(), bf.size()
    per = int(args.mib * 2 ** 20 / 4 / args.tensors)
    # Distinct values per rank and element; the checks below use the known mean.
    grads = [tf.Variable(tf.fill([per], 0.25 * (me + 1) + k)) for k in range(args.tensors)]
    kinds = {"none": bf.Compression.none, "fp16": bf.Compression.fp16,
             "bf16": bf.Compression.bf16}
    steps = {}
    for kind, compression in kinds.items():
        def step(compression=compression, kind=kind):
            return bf.grouped_allreduce(list(grads), name=f"bench.compression.{kind}",
                                        compression=compression)
        steps[kind] = tf.function(step)
    for kind, step in steps.items():
        for _ in range(2):
            out = step()
        for k, t in enumerate(out):
            assert t.dtype == tf.float32
            assert np.allclose(t.numpy()[:4], 0.25 * (n + 1) / 2 + k, rtol=1e-2), kind
    median = interleaved(bf, steps, args.reps, args.iters)
    if me == 0:
        print(json.dumps({"ranks": n, "mib": args.mib, "tensors": args.tensors,
                          "median_ms": {k: round(v * 1e3, 3) for k, v in median.items()},
                          "vs_none": {k: round(v / median["none"], 3) for k, v in median.items()
                                      if k != "none"}}))
    bf.shutdown()


if __name__ == "__main__":
    main()
