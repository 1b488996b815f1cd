"""Training with compressed gradients: a small MLP classifier, each compressor against none.

    mpirun --allow-run-as-root --oversubscribe --bind-to none -np 2 \\
        .venv/bin/python bench/compression_accuracy.py --steps 300

Data: 32 features, labels from a fixed random two-layer teacher (4 classes); each rank draws its
own batches. The model (32-64-4, SGD with momentum) starts from the same weights for every
compressor; DistributedGradientTape averages the gradients. Rank 0 prints one JSON line: the
final training loss and the held-out accuracy per compressor, and the bytes each one sent.
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


def teacher_data(count, seed):
    gen = np.random.default_rng(0)
    w1, w2 = gen.normal(size=(32, 16)), gen.normal(size=(16, 4))
    x = np.random.default_rng(seed).normal(size=(count, 32)).astype(np.float32)
    y = np.argmax(np.tanh(x @ w1) @ w2, axis=1).astype(np.int32)
    return x, y


def train(compression, steps, x, y, x_test, y_test):
    init = np.random.default_rng(1)
    weights = [tf.Variable(init.normal(scale=0.2, size=(32, 64)).astype(np.float32)),
               tf.Variable(np.zeros(64, np.float32)),
               tf.Variable(init.normal(scale=0.2, size=(64, 4)).astype(np.float32)),
               tf.Variable(np.zeros(4, np.float32))]
    momentum = [tf.Variable(tf.zeros_like(w)) for w in weights]

    def logits(inputs):
        return tf.nn.relu(inputs @ weights[0] + weights[1]) @ weights[2] + weights[3]

    @tf.function
    def step(xb, yb):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(yb, logits(xb)))
        grads = bf.DistributedGradientTape(tape, compression=compression).gradient(loss, weights)
        for w, m, g in zip(weights, momentum, grads):
            m.assign(0.9 * m + g)
            w.assign_sub(0.05 * m)
        return loss

    losses = []
    for k in range(steps):
        lo = (k * 64) % (x.shape[0] - 64)
        losses.append(float(step(x[lo:lo + 64], y[lo:lo + 64])))
    accuracy = float(np.mean(np.argmax(logits(x_test).numpy(), 1) == y_test))
    return float(np.mean(losses[-20:])), accuracy


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=300)
    args = p.parse_args()
    bf.init()
    x, y = teacher_data(8192, seed=10 + bf.rank())
    x_test, y_test = teacher_data(2048, seed=999)
    kinds = {"none": bf.Compression.none, "int8": bf.Compression.int8(),
             "int4": bf.Compression.int4(), "topk_0.05": bf.Compression.topk(0.05),
             "powersgd_2": bf.Compression.powersgd(rank=2)}
    results = {}
    bf.reset_compression_stats()
    for kind, compression in kinds.items():
        loss, accuracy = train(compression, args.steps, x, y, x_test, y_test)
        results[kind] = {"final_loss": round(loss, 4), "test_accuracy": round(accuracy, 4)}
    stats = bf.compression_stats()
    for kind, compression in kinds.items():
        if kind != "none" and compression.describe() in stats:
            results[kind]["bytes_vs_float32"] = round(stats[compression.describe()]["ratio"], 4)
    if bf.rank() == 0:
        print(json.dumps({"ranks": bf.size(), "steps": args.steps, "results": results}))
    bf.shutdown()


if __name__ == "__main__":
    main()
