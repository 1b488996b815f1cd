"""Step time of a small model's training step: plain tf.GradientTape vs DistributedGradientTape.

Run on 1 rank (`mpirun -np 1`): the difference is bluefog's overhead per step, since the
allreduce has no peer. Both variants alternate within one run; rank 0 prints JSON lines.
"""

import json
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import numpy as np
import tensorflow as tf

tf.config.threading.set_intra_op_parallelism_threads(1)
tf.config.threading.set_inter_op_parallelism_threads(2)

import keras  # noqa: E402

import bluefog.tensorflow as bf  # noqa: E402


def main() -> None:
    bf.init()
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(256, activation="relu"),
                              keras.layers.Dense(256, activation="relu"), keras.layers.Dense(10)])
    opt = keras.optimizers.SGD(0.01)
    x = tf.random.normal([128, 64])
    y = tf.random.uniform([128], maxval=10, dtype=tf.int32)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    def make_step(distributed: bool):
        @tf.function
        def step():
            with tf.GradientTape() as tape:
                loss = loss_fn(y, model(x, training=True))
            if distributed:
                tape = bf.DistributedGradientTape(tape)
            grads = tape.gradient(loss, model.trainable_variables)
            opt.apply_gradients(zip(grads, model.trainable_variables))
            return loss
        return step

    steps = {"plain_tape": make_step(False), "distributed_tape": make_step(True)}
    for f in steps.values():
        f()
    samples = {k: [] for k in steps}
    for _ in range(15):
        for name, f in steps.items():  # alternate, so both see the same machine noise
            t0 = time.perf_counter()
            for _ in range(20):
                f()
            samples[name].append((time.perf_counter() - t0) / 20)
    if bf.rank() == 0:
        for name, s in samples.items():
            print(json.dumps({"impl": name, "ranks": bf.size(), "median_s": float(np.median(s))}))


if __name__ == "__main__":
    main()
