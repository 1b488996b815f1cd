"""Asynchronous decentralized Keras training on N processes, with an optional straggler.

    bfrun -np 4 python examples/async_digits.py                          # win_put, no straggler
    bfrun -np 4 python examples/async_digits.py --straggler-ms 20        # last rank 20 ms slower
    bfrun -np 4 python examples/async_digits.py --optimizer allreduce --straggler-ms 20

Each rank trains on its own shard of scikit-learn's bundled 8x8 digits. ``--optimizer``:

* ``winput`` (default): ``bf.DistributedWinPutOptimizer``. After every local step a rank puts
  its weights into its out-neighbours' windows and mixes its own weights with whatever its
  in-neighbours put last. No rank ever waits for another's step, so a slow rank only slows
  itself; its neighbours mix in its (stale) weights as they are.
* ``pushsum``: ``bf.DistributedPushSumOptimizer`` (push-sum over windows: the exact average even
  with ranks running at different speeds). With a straggler, beware: once its neighbours have
  finished, the straggler keeps giving away shares of its push-sum weight and gets none back,
  so its weights underflow after some tens of such steps (its final accuracy drops to 0.1).
* ``neighbor``: ``bf.DistributedAdaptThenCombineOptimizer``, the synchronous neighbour mixing:
  every step waits for the in-neighbours' step.
* ``allreduce``: ``bf.DistributedOptimizer``, gradients averaged over all ranks (the baseline):
  every step waits for the slowest rank.

``--straggler-ms M`` makes rank ``--straggler-rank`` (default: the last) sleep M ms after every
training batch. With the asynchronous optimizers the ranks then run through their epochs at
different speeds; a barrier after ``model.fit`` makes the fast ranks wait for the straggler
before anyone evaluates or shuts down (a rank must not leave while a neighbour still puts into
its windows).

At the end rank 0 prints its own test accuracy, the mean and range over ranks of the ranks'
test accuracies, each rank's training time and the wall time of the whole training (until the
last rank finished).
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
from bluefog.common import topology_util

bf.init()

# Ranks share this machine's cores: give each rank its share of threads.
tf.config.threading.set_intra_op_parallelism_threads(
    max(1, (os.cpu_count() or 1) // bf.local_size()))
tf.config.threading.set_inter_op_parallelism_threads(2)

import keras  # noqa: E402

TOPOLOGIES = {
    "exponential": topology_util.ExponentialGraph,
    "ring": topology_util.RingGraph,
    "symmetric_exponential": topology_util.SymmetricExponentialGraph,
    "mesh": topology_util.MeshGrid2DGraph,
    "star": topology_util.StarGraph,
    "fully_connected": topology_util.FullyConnectedGraph,
}
OPTIMIZERS = ("winput", "pushsum", "neighbor", "allreduce")


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--optimizer", choices=OPTIMIZERS, default="winput",
                   help="winput / pushsum: asynchronous (windows); neighbor: synchronous "
                        "neighbour mixing; allreduce: gradient averaging (baseline)")
    p.add_argument("--straggler-ms", type=float, default=0.0,
                   help="the straggler sleeps this long after every training batch")
    p.add_argument("--straggler-rank", type=int, default=-1, help="default: the last rank")
    p.add_argument("--topology", choices=sorted(TOPOLOGIES), default="exponential")
    p.add_argument("--num-steps-per-communication", type=int, default=1)
    p.add_argument("--epochs", type=int, default=30)
    p.add_argument("--batch-size", type=int, default=32, help="per rank")
    p.add_argument("--lr", type=float, default=0.002)
    p.add_argument("--hidden", type=int, default=128, help="width of the hidden layers")
    p.add_argument("--seed", type=int, default=42)
    return p.parse_args()


def shard(x, y, rank, size):
    """Rank's shard; equal lengths, so every rank runs the same number of steps."""
    n = len(x) // size
    return x[rank * n:(rank + 1) * n], y[rank * n:(rank + 1) * n]


def make_optimizer(args):
    adam = keras.optimizers.Adam(args.lr)
    every = args.num_steps_per_communication
    if args.optimizer == "winput":
        return bf.DistributedWinPutOptimizer(adam, num_steps_per_communication=every)
    if args.optimizer == "pushsum":
        return bf.DistributedPushSumOptimizer(adam, num_steps_per_communication=every)
    if args.optimizer == "neighbor":
        return bf.DistributedAdaptThenCombineOptimizer(adam, num_steps_per_communication=every)
    return bf.DistributedOptimizer(adam)


class Straggler(keras.callbacks.Callback):
    """Sleeps after every training batch: this rank computes as if on a slower machine."""

    def __init__(self, seconds: float):
        super().__init__()
        self.seconds = seconds

    def on_train_batch_end(self, batch, logs=None):
        time.sleep(self.seconds)


def barrier(name: str) -> None:
    """Returns once every rank got here."""
    if hasattr(bf, "barrier"):
        bf.barrier()
    else:
        bf.allreduce(tf.constant(0.0), name=name).numpy()


def main():
    args = parse_args()
    rank, size = bf.rank(), bf.size()
    straggler = args.straggler_rank % size
    bf.set_topology(TOPOLOGIES[args.topology](size))

    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32)
    y = digits.target.astype(np.int64)
    x_train, x_test, y_train, y_test = train_test_split(x, y, test_size=0.2, random_state=0,
                                                        stratify=y)
    x_train, y_train = shard(x_train, y_train, rank, size)

    keras.utils.set_random_seed(args.seed + rank)  # different init: the broadcast fixes it
    model = keras.Sequential([
        keras.Input((64,)),
        keras.layers.Dense(args.hidden, activation="relu"),
        keras.layers.Dropout(0.1),
        keras.layers.Dense(args.hidden // 2, activation="relu"),
        keras.layers.Dense(10),
    ])
    model.compile(optimizer=make_optimizer(args),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    bf.broadcast_variables(model.variables, root_rank=0)  # every rank starts from one model

    callbacks = []
    if args.straggler_ms > 0 and rank == straggler:
        callbacks.append(Straggler(args.straggler_ms / 1000.0))
    barrier("async_digits.start")
    start = time.time()
    model.fit(x_train, y_train, batch_size=args.batch_size, epochs=args.epochs,
              callbacks=callbacks, verbose=2 if rank == 0 else 0)
    trained = time.time() - start
    # The asynchronous optimizers let the fast ranks finish first: they wait here for the
    # straggler, whose last puts still go into their windows.
    barrier("async_digits.end")
    wall = time.time() - start

    _, accuracy = model.evaluate(x_test, y_test, verbose=0)
    rows = bf.allgather(tf.constant([[accuracy, trained]], tf.float64),
                        name="async_digits.results").numpy()
    if rank == 0:
        accuracies, times = rows[:, 0], rows[:, 1]
        slow = (f"rank {straggler} sleeps {args.straggler_ms:g} ms per batch"
                if args.straggler_ms > 0 else "no straggler")
        print(f"optimizer={args.optimizer} topology={args.topology} ranks={size} ({slow}) "
              f"train samples/rank={len(x_train)} epochs={args.epochs}")
        print(f"test accuracy rank 0: {accuracy:.4f}; over ranks: mean {accuracies.mean():.4f}, "
              f"min {accuracies.min():.4f}, max {accuracies.max():.4f}")
        print("training time per rank: " + ", ".join(f"{t:.1f}s" for t in times)
              + f"; wall time (until every rank finished): {wall:.1f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
