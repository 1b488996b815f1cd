"""Elastic training: scikit-learn's digits, surviving lost hosts and growing onto new ones.

    bfrun --min-np 2 --max-np 4 -H host1:2,host2:2 python examples/elastic_digits.py
    bfrun --min-np 1 --host-discovery-script ./hosts.sh python examples/elastic_digits.py
    bfrun --gloo -np 3 --min-np 2 -H localhost:3 python examples/elastic_digits.py  # in place
    bfrun -np 2 python examples/elastic_digits.py          # not elastic: runs like any job

A custom loop with DistributedGradientTape whose state (weights, optimizer slots, epoch, batch,
position in the epoch) is a ``bf.elastic.KerasState`` committed every ``--commit-every``
steps. When a host is lost, ``bfrun`` relaunches the job on the others and training carries on
from the last commit; when the discovery script reports a new host, the ranks stop at their
next commit and the job is relaunched with it. With ``--gloo`` nothing is relaunched: the
surviving processes re-form the job in place and restore the last commit from memory. Every
epoch visits each training sample once whatever the number of ranks: the position is counted
in samples, not in per-rank batches. At the end rank 0 prints the test accuracy, and the script
exits 1 if the ranks' weights differ.
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
    p.add_argument("--commit-every", type=int, default=10, help="steps between two commits")
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--step-sleep", type=float, default=0.0,
                   help="seconds to sleep after each step (tests: keeps the job running while "
                        "a new worker starts)")
    p.add_argument("--log-steps", action="store_true",
                   help="rank 0 prints a line per step and per commit (the elastic tests read "
                        "them)")
    return p.parse_args()


def main():
    args = parse_args()
    if args.log_steps:
        print(f"START rank {bf.rank()} size {bf.size()} pid {os.getpid()}", flush=True)
    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32)
    y = digits.target.astype(np.int64)
    x_train, x_test, y_train, y_test = train_test_split(x, y, test_size=0.2, random_state=0,
                                                        stratify=y)

    keras.utils.set_random_seed(args.seed + bf.rank())  # sync() gives every rank rank 0's
    model = keras.Sequential([
        keras.Input((64,)),
        keras.layers.Dense(128, activation="relu"),
        keras.layers.Dense(64, activation="relu"),
        keras.layers.Dense(10),
    ])
    optimizer = keras.optimizers.Adam(args.lr * bf.size())
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    @tf.function
    def train_step(xb, yb):
        with tf.GradientTape() as tape:
            loss = loss_fn(yb, model(xb, training=True))
        tape = bf.DistributedGradientTape(tape)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    # epoch: epochs finished; batch: steps done in this epoch; sample: samples of this epoch's
    # order consumed by those steps (all ranks together).
    state = bf.elastic.KerasState(model, optimizer, epoch=0, batch=0, sample=0)

    def rescale_learning_rate():
        # After a relaunch with another number of ranks: the effective batch changed.
        optimizer.learning_rate = args.lr * bf.size()
        if bf.rank() == 0:
            print(f"RESET launch {os.environ.get('BLUEFOG_ELASTIC_RESTART', '0')}: "
                  f"{bf.size()} ranks from epoch {state.epoch} batch {state.batch} "
                  f"(commit {state.commits}) pid {os.getpid()} t={time.time():.3f}", flush=True)

    state.register_reset_callbacks([rescale_learning_rate])
    launch = os.environ.get("BLUEFOG_ELASTIC_RESTART", "0")

    @bf.elastic.run
    def train(state):
        rank, size = bf.rank(), bf.size()
        step_samples = size * args.batch_size
        while state.epoch < args.epochs:
            order = np.random.default_rng(args.seed + state.epoch).permutation(len(x_train))
            while state.sample + step_samples <= len(order):
                start = state.sample + rank * args.batch_size
                idx = order[start:start + args.batch_size]
                train_step(x_train[idx], y_train[idx])
                if args.step_sleep:
                    time.sleep(args.step_sleep)
                if args.log_steps and rank == 0:
                    print(f"STEP launch {launch} epoch {state.epoch} batch {state.batch} "
                          f"size {size} t={time.time():.3f}", flush=True)
                state.batch += 1
                state.sample += step_samples
                if state.batch % args.commit_every == 0:
                    commit(state)
            state.epoch, state.batch, state.sample = state.epoch + 1, 0, 0
            commit(state)  # at most --commit-every steps between two commits

    def commit(state):
        try:
            state.commit()
        finally:  # also when commit() raises HostsUpdatedInterrupt: the state was saved
            if args.log_steps and bf.rank() == 0:
                print(f"COMMIT launch {launch} epoch {state.epoch} batch {state.batch}",
                      flush=True)

    start = time.time()
    train(state)
    elapsed = time.time() - start

    logits = model(x_test, training=False)
    accuracy = float(np.mean(np.argmax(logits, axis=1) == y_test))
    flat = np.concatenate([np.asarray(v).ravel() for v in model.trainable_variables])
    rows = bf.allgather(tf.constant(flat[None, :].astype(np.float64)),
                        name="elastic_digits.check").numpy()
    identical = bool(np.all(rows == rows[0]))
    if bf.rank() == 0:
        print(f"ranks={bf.size()} epochs={args.epochs} commits={state.commits} "
              f"time={elapsed:.1f}s test accuracy={accuracy:.4f}")
        print("weights identical on all ranks" if identical else
              "ERROR: weights differ between ranks")
    if args.log_steps:
        print(f"DONE rank {bf.rank()} size {bf.size()} pid {os.getpid()} "
              f"accuracy={accuracy:.4f}", flush=True)
    return 0 if identical else 1


if __name__ == "__main__":
    sys.exit(main())
