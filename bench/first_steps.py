"""A fresh process's first training steps against its steady state, with the one-host path
choices of earlier runs (BLUEFOG_CACHE_DIR) and without: how much of the start is the path
chooser learning (csrc/core/path_chooser.h, csrc/core/path_cache.h).

    .venv/bin/python bench/first_steps.py --launches 3

Each launch is a new job (mpirun -np RANKS) running a training step STEPS times and timing every
step (each step's time is its slowest rank's): by default (--model grads) the allreduces and
update of bench/fw_step.py's MLP (4 dense layers of 1024) with next to no compute, where the
path choice shows most; or one of fw_step.py's models (DistributedGradientTape, synthetic
batch); or, with --program cxx, bench/first_calls.cc: the MLP's gradients' allreduces from C++,
without TensorFlow's start-up in the way. Launches alternate: an empty cache directory (made new
for that launch), then a warm one (filled by one launch before the first). A launch reports the
mean of steps 1-60 (step 0 traces the function; reported apart) over the steady state, the mean
of steps 100-250, and how many calls its size classes spent learning their path (the
learning_calls count: the untimed start, the trials, and the rechecks and watches that time both
paths again) in steps 0-60 and in all. Prints one JSON line per launch, then the worst ratio of
each kind.
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)

FIRST = (1, 61)     # steps 1-60
STEADY = (100, 251)  # steps 100-250


def worker(args) -> None:
    import time

    import numpy as np
    import tensorflow as tf

    from fw_step import load, model_and_batch, step_maker

    hvd = load("bluefog")
    import keras

    from bluefog.common import basics

    me = hvd.rank()
    keras.utils.set_random_seed(me)
    model, shape = model_and_batch("mlp" if args.model == "grads" else args.model)
    if args.model == "grads":
        dist = grads_step(hvd, keras, model.trainable_variables)
    else:
        dist = step_maker(model, shape, me)(hvd.DistributedGradientTape)
    seconds, learning_first = [], 0
    for i in range(args.steps):
        if i == FIRST[1]:
            learning_first = basics._tuning("learning_calls")
        t0 = time.perf_counter()
        float(dist())
        seconds.append(time.perf_counter() - t0)
    learning = [float(learning_first), float(basics._tuning("learning_calls"))]
    mine = tf.constant(np.array(seconds + learning))
    every = hvd.allgather(tf.reshape(mine, [1, -1]), name="bench.steps").numpy()
    if me != 0:
        return
    step = every[:, :-2].max(axis=0)  # each step's slowest rank
    first = float(np.mean(step[FIRST[0]:FIRST[1]]))
    steady = float(np.mean(step[STEADY[0]:STEADY[1]]))
    print(json.dumps({"model": args.model, "ranks": hvd.size(), "step0_s": float(step[0]),
                      "first60_s": first, "steady_s": steady, "ratio": first / steady,
                      "median_ratio": float(np.median(step[FIRST[0]:FIRST[1]]) /
                                            np.median(step[STEADY[0]:STEADY[1]])),
                      "learning_calls_first60": int(every[:, -2].max()),
                      "learning_calls": int(every[:, -1].max())}), flush=True)


def grads_step(hvd, keras, variables):
    """A step that is nearly all communication: the gradients of a loss linear in `variables`
    (the MLP's: constant, so no compute to speak of) through DistributedGradientTape, and the
    SGD update."""
    import tensorflow as tf

    opt = keras.optimizers.SGD(1e-6)

    @tf.function
    def step():
        with tf.GradientTape() as tape:
            loss = tf.add_n([tf.reduce_sum(v) for v in variables])
        grads = hvd.DistributedGradientTape(tape).gradient(loss, variables)
        opt.apply_gradients(zip(grads, variables))
        return loss

    return step


def launch(args, cache_dir: str) -> dict:
    from run import ENV, MPIRUN

    env = dict(ENV, BLUEFOG_CACHE_DIR=cache_dir)
    env.pop("BLUEFOG_PATH_CACHE", None)
    env.pop("BLUEFOG_PATH_RELEARN", None)
    if args.program == "cxx":
        program = [os.path.join(args.build_dir, "first_calls_bench"), str(args.steps)]
    else:
        program = [sys.executable, os.path.abspath(__file__), "--worker", "--model", args.model,
                   "--steps", str(args.steps)]
    cmd = MPIRUN + ["-np", str(args.ranks)] + program
    load = os.getloadavg()[0]
    out = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=900)
    if out.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({out.returncode}):\n{out.stderr[-3000:]}")
    row = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")][-1]
    row["load"] = load
    return row


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--model", default="grads", choices=["grads", "mlp", "cnn", "resnet50"],
                   help="grads: the MLP's gradients with next to no compute; else "
                        "bench/fw_step.py's model")
    p.add_argument("--program", default="tf", choices=["tf", "cxx"],
                   help="cxx: bench/first_calls.cc, the same MLP gradients' allreduces "
                        "without TensorFlow (make bench builds it)")
    p.add_argument("--build-dir", default=os.path.join(ROOT, "build", "cpp"))
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--launches", type=int, default=3, help="launches of each kind")
    p.add_argument("--steps", type=int, default=STEADY[1])
    args = p.parse_args()
    if args.worker:
        worker(args)
        return
    base = tempfile.mkdtemp(prefix="bluefog-first-steps.")
    try:
        warm = os.path.join(base, "warm")
        launch(args, warm)  # fills it
        rows = {"empty": [], "warm": []}
        for i in range(args.launches):
            for kind in ("empty", "warm"):
                where = warm if kind == "warm" else os.path.join(base, f"empty{i}")
                row = dict(launch(args, where), cache=kind)
                rows[kind].append(row)
                print(json.dumps(row), flush=True)
        for kind, got in rows.items():
            worst = max(got, key=lambda r: r["ratio"])
            print(f"{kind} cache: first 60 steps / steady state, worst of {len(got)} launches "
                  f"{worst['ratio']:.3f} (median-based {worst['median_ratio']:.3f}); all "
                  f"{', '.join(format(r['ratio'], '.3f') for r in got)}; learning calls "
                  f"{', '.join(str(r.get('learning_calls_first60')) for r in got)} in steps 0-60, "
                  f"{', '.join(str(r['learning_calls']) for r in got)} in all")
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
