"""Compressed allreduce: time and bytes of int8/int4 against float32, and of the two ways to
reduce quantized blocks, side by side in one launch.

    mpirun --allow-run-as-root --oversubscribe --bind-to none -np 2 \\
        .venv/bin/python bench/compressed_allreduce.py --mib 1 4 16

Kinds, each one averaging a list of float32 tensors inside a tf.function:
- none: the float32 allreduce;
- int8, int4: bf.Compression.int8/.int4 (alltoall of each rank's chunks, a sum per chunk on its
  owner, requantize, allgather: 2 (n-1) chunks sent per rank);
- int8_gather: the alternative, composed here from the same ops: an allgather of every rank's
  whole quantized tensor, each rank dequantizing and summing all n ((n-1) tensors sent per rank).
Rank 0 prints one JSON line per size: median ms (the slowest rank's), the bytes one rank sends
and the ratios to none.
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
from bluefog.tensorflow.op_library import name_input, ops  # noqa: E402

from timing import interleaved  # noqa: E402


def gather_all(tensors, name, n):
    """The allgather alternative: every rank's quantized blocks to every rank."""
    total = sum(t.shape.num_elements() for t in tensors)
    codes, scales, _ = ops.bluefog_quantize_inputs(tensors, [], count=total, bits=8, block=256)
    cb, sb = total, -(-total // 256)
    row = tf.concat([codes, tf.reshape(tf.bitcast(scales, tf.uint8), [-1])], 0)[None]
    rows = ops.bluefog_allgather(row, tensor_name=name_input(name))
    rows = tf.reshape(rows, [n, cb + 4 * sb])
    summed = ops.bluefog_dequantize_sum(
        rows[:, :cb], tf.reshape(tf.bitcast(tf.reshape(rows[:, cb:], [n, sb, 4]), tf.float32),
                                 [n, sb]), bits=8, block=256, factor=1.0 / n)
    return summed, (n - 1) * (cb + 4 * sb)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--mib", type=float, nargs="+", default=[1.0, 4.0, 16.0])
    p.add_argument("--tensors", type=int, default=4)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--iters", type=int, default=5)
    args = p.parse_args()
    bf.init()
    me, n = bf.rank(), bf.size()
    for mib in args.mib:
        per = int(mib * 2 ** 20 / 4 / args.tensors)
        grads = [tf.Variable(tf.sin(tf.range(per, dtype=tf.float32) * 0.01 + k) * (me + 1))
                 for k in range(args.tensors)]
        kinds = {"none": bf.Compression.none, "int8": bf.Compression.int8(),
                 "int4": bf.Compression.int4()}
        steps, sent = {}, {}
        for kind, compression in kinds.items():
            def step(compression=compression, kind=kind, grads=grads, mib=mib):
                return bf.grouped_allreduce(list(grads), name=f"bench.q.{mib}.{kind}",
                                            compression=compression)
            steps[kind] = tf.function(step)
        steps["int8_gather"] = tf.function(
            lambda grads=grads, mib=mib: gather_all(list(grads), f"bench.q.{mib}.gather", n)[0])
        total = per * args.tensors
        for kind, step in steps.items():
            out = step()
            first = out[0] if isinstance(out, list) else out
            want = np.sin(np.arange(min(per, 1000)) * 0.01) * (n + 1) / 2
            assert np.allclose(first.numpy()[:1000], want, atol=0.05 * (n + 1)), kind
        bf.reset_compression_stats()
        for kind in ("int8", "int4"):
            steps[kind]()
        stats = bf.compression_stats()
        sent["none"] = 2 * (n - 1) * 4 * total // n
        for kind in ("int8", "int4"):
            sent[kind] = stats[kinds[kind].describe()]["sent_bytes"] if n > 1 else 0
        sent["int8_gather"] = gather_all(list(grads), f"bench.q.{mib}.gather.bytes", n)[1]
        median = interleaved(bf, steps, args.reps, args.iters)
        if me == 0:
            print(json.dumps({
                "ranks": n, "mib": mib, "tensors": args.tensors,
                "median_ms": {k: round(v * 1e3, 3) for k, v in median.items()},
                "sent_bytes": sent,
                "time_vs_none": {k: round(v / median["none"], 3) for k, v in median.items()
                                 if k != "none"},
                "bytes_vs_none": {k: round(v / sent["none"], 4) if sent["none"] else None
                                  for k, v in sent.items() if k != "none"}}), flush=True)
    bf.shutdown()


if __name__ == "__main__":
    main()
