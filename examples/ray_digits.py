"""Keras digits (scikit-learn's bundled 8x8 digits) on Ray actors: no mpirun, no SSH.

    python examples/ray_digits.py --workers 2                 # starts a local Ray
    python examples/ray_digits.py --workers 4 --address auto  # on a running Ray cluster

RayExecutor starts one actor per worker and gives them a Gloo rendezvous; `train` runs in every
actor, calls bf.init() and trains its shard, as examples/keras_digits.py does under bfrun. The
driver prints rank 0's test accuracy and checks that every rank ended with the same weights.
"""

import argparse
import sys


def train(epochs: int = 5, batch_size: int = 32, lr: float = 0.002, seed: int = 42):
    """One rank's training; returns (rank, backend, test accuracy, digest of the weights)."""
    import hashlib
    import os

    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import numpy as np
    import tensorflow as tf
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    import bluefog.tensorflow.keras as bfk

    bfk.init()
    tf.config.threading.set_intra_op_parallelism_threads(
        max(1, (os.cpu_count() or 1) // bfk.local_size()))
    tf.config.threading.set_inter_op_parallelism_threads(2)
    import keras

    rank, size = bfk.rank(), bfk.size()
    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32)
    y = digits.target.astype(np.int64)
    x_train, x_test, y_train, y_test = train_test_split(x, y, test_size=0.2, random_state=0,
                                                        stratify=y)
    n = len(x_train) // size
    x_train, y_train = x_train[rank * n:(rank + 1) * n], y_train[rank * n:(rank + 1) * n]

    keras.utils.set_random_seed(seed + rank)
    model = keras.Sequential([
        keras.Input((64,)),
        keras.layers.Dense(128, activation="relu"),
        keras.layers.Dense(64, activation="relu"),
        keras.layers.Dense(10),
    ])
    model.compile(optimizer=bfk.DistributedOptimizer(keras.optimizers.Adam(lr * size)),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    model.fit(x_train, y_train, batch_size=batch_size, epochs=epochs, verbose=0,
              callbacks=[bfk.callbacks.BroadcastGlobalVariablesCallback(0)])
    _, accuracy = model.evaluate(x_test, y_test, verbose=0)
    digest = hashlib.sha256(b"".join(w.tobytes() for w in model.get_weights())).hexdigest()
    return rank, bfk.backend(), float(accuracy), digest


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--cpus-per-worker", type=float, default=1)
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--address", default=None, help="a Ray cluster's address (default: local)")
    args = p.parse_args()

    import ray

    from bluefog.ray import RayExecutor

    ray.init(address=args.address)
    executor = RayExecutor(RayExecutor.create_settings(timeout_s=120),
                           num_workers=args.workers, cpus_per_worker=args.cpus_per_worker)
    executor.start()
    try:
        results = executor.run(train, kwargs={"epochs": args.epochs})
    finally:
        executor.shutdown()
    _, backend, accuracy, _ = results[0]
    identical = len({r[3] for r in results}) == 1
    print(f"workers={args.workers} backend={backend} epochs={args.epochs} "
          f"test accuracy={accuracy:.4f}")
    print("weights identical on all ranks" if identical else "ERROR: weights differ")
    return 0 if identical else 1


if __name__ == "__main__":
    sys.exit(main())
