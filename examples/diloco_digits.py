"""DiLoCo with model.fit on N processes: handwritten digits, communicating every H steps.

    bfrun -np 2 python examples/diloco_digits.py
    mpirun -np 2 .venv/bin/python examples/diloco_digits.py --sync-every 22

The same model and data as examples/keras_digits.py, but instead of averaging gradients every
step (bf.DistributedOptimizer), every rank trains alone for --sync-every steps with its own Adam;
then the ranks average their change since the last sync and an outer Nesterov-SGD step applies
it (bf.DiLoCo). Rank 0 prints the test accuracy, the wall time and the bytes each rank handed
to the collectives, next to what a DistributedOptimizer would hand over for the same steps.
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

# Ranks share this machine's cores: give each rank its share of threads.
tf.config.threading.set_intra_op_parallelism_threads(
    max(1, (os.cpu_count() or 1) // bf.local_size()))
tf.config.threading.set_inter_op_parallelism_threads(2)

import keras  # noqa: E402


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epochs", type=int, default=20)
    p.add_argument("--batch-size", type=int, default=32, help="per rank")
    p.add_argument("--lr", type=float, default=0.002, help="inner Adam learning rate")
    p.add_argument("--sync-every", type=int, default=11,
                   help="steps between syncs (22 steps an epoch at 2 ranks)")
    p.add_argument("--outer-lr", type=float, default=0.7)
    p.add_argument("--fp16", action="store_true", help="send the outer gradient as float16")
    p.add_argument("--seed", type=int, default=42)
    return p.parse_args()


def shard(x, y, rank, size, batch_size):
    """Rank's shard, whole batches only: every rank runs the same steps."""
    n = len(x) // size // batch_size * batch_size
    return x[rank * n:(rank + 1) * n], y[rank * n:(rank + 1) * n]


def main():
    args = parse_args()
    rank, size = bf.rank(), bf.size()
    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32)
    y = digits.target.astype(np.int64)
    x_train, x_test, y_train, y_test = train_test_split(x, y, test_size=0.2, random_state=0,
                                                        stratify=y)
    x_train, y_train = shard(x_train, y_train, rank, size, args.batch_size)

    keras.utils.set_random_seed(args.seed + rank)  # different init: DiLoCo starts from rank 0's
    model = keras.Sequential([
        keras.Input((64,)),
        keras.layers.Dense(128, activation="relu"),
        keras.layers.Dropout(0.1),
        keras.layers.Dense(64, activation="relu"),
        keras.layers.Dense(10),
    ])
    optimizer = bf.DiLoCo(
        keras.optimizers.Adam(args.lr),
        keras.optimizers.SGD(args.outer_lr, momentum=0.9, nesterov=True),
        sync_every=args.sync_every,
        compression=bf.Compression.fp16 if args.fp16 else None)
    model.compile(optimizer=optimizer, jit_compile=False,
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    start = time.time()
    model.fit(x_train, y_train, batch_size=args.batch_size, epochs=args.epochs,
              callbacks=[bf.keras.callbacks.MetricAverageCallback()],
              verbose=2 if rank == 0 else 0)
    elapsed = time.time() - start

    loss, accuracy = model.evaluate(x_test, y_test, verbose=0)
    stats = optimizer.communication_stats()
    params = sum(int(np.prod(w.shape)) for w in model.trainable_weights)
    flat = np.concatenate([w.ravel() for w in model.get_weights()]).astype(np.float64)
    rows = bf.allgather(tf.constant(flat[None, :]), name="diloco_digits.check").numpy()
    identical = bool(np.all(rows == rows[0]))
    ends_on_sync = stats["steps"] % args.sync_every == 0
    if rank == 0:
        print(f"ranks={size} train samples/rank={len(x_train)} epochs={args.epochs} "
              f"sync_every={args.sync_every} time={elapsed:.1f}s test loss={loss:.4f} "
              f"test accuracy={accuracy:.4f}")
        allreduce_bytes = stats["steps"] * params * 4 if size > 1 else 0
        print(f"bytes sent by this rank: {stats['bytes_sent']} in {stats['syncs']} syncs of "
              f"{stats['steps']} steps (a DistributedOptimizer: {allreduce_bytes})")
        print("weights identical on all ranks" if identical else
              "ERROR: weights differ between ranks after the final sync" if ends_on_sync else
              "weights differ between ranks: the last steps came after the last sync")
    return 1 if ends_on_sync and not identical else 0

if __name__ == "__main__":
    sys.exit(main())
