"""A custom training loop on N processes with DistributedGradientTape: scikit-learn's digits.

    bfrun -np 2 python examples/tape_digits.py
    python examples/tape_digits.py                       # one process

Each rank trains on its own shard; the tape averages the gradients over ranks, so every rank
applies the same update. Rank 0 prints the test accuracy; the script exits 1 if the ranks'
weights differ at the end.
"""

import argparse
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np
import tensorflow as tf
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

import bluefog.tensorflow as bf

bf.init()
tf.config.threading.set_intra_op_parallelism_threads(
    max(1, (os.cpu_count() or 1) // bf.local_size()))
tf.config.threading.set_inter_op_parallelism_threads(2)

import keras  # noqa: E402


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epochs", type=int, default=20)
    p.add_argument("--batch-size", type=int, default=32, help="per rank")
    p.add_argument("--lr", type=float, default=0.002, help="single-process learning rate")
    p.add_argument("--seed", type=int, default=42)
    return p.parse_args()


def main():
    args = parse_args()
    rank, size = bf.rank(), bf.size()
    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32)
    y = digits.target.astype(np.int64)
    x_train, x_test, y_train, y_test = train_test_split(x, y, test_size=0.2, random_state=0,
                                                        stratify=y)
    n = len(x_train) // size  # equal shards: every rank runs the same number of steps
    x_train, y_train = x_train[rank * n:(rank + 1) * n], y_train[rank * n:(rank + 1) * n]
    dataset = (tf.data.Dataset.from_tensor_slices((x_train, y_train))
               .shuffle(len(x_train), seed=args.seed + rank)
               .batch(args.batch_size))

    keras.utils.set_random_seed(args.seed + rank)
    model = keras.Sequential([
        keras.Input((64,)),
        keras.layers.Dense(128, activation="relu"),
        keras.layers.Dense(64, activation="relu"),
        keras.layers.Dense(10),
    ])
    optimizer = keras.optimizers.Adam(args.lr * size)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    # Same starting point everywhere: rank 0's weights and optimizer state.
    optimizer.build(model.trainable_variables)
    bf.broadcast_variables(model.weights + optimizer.variables, root_rank=0)

    @tf.function
    def train_step(xb, yb):
        with tf.GradientTape() as tape:
            loss = loss_fn(yb, model(xb, training=True))
        tape = bf.DistributedGradientTape(tape)  # gradients averaged over ranks
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    start = time.time()
    for epoch in range(args.epochs):
        losses = [float(train_step(xb, yb)) for xb, yb in dataset]
        mean_loss = bf.allreduce(tf.constant(np.mean(losses)), name="tape_digits.loss")
        if rank == 0 and (epoch % 5 == 4 or epoch == args.epochs - 1):
            print(f"epoch {epoch + 1}: loss (mean over ranks) {float(mean_loss):.4f}")
    elapsed = time.time() - start

    logits = model(x_test, training=False)
    accuracy = float(np.mean(np.argmax(logits, axis=1) == y_test))
    flat = np.concatenate([np.asarray(v).ravel() for v in model.trainable_variables])
    rows = bf.allgather(tf.constant(flat[None, :].astype(np.float64)), name="tape_digits.check")
    identical = bool(np.all(rows.numpy() == rows.numpy()[0]))
    if rank == 0:
        print(f"ranks={size} train samples/rank={len(x_train)} epochs={args.epochs} "
              f"time={elapsed:.1f}s test accuracy={accuracy:.4f}")
        print("weights identical on all ranks" if identical else
              "ERROR: weights differ between ranks")
    return 0 if identical else 1


if __name__ == "__main__":
    sys.exit(main())
