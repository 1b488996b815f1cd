"""Keras model.fit on N processes: handwritten digits (scikit-learn's bundled 8x8 digits).

    bfrun -np 2 python examples/keras_digits.py          # or: make demo
    python examples/keras_digits.py                      # one process

Each rank trains on its own shard of the training set. The lines marked "bluefog" are all it
takes to turn the single-process script into a data-parallel one. At the end rank 0 prints the
test accuracy, and the script checks that every rank holds exactly the same weights (exit 1
otherwise) and prints a fingerprint of them: two runs that print the same one ended with
bitwise-equal weights (seeded runs do with BLUEFOG_DETERMINISTIC=1 and TF_DETERMINISTIC_OPS=1).
"""

import argparse
import hashlib
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np
import tensorflow as tf
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

import bluefog.tensorflow.keras as bfk  # bluefog (1)

bfk.init()  # bluefog (2)

# Ranks share this machine's cores: give each rank its share of threads.
tf.config.threading.set_intra_op_parallelism_threads(
    max(1, (os.cpu_count() or 1) // bfk.local_size()))
tf.config.threading.set_inter_op_parallelism_threads(2)

import keras  # noqa: E402


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epochs", type=int, default=20)
    p.add_argument("--batch-size", type=int, default=32, help="per rank")
    p.add_argument("--lr", type=float, default=0.002, help="single-process learning rate")
    p.add_argument("--warmup-epochs", type=int, default=2)
    p.add_argument("--seed", type=int, default=42)
    return p.parse_args()


def shard(x, y, rank, size):
    """Rank's shard; every shard has the same length, so every rank runs the same steps."""
    n = len(x) // size
    return x[rank * n:(rank + 1) * n], y[rank * n:(rank + 1) * n]


def weights_identical_on_all_ranks(model) -> bool:
    flat = np.concatenate([w.ravel() for w in model.get_weights()]).astype(np.float64)
    rows = bfk.allgather(tf.constant(flat[None, :]), name="keras_digits.check").numpy()
    return bool(np.all(rows == rows[0]))


def fingerprint(model) -> str:
    """The first 12 hex digits of a SHA-256 of every weight's bytes, in order."""
    digest = hashlib.sha256()
    for w in model.get_weights():
        digest.update(np.ascontiguousarray(w).tobytes())
    return digest.hexdigest()[:12]


def main():
    args = parse_args()
    rank, size = bfk.rank(), bfk.size()
    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32)
    y = digits.target.astype(np.int64)
    x_train, x_test, y_train, y_test = train_test_split(x, y, test_size=0.2, random_state=0,
                                                        stratify=y)
    x_train, y_train = shard(x_train, y_train, rank, size)

    keras.utils.set_random_seed(args.seed + rank)  # different init: the broadcast fixes it
    model = keras.Sequential([
        keras.Input((64,)),
        keras.layers.Dense(128, activation="relu"),
        keras.layers.Dropout(0.1),
        keras.layers.Dense(64, activation="relu"),
        keras.layers.Dense(10),
    ])
    # The effective batch is size * batch_size: scale the learning rate with it (and warm up).
    lr = args.lr * size
    optimizer = bfk.DistributedOptimizer(keras.optimizers.Adam(lr))  # bluefog (3)
    model.compile(optimizer=optimizer,
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    callbacks = [  # bluefog (4)
        bfk.callbacks.BroadcastGlobalVariablesCallback(0),
        bfk.callbacks.MetricAverageCallback(),
        bfk.callbacks.LearningRateWarmupCallback(lr, warmup_epochs=args.warmup_epochs),
    ]
    start = time.time()
    model.fit(x_train, y_train, batch_size=args.batch_size, epochs=args.epochs,
              callbacks=callbacks, verbose=2 if rank == 0 else 0)  # bluefog (5): log on rank 0
    elapsed = time.time() - start

    loss, accuracy = model.evaluate(x_test, y_test, verbose=0)
    identical = weights_identical_on_all_ranks(model)
    if rank == 0:
        print(f"ranks={size} train samples/rank={len(x_train)} epochs={args.epochs} "
              f"time={elapsed:.1f}s test loss={loss:.4f} test accuracy={accuracy:.4f}")
        print(f"weights identical on all ranks (fingerprint {fingerprint(model)})" if identical
              else "ERROR: weights differ between ranks")
    return 0 if identical else 1


if __name__ == "__main__":
    sys.exit(main())
