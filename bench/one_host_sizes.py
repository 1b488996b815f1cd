"""Mid-size allreduces on one host: the one-host paths against MPI_Allreduce, in one process.

    mpirun --allow-run-as-root --oversubscribe --bind-to none -np 2 \\
        .venv/bin/python bench/one_host_sizes.py

For each size, an eager allreduce of a kept input and an allreduce of a temporary (t * 2) in a
tf.function, each with the tuning knob one_host_threshold at 0 (every size under
BLUEFOG_RING_THRESHOLD takes MPI_Allreduce) and at its default (BLUEFOG_ONE_HOST_THRESHOLD:
from there, the one-host paths). The knob is switched on every rank before each batch, the
batches alternate within every repetition (bench/timing.py's interleaved_batches). Rank 0
prints one JSON line per size with the medians and MPI's time over the one-host paths' time
(above 1: the one-host paths are faster). Sizes under the default threshold take the same path
both ways: their ratio shows the noise.
"""

import argparse
import json
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import tensorflow as tf

tf.config.threading.set_intra_op_parallelism_threads(1)
tf.config.threading.set_inter_op_parallelism_threads(2)

import bluefog.tensorflow as bf  # noqa: E402
from bluefog.common import basics  # noqa: E402

from timing import core_switched, interleaved_batches, per_call  # noqa: E402


def calls(nbytes: int) -> dict:
    """The two kinds of call for one size, as batch runners (bench/timing.py's per_call)."""
    x = tf.fill([max(1, nbytes // 4)], 1.0)
    temp = tf.function(lambda t: bf.allreduce(t * 2.0, op=bf.Sum, name=f"temp.{nbytes}"))
    return {"eager": per_call(lambda: bf.allreduce(x, op=bf.Sum, name=f"eager.{nbytes}")),
            "temp": per_call(lambda: temp(x))}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--sizes", type=int, nargs="+",
                   default=[8 << 10, 16 << 10, 64 << 10, 256 << 10, 512 << 10])
    p.add_argument("--reps", type=int, default=9)
    p.add_argument("--calls", type=int, default=100, help="calls per batch")
    p.add_argument("--warmup", type=int, default=120,
                   help="untimed calls of each kind first, per setting (the path chooser "
                        "times its two paths on a size class's first 48 calls)")
    args = p.parse_args()
    bf.init()
    default = basics._tuning("one_host_threshold")
    settings = {"mpi": 0, "one_host": default}

    def at(threshold, run):
        """`run` with the knob at `threshold` for its batch, back at the default after."""
        return core_switched(run, lambda: basics._tune("one_host_threshold", threshold),
                             lambda: basics._tune("one_host_threshold", default))

    for nbytes in args.sizes:
        kinds = calls(nbytes)
        batches = {(s, k): at(threshold, run)
                   for s, threshold in settings.items() for k, run in kinds.items()}
        for run in batches.values():
            run(args.warmup)
        med = interleaved_batches(bf, batches, args.reps, args.calls)
        if bf.rank() == 0:
            print(json.dumps({"ranks": bf.size(), "bytes": nbytes,
                              **{f"{k}_{s}_s": med[(s, k)] for s, k in med},
                              **{f"{k}_mpi_over_one_host": med[("mpi", k)] / med[("one_host", k)]
                                 for k in kinds}}), flush=True)


if __name__ == "__main__":
    main()
