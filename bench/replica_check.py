"""What ``check_replicas`` costs against a training step: bench/fw_step.py's models (default
its MLP: 4 dense layers of 1024, 3.9 M float32 weights) trained with ``DistributedGradientTape``,
and ``check_replicas`` of their trainable weights, eager (as ReplicaCheckCallback calls it) and
inside a ``tf.function``, timed in interleaved batches in the same processes. Rank 0 prints
one JSON line per model: the medians, and the share of a step the check costs when run every
``--every`` steps.

    mpirun -np 2 python bench/replica_check.py [--models mlp cnn] [--every 100]
"""

import argparse
import json
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import tensorflow as tf

from fw_step import load, model_and_batch, step_maker
from timing import interleaved


def bench_model(bf, keras, name: str, every: int, reps: int, calls: int) -> dict:
    keras.utils.set_random_seed(bf.rank())
    model, shape = model_and_batch(name)
    step = step_maker(model, shape, bf.rank())(bf.DistributedGradientTape)
    step()
    bf.broadcast_variables(model.variables, root_rank=0)
    weights = model.trainable_variables

    @tf.function
    def traced():
        bf.check_replicas(weights, name="bench.check.fn")
        return tf.constant(0)

    runs = {"step": lambda: float(step()),
            "check_eager": lambda: bf.check_replicas(weights, name="bench.check"),
            "check_function": lambda: int(traced())}
    for run in runs.values():  # warm-up: traces, the allreduce paths' trials
        for _ in range(50):
            run()
    t = interleaved(bf, runs, reps, calls)
    nbytes = sum(int(tf.size(v)) * tf.as_dtype(v.dtype).size for v in weights)
    return {"model": name, "ranks": bf.size(), "variables": len(weights), "bytes": nbytes,
            "step_s": t["step"], "check_eager_s": t["check_eager"],
            "check_function_s": t["check_function"], "every": every,
            "share_eager": t["check_eager"] / (every * t["step"]),
            "share_function": t["check_function"] / (every * t["step"])}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--models", nargs="+", default=["mlp"])
    p.add_argument("--every", type=int, default=100, help="steps between two checks")
    p.add_argument("--reps", type=int, default=15, help="timed batches of each kind")
    p.add_argument("--calls", type=int, default=5, help="calls per batch")
    args = p.parse_args()
    bf = load("bluefog")
    import keras

    for name in args.models:
        row = bench_model(bf, keras, name, args.every, args.reps, args.calls)
        if bf.rank() == 0:
            print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
