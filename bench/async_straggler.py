"""Time to accuracy with one slow rank: asynchronous window training vs allreduce.

    python bench/async_straggler.py                      # 4 ranks, 2 rounds
    python bench/async_straggler.py --rounds 3 --methods allreduce neighbor winput pushsum

Launches ``mpirun`` once per run and runs itself as the worker on every rank: Keras
``model.fit`` on scikit-learn's 8x8 digits (each rank its own shard, as in
``examples/async_digits.py``), an MLP 64-512-256-10 (``--hidden``: big enough that a step's
compute, not Keras' per-step overhead, sets the step time), Adam, the exponential graph. The
data is one endless shuffled stream with ``steps_per_epoch`` (a fresh tf.data pipeline per epoch
costs more than the epoch's steps here), and one warm-up step (tracing, window creation) runs
before the clock starts. Methods:

* ``allreduce``: ``bf.DistributedOptimizer`` (gradients averaged over all ranks, synchronous);
* ``neighbor``: ``bf.DistributedNeighborAllreduceOptimizer`` (synchronous neighbour mixing);
* ``winput``: ``bf.DistributedWinPutOptimizer`` (asynchronous: puts over windows);
* ``pushsum``: ``bf.DistributedPushSumOptimizer`` (asynchronous push-sum);
* ``hierarchical``: ``bf.DistributedAdaptThenCombineOptimizer`` with
  ``hierarchical_neighbor_allreduce`` and the inner/outer machine schedule (the setup
  docs/decentralized.md recommends across hosts; ``bench/tta_hosts.py`` times it there).

First a reference run: ``allreduce`` with no straggler. Its median step time (per batch,
epochs after the first, on the rank that will straggle) is the normal step time ``s``; in the
runs that follow the last rank sleeps ``(factor - 1) * s`` after every batch (``--factor 3``:
its steps take 3x). The methods then run with that straggler in rounds (``ref, allreduce,
neighbor, winput, ...`` again and again: the machine is shared and noisy, so a slow spell
hits every method alike), the reference (no straggler) again in every round.

Accuracy is measured at every epoch end by each rank on its own model (the test set, outside
the timed training: the evaluation's time is subtracted from the rank's clock). Reported per run,
for rank 0's model (a fast rank; with the asynchronous methods the ranks' models differ):

* ``time_to_target``: training seconds until rank 0's test accuracy first reaches the target,
  the reference runs' median final accuracy minus ``--margin`` (1 pp);
* ``final_acc``: rank 0's final accuracy (``final_acc_mean``/``min``: over all ranks, measured
  after a barrier once every rank finished).

Prints one JSON line per run (``RUN {...}``), then a table with, per method, the median
time-to-target and the ratio ``allreduce with straggler / method`` (per round and of the medians).

``pushsum``: once the fast ranks have finished, the straggler keeps pushing shares of its weight
``p`` out and nothing comes back, so ``p`` shrinks by ``1/(d+1)`` per step and the float32
numerator underflows: the straggler's final model is garbage (``final_acc_min`` 0.1), though
rank 0's is fine.
"""

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import time

HERE = os.path.abspath(__file__)
METHODS = ("allreduce", "neighbor", "winput", "pushsum", "hierarchical")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ranks", type=int, default=4)
    p.add_argument("--methods", nargs="+", choices=METHODS,
                   default=["allreduce", "neighbor", "winput"])
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--factor", type=float, default=3.0,
                   help="the straggler's step takes this many normal steps")
    p.add_argument("--epochs", type=int, default=30)
    p.add_argument("--batch-size", type=int, default=32, help="per rank")
    p.add_argument("--lr", type=float, default=0.002)
    p.add_argument("--hidden", type=int, default=512, help="width of the first hidden layer")
    p.add_argument("--margin", type=float, default=0.01, help="target: reference final - this")
    p.add_argument("--python", default=sys.executable)
    p.add_argument("--mpirun", default="mpirun")
    p.add_argument("--timeout", type=float, default=600, help="seconds per run")
    p.add_argument("--json", default="", help="also append the JSON lines to this file")
    # Worker only.
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--method", default="allreduce", help=argparse.SUPPRESS)
    p.add_argument("--straggler-ms", type=float, default=0.0, help=argparse.SUPPRESS)
    p.add_argument("--seed", type=int, default=42, help=argparse.SUPPRESS)
    return p.parse_args(argv)


# ------------------------------------------------------------------------------------------
# Worker: runs on every rank under mpirun
# ------------------------------------------------------------------------------------------

def worker(args) -> None:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import numpy as np
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(2)
    import keras
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    import bluefog.tensorflow as bf
    from bluefog.common import topology_util

    bf.init()
    rank, size = bf.rank(), bf.size()
    straggler = size - 1
    bf.set_topology(topology_util.ExponentialGraph(size))

    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32)
    y = digits.target.astype(np.int64)
    x_train, x_test, y_train, y_test = train_test_split(x, y, test_size=0.2, random_state=0,
                                                        stratify=y)
    # Equal shards of whole batches: every rank runs the same steps, and no partial batch
    # makes Keras trace the train step a second time inside the timed part.
    n = len(x_train) // size // args.batch_size * args.batch_size
    x_train, y_train = x_train[rank * n:(rank + 1) * n], y_train[rank * n:(rank + 1) * n]

    keras.utils.set_random_seed(args.seed + rank)
    model = keras.Sequential([
        keras.Input((64,)),
        keras.layers.Dense(args.hidden, activation="relu"),
        keras.layers.Dropout(0.1),
        keras.layers.Dense(max(args.hidden // 2, 10), activation="relu"),
        keras.layers.Dense(10),
    ])
    adam = keras.optimizers.Adam(args.lr)
    optimizer = {
        "allreduce": lambda: bf.DistributedOptimizer(adam),
        "neighbor": lambda: bf.DistributedNeighborAllreduceOptimizer(adam),
        "winput": lambda: bf.DistributedWinPutOptimizer(adam),
        "pushsum": lambda: bf.DistributedPushSumOptimizer(adam),
        "hierarchical": lambda: bf.DistributedAdaptThenCombineOptimizer(
            adam, communication_type="hierarchical_neighbor_allreduce",
            schedule=topology_util.GetInnerOuterExp2DynamicSendRecvMachineRanks(
                size, bf.local_size(), rank, bf.local_rank())),
    }[args.method]()
    model.compile(optimizer=optimizer,
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    bf.broadcast_variables(model.variables, root_rank=0)

    forward = tf.function(lambda inputs: model(inputs, training=False))
    x_test_t = tf.constant(x_test)

    def accuracy() -> float:
        return float(np.mean(np.argmax(forward(x_test_t).numpy(), axis=1) == y_test))

    accuracy()  # trace outside the timed part
    # One endless shuffled stream of whole batches: with steps_per_epoch Keras keeps one iterator
    # for the whole fit, instead of building a new tf.data pipeline every epoch (that costs more
    # than the epoch's steps on a busy 2-core machine, and no straggler would matter).
    steps_per_epoch = n // args.batch_size
    data = (tf.data.Dataset.from_tensor_slices((x_train, y_train))
            .shuffle(n, seed=args.seed + rank, reshuffle_each_iteration=True).repeat()
            .batch(args.batch_size, drop_remainder=True))
    # One warm-up step on every rank: traces the train step and creates the windows (collective,
    # a few seconds) before the clock starts; model.fit below reuses the traced step.
    model.fit(data, epochs=1, steps_per_epoch=1, verbose=0)

    class Clock(keras.callbacks.Callback):
        """Training time (evaluation excluded), accuracy at every epoch end, batch times."""

        def __init__(self):
            super().__init__()
            self.start = 0.0
            self.excluded = 0.0
            self.curve = []  # (training seconds, accuracy) per epoch
            self.batch_times = []  # (epoch, seconds) per batch, the straggler's sleep included
            self.epoch = 0
            self.last = 0.0

        def now(self) -> float:
            return time.perf_counter() - self.start - self.excluded

        def on_epoch_begin(self, epoch, logs=None):
            self.epoch = epoch
            self.last = time.perf_counter()

        def on_train_batch_end(self, batch, logs=None):
            if rank == straggler and args.straggler_ms > 0:
                time.sleep(args.straggler_ms / 1000.0)
            t = time.perf_counter()
            self.batch_times.append((self.epoch, t - self.last))
            self.last = t

        def on_epoch_end(self, epoch, logs=None):
            trained = self.now()
            t0 = time.perf_counter()
            acc = accuracy()
            self.excluded += time.perf_counter() - t0
            self.curve.append((trained, acc))

    clock = Clock()
    bf.allreduce(tf.constant(0.0), name="bench.start").numpy()
    clock.start = time.perf_counter()
    wall0 = time.perf_counter()
    model.fit(data, epochs=args.epochs, steps_per_epoch=steps_per_epoch, callbacks=[clock],
              verbose=0)
    trained = clock.now()
    # Fast ranks wait for the straggler here (its last puts still reach their windows).
    bf.allreduce(tf.constant(0.0), name="bench.end").numpy()
    wall = time.perf_counter() - wall0

    steps = [s for e, s in clock.batch_times if e > 0] or [s for _, s in clock.batch_times]
    mine = np.array([[accuracy(), trained, float(np.median(steps)), float(np.mean(steps))]
                     + [v for point in clock.curve for v in point]], np.float64)
    rows = bf.allgather(tf.constant(mine), name="bench.results").numpy()
    if rank == 0:
        result = {
            "method": args.method, "ranks": size, "straggler_rank": straggler,
            "straggler_ms": args.straggler_ms, "epochs": args.epochs, "hidden": args.hidden,
            "final_acc": rows[0, 0], "final_acc_mean": float(rows[:, 0].mean()),
            "final_acc_min": float(rows[:, 0].min()), "final_acc_max": float(rows[:, 0].max()),
            "train_s_per_rank": [round(float(t), 3) for t in rows[:, 1]],
            "step_ms_median_per_rank": [round(float(s) * 1e3, 2) for s in rows[:, 2]],
            "step_ms_mean_per_rank": [round(float(s) * 1e3, 2) for s in rows[:, 3]],
            "wall_s": wall,
            "curve_rank0": [[round(float(rows[0, k]), 3), float(rows[0, k + 1])]
                            for k in range(4, rows.shape[1], 2)],
            "curve_straggler": [[round(float(rows[straggler, k]), 3),
                                 float(rows[straggler, k + 1])]
                                for k in range(4, rows.shape[1], 2)],
        }
        print("RESULT " + json.dumps(result), flush=True)


# ------------------------------------------------------------------------------------------
# Driver
# ------------------------------------------------------------------------------------------

def run_one(args, method: str, straggler_ms: float) -> dict:
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               TF_CPP_MIN_LOG_LEVEL="2")
    env.update(getattr(args, "extra_env", {}))  # bench/tta_hosts.py: the pretend hosts
    cmd = [args.mpirun, "--allow-run-as-root", "--oversubscribe", "--bind-to", "none",
           "-np", str(args.ranks), *getattr(args, "mpirun_extra", []), args.python, HERE,
           "--worker", "--method", method,
           "--straggler-ms", f"{straggler_ms:.3f}", "--epochs", str(args.epochs),
           "--batch-size", str(args.batch_size), "--lr", str(args.lr),
           "--hidden", str(args.hidden)]
    print("$ " + " ".join(shlex.quote(c) for c in cmd), file=sys.stderr, flush=True)
    start = time.time()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.timeout)
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            result = json.loads(line[len("RESULT "):])
            print(f"  {method} straggler {straggler_ms:.1f} ms: final acc "
                  f"{result['final_acc']:.4f}, rank 0 trained {result['train_s_per_rank'][0]:.1f}"
                  f" s ({time.time() - start:.0f} s with start-up)", file=sys.stderr, flush=True)
            return result
    tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-30:])
    raise RuntimeError(f"{method}: no result (exit {proc.returncode}):\n{tail}")


def time_to(curve, target):
    for t, acc in curve:
        if acc >= target:
            return t
    return None


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.worker:
        worker(args)
        return 0
    runs = []

    def record(result, round_, label):
        result["round"], result["label"] = round_, label
        runs.append(result)

    ref = run_one(args, "allreduce", 0.0)
    record(ref, 0, "reference")
    normal_ms = ref["step_ms_median_per_rank"][ref["straggler_rank"]]
    sleep_ms = (args.factor - 1.0) * normal_ms
    print(f"normal step {normal_ms:.1f} ms: the straggler sleeps {sleep_ms:.1f} ms per batch",
          file=sys.stderr, flush=True)
    for r in range(1, args.rounds + 1):
        if r > 1:
            record(run_one(args, "allreduce", 0.0), r, "reference")
        for method in args.methods:
            record(run_one(args, method, sleep_ms), r, method)

    refs = [x for x in runs if x["label"] == "reference"]
    reference_acc = statistics.median(x["final_acc"] for x in refs)
    target = reference_acc - args.margin
    out = open(args.json, "a") if args.json else None
    for x in runs:
        x["target"] = target
        x["time_to_target"] = time_to(x["curve_rank0"], target)
        x["straggler_time_to_target"] = time_to(x["curve_straggler"], target)
        line = json.dumps(x)
        print("RUN " + line)
        if out:
            out.write(line + "\n")
    if out:
        out.close()

    def fmt(v, spec=".1f"):
        return "-" if v is None else format(v, spec)

    print(f"\nranks={args.ranks} epochs={args.epochs} hidden={args.hidden} normal step "
          f"{normal_ms:.1f} ms, straggler (rank {ref['straggler_rank']}) sleeps {sleep_ms:.1f} ms"
          f"/batch; target = reference median final acc {reference_acc:.4f} - "
          f"{args.margin * 100:g} pp = {target:.4f} (rank 0's model)")
    labels = ["reference"] + list(args.methods)
    head = (f"{'method':<22} {'time-to-target s (per round)':<30} {'median':>7} "
            f"{'final acc r0':>13} {'mean/min':>13} {'allreduce/this':>15}")
    print(head)
    print("-" * len(head))
    base = [x for x in runs if x["label"] == "allreduce"]
    base_med = (statistics.median([x["time_to_target"] for x in base])
                if base and all(x["time_to_target"] is not None for x in base) else None)
    for label in labels:
        sel = [x for x in runs if x["label"] == label]
        times = [x["time_to_target"] for x in sel]
        med = statistics.median(times) if times and None not in times else None
        per_round = ",".join(fmt(t) for t in times)
        accs = ",".join(f"{x['final_acc']:.3f}" for x in sel)
        mm = ",".join(f"{x['final_acc_mean']:.3f}/{x['final_acc_min']:.3f}" for x in sel)
        ratio = "-"
        if label != "reference" and base_med is not None and med:
            per = []
            for x in sel:
                b = [y for y in base if y["round"] == x["round"]]
                if b and x["time_to_target"] and b[0]["time_to_target"] is not None:
                    per.append(f"{b[0]['time_to_target'] / x['time_to_target']:.2f}")
            ratio = f"{base_med / med:.2f} ({','.join(per)})"
        name = label + (" (no straggler)" if label == "reference" else "")
        print(f"{name:<22} {per_round:<30} {fmt(med):>7} {accs:>13} {mm:>13} {ratio:>15}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
