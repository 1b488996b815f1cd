"""Decentralized Keras training on N processes: scikit-learn's bundled 8x8 digits.

    bfrun -np 4 python examples/decentralized_digits.py                       # neighbour mixing
    bfrun -np 4 python examples/decentralized_digits.py --optimizer allreduce # baseline
    bfrun -np 8 -H a:4,b:4 python examples/decentralized_digits.py \
        --optimizer hierarchical --schedule inner_outer   # across hosts (docs/decentralized.md)

Each rank trains on its own shard of the training set. With the default
``--optimizer neighbor`` no rank ever sees the global average: after every local step a rank
replaces its weights by the weighted mean of its own and its in-neighbours' weights over the
virtual topology (``--topology``: bluefog's default, the exponential graph on one host, each
rank talking to log2(N) others). ``--optimizer hierarchical`` averages within each host and
then between hosts' means (``hierarchical_neighbor_allreduce``); ``--schedule`` makes either
send to one peer (machine) per step: ``one_peer`` (the one-peer exponential graph), or
``inner_outer`` (hierarchical only: a step within the hosts, then a step between them).
``--optimizer allreduce`` is the data-parallel baseline: gradients are averaged over all ranks
(``bf.DistributedOptimizer``), so every rank holds the same model.

At the end rank 0 prints its own test accuracy, the mean and range of the ranks' test
accuracies, and how far the ranks' weights are from each other (0 for the baseline).
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
    "default": lambda size: None,  # bf.set_topology()'s default (machine-aware across hosts)
    "exponential": topology_util.ExponentialGraph,
    "ring": topology_util.RingGraph,
    "symmetric_exponential": topology_util.SymmetricExponentialGraph,
    "mesh": topology_util.MeshGrid2DGraph,
    "star": topology_util.StarGraph,
    "fully_connected": topology_util.FullyConnectedGraph,
}


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--optimizer", choices=["neighbor", "hierarchical", "allreduce"],
                   default="neighbor",
                   help="neighbor: DistributedAdaptThenCombineOptimizer; hierarchical: "
                        "DistributedAdaptThenCombineOptimizer over hierarchical_neighbor_allreduce;"
                        " allreduce: gradient averaging over all ranks (baseline)")
    p.add_argument("--topology", choices=sorted(TOPOLOGIES), default="default")
    p.add_argument("--schedule", choices=["static", "one_peer", "inner_outer"], default="static")
    p.add_argument("--num-steps-per-communication", type=int, default=1)
    p.add_argument("--epochs", type=int, default=30)
    p.add_argument("--batch-size", type=int, default=32, help="per rank")
    p.add_argument("--lr", type=float, default=0.002)
    p.add_argument("--seed", type=int, default=42)
    return p.parse_args()


def shard(x, y, rank, size):
    """Rank's shard; equal lengths, so every rank runs the same number of steps."""
    n = len(x) // size
    return x[rank * n:(rank + 1) * n], y[rank * n:(rank + 1) * n]


def make_schedule(args):
    if args.schedule == "static":
        return None
    if args.optimizer == "neighbor":
        if args.schedule != "one_peer":
            raise SystemExit("--schedule inner_outer goes with --optimizer hierarchical")
        return topology_util.GetDynamicOnePeerSendRecvRanks(bf.load_topology(), bf.rank())
    machines = (topology_util.GetExp2DynamicSendRecvMachineRanks if args.schedule == "one_peer"
                else topology_util.GetInnerOuterExp2DynamicSendRecvMachineRanks)
    return machines(bf.size(), bf.local_size(), bf.rank(), bf.local_rank())


def make_optimizer(args):
    adam = keras.optimizers.Adam(args.lr)
    if args.optimizer in ("neighbor", "hierarchical"):
        return bf.DistributedAdaptThenCombineOptimizer(
            adam, communication_type=("neighbor_allreduce" if args.optimizer == "neighbor"
                                      else "hierarchical_neighbor_allreduce"),
            num_steps_per_communication=args.num_steps_per_communication,
            schedule=make_schedule(args))
    if hasattr(bf, "DistributedOptimizer"):
        return bf.DistributedOptimizer(adam)
    # Without gradient averaging: average the weights after every local step instead.
    return bf.DistributedAdaptThenCombineOptimizer(adam, communication_type="allreduce")


def weight_spread(model) -> float:
    """Largest distance of any rank's weights from the ranks' mean weights."""
    flat = np.concatenate([w.ravel() for w in model.get_weights()]).astype(np.float64)
    rows = bf.allgather(tf.constant(flat[None, :]), name="decentralized_digits.weights").numpy()
    return float(np.max(np.abs(rows - rows.mean(axis=0))))


def main():
    args = parse_args()
    rank, size = bf.rank(), bf.size()
    bf.set_topology(TOPOLOGIES[args.topology](size))  # None: the default

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
    model.compile(optimizer=make_optimizer(args),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    bf.broadcast_variables(model.variables, root_rank=0)  # every rank starts from one model

    start = time.time()
    model.fit(x_train, y_train, batch_size=args.batch_size, epochs=args.epochs,
              verbose=2 if rank == 0 else 0)
    elapsed = time.time() - start

    _, accuracy = model.evaluate(x_test, y_test, verbose=0)
    accuracies = bf.allgather(tf.constant([accuracy], tf.float64),
                              name="decentralized_digits.accuracy").numpy()
    spread = weight_spread(model)
    if rank == 0:
        label = (f"{args.optimizer} ({args.topology}, schedule {args.schedule}, every "
                 f"{args.num_steps_per_communication} step(s))"
                 if args.optimizer != "allreduce" else "allreduce")
        print(f"optimizer={label} ranks={size} train samples/rank={len(x_train)} "
              f"epochs={args.epochs} time={elapsed:.1f}s")
        print(f"test accuracy rank 0: {accuracy:.4f}; over ranks: mean {accuracies.mean():.4f}, "
              f"min {accuracies.min():.4f}, max {accuracies.max():.4f}; "
              f"largest weight distance from the ranks' mean: {spread:.2e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
