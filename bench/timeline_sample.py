"""The timeline drawn in the docs (docs/data/timeline.json, docs/performance.md "The timeline"):
a few training steps of a small model at 2 ranks, rank 1 made late for one step, recorded with
BLUEFOG_TIMELINE and merged into one trace.

    mpirun --allow-run-as-root --oversubscribe --bind-to none -np 2 \\
        .venv/bin/python bench/timeline_sample.py --out build/timeline/timeline.json

Rank 0 then merges the ranks' files into --out (bf.merge_timelines). What to look for in it is
in docs/performance.md.
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="build/timeline/timeline.json")
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--late-step", type=int, default=2, help="the step rank 1 starts late")
    p.add_argument("--late-ms", type=float, default=20.0)
    args = p.parse_args()
    out = os.path.abspath(args.out)
    os.makedirs(os.path.dirname(out), exist_ok=True)
    import tensorflow as tf

    import bluefog.tensorflow as bf

    bf.init()
    keras = tf.keras
    model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(256, activation="relu"),
                              keras.layers.Dense(10)])
    opt = keras.optimizers.SGD(0.01)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    rng = np.random.default_rng(bf.rank())
    x = tf.constant(rng.standard_normal((32, 64)), tf.float32)
    y = tf.constant(rng.integers(0, 10, 32))

    @tf.function
    def step():
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        tape = bf.DistributedGradientTape(tape)
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    step()  # traced and run once before recording
    bf.broadcast_variables(model.variables, root_rank=0)
    bf.barrier()
    bf.start_timeline(out)
    for i in range(args.steps):
        with bf.timeline_context("step", f"STEP {i}"):
            if i == args.late_step and bf.rank() == 1:
                time.sleep(args.late_ms / 1e3)  # a straggler: the other rank waits for it
            step()
    bf.barrier()
    bf.stop_timeline()
    bf.barrier()
    if bf.rank() == 0:
        bf.merge_timelines(out, bf.size())
        print(f"timeline of {bf.size()} ranks in {out}")


if __name__ == "__main__":
    main()
