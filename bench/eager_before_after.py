"""4-byte eager allreduce as it ran before 2026-12-01 against now, interleaved in one process.

Before: the op's generated wrapper called with its default scale attributes (ints, which
TensorFlow's eager fast path refuses, so every call re-ran through the slow fallback) and the
request handed to the background thread. Now: ``bf.allreduce`` (float attributes, fast path;
the caller runs the collective itself when nothing else is pending). Rank 0 prints the medians
of 5 repetitions of 400 calls each, the per-repetition ratios, and tf.identity's time for scale.

    mpirun -np 4 .venv/bin/python bench/eager_before_after.py
"""

import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

tf.config.threading.set_intra_op_parallelism_threads(1)
tf.config.threading.set_inter_op_parallelism_threads(2)

import bluefog.tensorflow as bf  # noqa: E402
from bluefog.tensorflow.op_library import name_input, ops  # noqa: E402


def per_call_us(step, calls: int = 400) -> float:
    for _ in range(10):
        step()
    bf.barrier()
    t0 = time.perf_counter()
    for _ in range(calls):
        step()
    return (time.perf_counter() - t0) / calls * 1e6


def main() -> None:
    bf.init()
    x = tf.constant([1.0])
    name = name_input("before_after")
    steps = {
        "before": lambda: ops.bluefog_allreduce(x, tensor_name=name, average=True),
        "after": lambda: bf.allreduce(x, name="before_after"),
        "tf_identity": lambda: tf.identity(x),
    }
    times = {k: [] for k in steps}
    for _ in range(5):
        for k, step in steps.items():
            times[k].append(per_call_us(step))
    if bf.rank() == 0:
        med = {k: float(np.median(v)) for k, v in times.items()}
        ratios = [round(b / a, 2) for b, a in zip(times["before"], times["after"])]
        print(f"{bf.size()} ranks, 4-byte eager allreduce: before {med['before']:.0f} us, "
              f"after {med['after']:.0f} us ({med['before'] / med['after']:.2f}x; per "
              f"repetition {ratios}); tf.identity {med['tf_identity']:.0f} us", flush=True)
    bf.shutdown()


if __name__ == "__main__":
    main()
