"""4-byte eager allreduce as it ran before 2026-12-01 against now, interleaved in one process.

Before: the op's generated wrapper called with its default scale attributes (ints, which
TensorFlow's eager fast path refuses, so every call re-ran through the slow fallback) and the
request handed to the background thread. Now: ``bf.allreduce`` (float attributes, fast path;
the caller runs the round itself when nothing else is pending; the data rides in the round, so
no collective follows it). "now, data not in the round" is now with BLUEFOG_INLINE_THRESHOLD=0
(switched on every rank around its batches), what the data riding in the round saves. With
``--mpi-lib`` (bench/mpi_allreduce.cc built with -DBENCH_LIBRARY, as bench/run.py builds it)
raw 4-byte MPI_Allreduce is timed in the same processes. Rank 0 prints the medians of 7
repetitions of 400 calls each (batches in a fresh shared order each repetition), the
per-repetition before/now ratios, and the overhead above tf.identity + raw MPI.

    mpirun -np 4 .venv/bin/python bench/eager_before_after.py \
        [--mpi-lib build/bench/libmpi_allreduce.so]
"""

import argparse
import ctypes
import os
import random
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import numpy as np
import tensorflow as tf

tf.config.threading.set_intra_op_parallelism_threads(1)
tf.config.threading.set_inter_op_parallelism_threads(2)

import bluefog.tensorflow as bf  # noqa: E402
from bluefog.common import basics  # noqa: E402
from bluefog.tensorflow.op_library import name_input, ops  # noqa: E402

CALLS = 400


def batch_us(run) -> float:
    """Microseconds per call of `run(calls)` after a barrier; the slowest rank's."""
    run(10)
    bf.barrier()
    t0 = time.perf_counter()
    run(CALLS)
    mine = (time.perf_counter() - t0) / CALLS * 1e6
    return float(tf.reduce_max(bf.allgather(tf.constant([mine]), name="bench.max")).numpy())


def loop(step):
    def run(calls):
        for _ in range(calls):
            step()
    return run


def without_round_data(run):
    def wrapped(calls):
        before = basics._tune("inline_threshold", 0)
        try:
            run(calls)
        finally:
            basics._tune("inline_threshold", before)
    return wrapped


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--mpi-lib", help="bench/mpi_allreduce.cc built with -DBENCH_LIBRARY")
    p.add_argument("--reps", type=int, default=7)
    args = p.parse_args()
    bf.init()
    x = tf.constant([1.0])
    name = name_input("before_after")
    runs = {
        # Before also had no data in the round.
        "before": without_round_data(
            loop(lambda: ops.bluefog_allreduce(x, tensor_name=name, average=True))),
        "now": loop(lambda: bf.allreduce(x, name="before_after.now")),
        "now_no_round_data": without_round_data(
            loop(lambda: bf.allreduce(x, name="before_after.no_data"))),
        "tf_identity": loop(lambda: tf.identity(x)),
    }
    if args.mpi_lib:
        lib = ctypes.CDLL(args.mpi_lib)
        lib.bench_mpi_allreduce.restype = ctypes.c_double
        lib.bench_mpi_allreduce.argtypes = [ctypes.c_longlong] * 3 + [ctypes.c_int]
        runs["raw_mpi"] = lambda calls: lib.bench_mpi_allreduce(4, 1, calls, 0)
    times = {k: [] for k in runs}
    for rep in range(args.reps):
        order = list(runs)
        random.Random(rep).shuffle(order)
        for k in order:
            times[k].append(batch_us(runs[k]))
    if bf.rank() == 0:
        med = {k: float(np.median(v)) for k, v in times.items()}
        ratios = [round(b / a, 2) for b, a in zip(times["before"], times["now"])]
        floor = med["tf_identity"] + med.get("raw_mpi", 0.0)
        over = {k: med[k] - floor for k in ("before", "now", "now_no_round_data")}
        share = {k: v / over["before"] for k, v in over.items()}
        print(f"{bf.size()} ranks, 4-byte eager allreduce: before {med['before']:.0f} us, "
              f"now {med['now']:.0f} us ({med['before'] / med['now']:.2f}x; per repetition "
              f"{ratios}), now without the data in the round {med['now_no_round_data']:.0f} us; "
              f"tf.identity {med['tf_identity']:.0f} us"
              + (f", raw MPI {med['raw_mpi']:.1f} us" if "raw_mpi" in med else "")
              + f"; overhead above those: before {over['before']:.0f} us, now {over['now']:.0f} us "
              f"({share['now']:.2f} of before), without the data in the round "
              f"{over['now_no_round_data']:.0f} us ({share['now_no_round_data']:.2f})",
              flush=True)
    bf.shutdown()


if __name__ == "__main__":
    main()
