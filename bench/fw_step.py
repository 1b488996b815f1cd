"""A training step of one framework, bluefog or Horovod, through the API they share: a custom
loop with ``DistributedGradientTape`` on synthetic data, and, in the same processes with their
batches interleaved, the same step with a plain tape (compute only, no communication). Run on
every rank under mpirun by bench/vs_horovod.py; rank 0 prints one JSON line per model:
{"framework", "model", "ranks", "step_s", "compute_s", "overhead", "images_per_s_per_rank"}:
the medians of short blocks of each kind, alternating, and the median over neighbouring blocks
of the step over the compute-only step, minus 1.

    mpirun -np 2 python bench/fw_step.py --framework bluefog --models resnet50 mlp

``--framework none``: only the compute-only step, no framework imported (so no thread of one
running beside TensorFlow), each rank timing itself; rank 0 prints {"framework": "none",
"model", "ranks", "compute_s"}. Horovod's background thread wakes every millisecond
(HOROVOD_CYCLE_TIME) also while nothing is sent, on the cores the compute uses: its compute-only
step in the same processes is slower than TensorFlow alone, which this shows.

Models: resnet50 (Keras' ResNet-50, 64x64 images, batch 16), mlp (4 dense layers of 1024,
batch 64), cnn (examples/synthetic_benchmark.py's small CNN, 32x32, batch 32).
"""

import argparse
import json
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import numpy as np
import tensorflow as tf

from timing import barrier, per_call, slowest


class NoFramework:
    """What bench_model needs of a framework, for --framework none: the launcher's rank and
    size, and no communication (each rank times itself)."""

    def __init__(self):
        env = os.environ
        self._rank = int(env.get("OMPI_COMM_WORLD_RANK", env.get("PMI_RANK", "0")))
        self._size = int(env.get("OMPI_COMM_WORLD_SIZE", env.get("PMI_SIZE", "1")))
        self._local_size = int(env.get("OMPI_COMM_WORLD_LOCAL_SIZE", str(self._size)))

    def init(self):
        pass

    def rank(self):
        return self._rank

    def size(self):
        return self._size

    def local_size(self):
        return self._local_size


def load(framework: str):
    if framework == "none":
        hvd = NoFramework()
    elif framework == "horovod":
        import horovod.tensorflow as hvd
    else:
        import bluefog.tensorflow as hvd
    hvd.init()
    cores = os.cpu_count() or 1
    tf.config.threading.set_intra_op_parallelism_threads(max(1, cores // hvd.local_size()))
    tf.config.threading.set_inter_op_parallelism_threads(2)
    return hvd


def model_and_batch(name: str):
    import keras

    if name == "resnet50":
        model = keras.applications.ResNet50(weights=None, input_shape=(64, 64, 3), classes=10)
        return model, (16, 64, 64, 3)
    if name == "mlp":
        model = keras.Sequential([keras.Input((784,))] + [
            keras.layers.Dense(1024, activation="relu") for _ in range(4)] + [
            keras.layers.Dense(10)])
        return model, (64, 784)
    model = keras.Sequential([
        keras.Input((32, 32, 3)),
        keras.layers.Conv2D(32, 3, padding="same", activation="relu"),
        keras.layers.MaxPooling2D(),
        keras.layers.Conv2D(64, 3, padding="same", activation="relu"),
        keras.layers.MaxPooling2D(),
        keras.layers.Conv2D(128, 3, padding="same", activation="relu"),
        keras.layers.GlobalAveragePooling2D(),
        keras.layers.Dense(10),
    ])
    return model, (32, 32, 32, 3)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--framework", choices=["bluefog", "horovod", "none"], required=True)
    p.add_argument("--models", nargs="+", default=["resnet50", "mlp"])
    p.add_argument("--steps", type=int, default=3, help="steps per timed block")
    p.add_argument("--blocks", type=int, default=16, help="timed blocks of each kind")
    p.add_argument("--warmup", type=int, default=60,
                   help="untimed steps of each kind first: bluefog times two allreduce paths "
                        "for the first 48 calls of each size class (csrc/core/path_chooser.h)")
    args = p.parse_args()
    hvd = load(args.framework)
    import keras

    for name in args.models:
        bench = compute_only if args.framework == "none" else bench_model
        row = bench(hvd, keras, name, args.steps, args.blocks, args.warmup)
        if hvd.rank() == 0:
            print(json.dumps({"framework": args.framework, **row}), flush=True)


def step_maker(model, shape, me: int):
    """Makes tf.function training steps of `model` that share one synthetic batch of `shape`
    (seeded by rank `me`) and one SGD optimizer: ``make(wrap=None, after=None)``, where
    ``wrap(tape)`` returns the tape to take the gradients from (None: the plain tape) and
    ``after(grads)``, if given, returns a value added to the loss once the update is made."""
    import keras

    opt = keras.optimizers.SGD(0.01)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    rs = np.random.RandomState(me)
    x = tf.constant(rs.uniform(size=shape).astype(np.float32))
    y = tf.constant(rs.randint(0, 10, size=(shape[0],)).astype(np.int64))

    def make(wrap=None, after=None):
        @tf.function
        def step():
            with tf.GradientTape() as tape:
                loss = loss_fn(y, model(x, training=True))
            if wrap is not None:
                tape = wrap(tape)
            grads = tape.gradient(loss, model.trainable_variables)
            opt.apply_gradients(zip(grads, model.trainable_variables))
            if after is not None:
                loss += after(grads)
            return loss
        return step

    return make


def bench_model(hvd, keras, name: str, steps: int, blocks: int, warmup: int) -> dict:
    me = hvd.rank()
    keras.utils.set_random_seed(me)
    model, shape = model_and_batch(name)
    make_step = step_maker(model, shape, me)
    dist, compute = make_step(hvd.DistributedGradientTape), make_step()
    dist()  # builds the optimizer's slots, so the broadcast covers them
    hvd.broadcast_variables(model.variables, root_rank=0)
    for _ in range(warmup):
        dist()
        compute()
    batches = {"dist": per_call(lambda: float(dist())),
               "compute": per_call(lambda: float(compute()))}
    times = {"dist": [], "compute": []}
    for block in range(blocks):
        for kind in (("dist", "compute") if block % 2 == 0 else ("compute", "dist")):
            barrier(hvd)
            times[kind].append(slowest(hvd, batches[kind](steps) / steps))
    step_s, compute_s = float(np.median(times["dist"])), float(np.median(times["compute"]))
    # Each block's step over the compute-only block next to it (they ran seconds apart): the
    # machine's drift during a launch, which moves both medians, cancels in these ratios.
    paired = [d / c for d, c in zip(times["dist"], times["compute"])]
    return {"model": name, "ranks": hvd.size(), "step_s": step_s, "compute_s": compute_s,
            "overhead": float(np.median(paired)) - 1,
            "images_per_s_per_rank": shape[0] / step_s}


def compute_only(hvd, keras, name: str, steps: int, blocks: int, warmup: int) -> dict:
    """bench_model's compute-only step alone, without a framework: this rank's median."""
    keras.utils.set_random_seed(hvd.rank())
    model, shape = model_and_batch(name)
    compute = step_maker(model, shape, hvd.rank())()
    for _ in range(warmup):
        compute()
    run = per_call(lambda: float(compute()))
    compute_s = float(np.median([run(steps) / steps for _ in range(blocks)]))
    return {"model": name, "ranks": hvd.size(), "compute_s": compute_s}


if __name__ == "__main__":
    main()
