"""One rank of a push-sum gossip job on fault-tolerant windows, for test_ft_windows.py and
bench/ft_gossip.py (started by gloo_jobs.run_gloo_job, one process per rank).

    ft_windows_job.py OUT_DIR STEPS [--kill R@S | --stop R@S] [--allreduce-at S] [--plain]
                      [--sleep SECONDS]

Each step: win_accumulate of x (push-sum weights on) to every out-neighbour, shares
1/(out-degree+1), require_mutex; then win_update_then_collect. With --kill R@S, rank R takes
its own window's mutex at step S, collects what it holds, writes that mass and the time to
OUT_DIR/dead.json and SIGKILLs itself (holding the mutex, so nothing lands after its snapshot).
With --stop R@S, rank R SIGSTOPs itself at step S and the lowest other rank SIGKILLs it once
the others finished. With --allreduce-at S, rank 0 calls bf.allreduce at step S (after the
kill: it fails) and writes the error to OUT_DIR/allreduce.txt, then goes on. The ranks left
wait for each other through files (no collective: one would fail on the dead rank), collect a
last time and write OUT_DIR/rank<r>.json: their mass, push-sum weight and step times.
--plain runs without fault tolerance (the bench's baseline).
"""

import argparse
import json
import os
import signal
import sys
import time

os.environ.setdefault("TF_NUM_INTEROP_THREADS", "1")
os.environ.setdefault("TF_NUM_INTRAOP_THREADS", "1")

import tensorflow as tf  # noqa: E402

import bluefog.tensorflow as bf  # noqa: E402


def _at(text):
    r, s = text.split("@")
    return int(r), int(s)


def _write(path, data):
    with open(path + ".tmp", "w") as f:
        json.dump(data, f)
    os.replace(path + ".tmp", path)


def _wait_files(paths, timeout):
    until = time.time() + timeout
    while not all(os.path.exists(p) for p in paths):
        if time.time() > until:
            raise TimeoutError(f"waited {timeout} s for {paths}")
        time.sleep(0.01)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("steps", type=int)
    parser.add_argument("--kill", type=_at)
    parser.add_argument("--stop", type=_at)
    parser.add_argument("--plain", action="store_true")
    parser.add_argument("--allreduce-at", type=int, default=-1)
    parser.add_argument("--sleep", type=float, default=0.0)
    args = parser.parse_args()

    bf.init(fault_tolerant=not args.plain)
    rank, size = bf.rank(), bf.size()
    x = tf.Variable(tf.fill([4], tf.constant(rank + 1.0, tf.float64)))
    name = "ft_x"
    bf.win_create(x, name, zero_init=True)
    bf.turn_on_win_ops_with_associated_p()
    outs = bf.out_neighbor_ranks()
    share = 1.0 / (len(outs) + 1)
    failed = args.kill or args.stop
    times = []
    for step in range(args.steps):
        if args.kill and args.kill == (rank, step):
            with bf.win_mutex(name, for_self=True):
                held = bf.win_update(name, 1.0, {r: 1.0 for r in bf.in_neighbor_ranks()},
                                     reset=True)
                _write(os.path.join(args.out, "dead.json"),
                       {"rank": rank, "mass": float(tf.reduce_sum(held)),
                        "p": bf.win_associated_p(name), "time": time.time()})
                os.kill(os.getpid(), signal.SIGKILL)
        if args.stop and args.stop == (rank, step):
            _write(os.path.join(args.out, "stopped.json"),
                   {"rank": rank, "pid": os.getpid(), "time": time.time()})
            os.kill(os.getpid(), signal.SIGSTOP)
        if rank == 0 and step == args.allreduce_at:
            try:
                bf.allreduce(tf.constant(1.0))
                error = "no error"
            except Exception as e:  # noqa: BLE001 - the failure is the point
                error = f"{type(e).__name__}: {e}"
            with open(os.path.join(args.out, "allreduce.txt"), "w") as f:
                f.write(error)
        start = time.time()
        bf.win_accumulate(x, name, self_weight=share, dst_weights={r: share for r in outs},
                          require_mutex=True)
        bf.win_update_then_collect(name)
        times.append((start, time.time()))
        if args.sleep:
            time.sleep(args.sleep)
    left = [r for r in range(size) if not failed or r != failed[0]]
    _write(os.path.join(args.out, f"done{rank}"), {})
    _wait_files([os.path.join(args.out, f"done{r}") for r in left], 60)
    held = bf.win_update_then_collect(name)
    _write(os.path.join(args.out, f"rank{rank}.json"),
           {"rank": rank, "mass": float(tf.reduce_sum(held)), "p": bf.win_associated_p(name),
            "times": times})
    if args.stop and rank == left[0]:
        _wait_files([os.path.join(args.out, f"rank{r}.json") for r in left], 60)
        with open(os.path.join(args.out, "stopped.json")) as f:
            os.kill(json.load(f)["pid"], signal.SIGKILL)
    sys.stdout.flush()


if __name__ == "__main__":
    main()
