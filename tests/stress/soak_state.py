"""Soak of the stateful APIs: process sets, windows and elastic states cycled for a while, with
the process's memory, open files and threads checked at the end.

    mpirun -np 3 .venv/bin/python tests/stress/soak_state.py --seconds 300   # make soak
    mpirun -np 3 .venv/bin/python tests/stress/soak_state.py --seconds 40    # the test's run

One cycle, on every rank in step:

* registers a process set (a subset drawn from the shared seed), runs one allreduce on it (its
  members) and removes it;
* creates a window, puts into the out-neighbours, updates from the in-neighbours, frees it;
* commits an elastic TensorFlowState to memory and to a state folder on disk, changes the
  variable, restores it, runs the reset callbacks and syncs (what a rank does after a reset);

and checks every value against what numpy computes. The cycles of the first --warmup-fraction
of the time fill TensorFlow's and bluefog's bounded caches; then VmRSS (after gc and
malloc_trim, with one malloc arena as in stress_collectives.py), the number of open file
descriptors, of threads and of files in the state folder are taken, and again at the end. The
run fails (exit status 1) when a value is wrong, a call raises, memory grows by more than
--max-rss-growth-mb or --max-rss-growth-kb-per-cycle, or a descriptor, thread or file is left
over. Rank 0 prints "SOAK SUMMARY {json}"; --json writes it to a file.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time

from process_memory import limit_malloc_arenas, rss_kb

limit_malloc_arenas(1)  # before TensorFlow starts its threads (see stress_collectives.py)
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402 - after the allocator setting
import tensorflow as tf  # noqa: E402


def counts(folder: str) -> dict:
    return {"rss_kb": rss_kb(), "fds": len(os.listdir("/proc/self/fd")),
            "threads": len(os.listdir("/proc/self/task")),
            "state_files": len(os.listdir(folder)) if os.path.isdir(folder) else 0}


def cycle_set(bf, members, rank, cycle, value, check):
    ps = bf.add_process_set(members)
    if rank in members:
        out = bf.allreduce(value(rank, cycle), average=False, name="soak.set", process_set=ps)
        check("process-set allreduce", out, sum(value(r, cycle) for r in members))
    bf.remove_process_set(ps)


def cycle_window(bf, rank, cycle, value, check):
    bf.win_create(value(rank, cycle), "soak.win", zero_init=True)
    bf.win_put(value(rank, cycle), "soak.win",
               dst_weights={r: 0.5 for r in bf.out_neighbor_ranks()})
    bf.barrier()
    out = bf.win_update("soak.win", self_weight=1.0,
                        neighbor_weights={r: 1.0 for r in bf.in_neighbor_ranks()})
    check("window update", out, value(rank, cycle) + sum(
        0.5 * value(r, cycle) for r in bf.in_neighbor_ranks()))
    bf.barrier()
    bf.win_free("soak.win")


def cycle_elastic(state, variable, cycle, value, check, errors):
    variable.assign(value(0, cycle))
    state.cycle = cycle
    state.commit()
    variable.assign(np.full([64], -1.0, np.float32))
    state.restore()
    state.on_reset()
    state.sync()
    check("elastic restore", variable.numpy(), value(0, cycle))
    if state.cycle != cycle:
        errors.append(f"cycle {cycle}: elastic attribute {state.cycle} != {cycle}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description="soak of process sets, windows, elastic states")
    p.add_argument("--seconds", type=float, default=300.0)
    p.add_argument("--seed", type=int, default=5)
    p.add_argument("--warmup-fraction", type=float, default=0.25)
    p.add_argument("--max-rss-growth-mb", type=float, default=24.0)
    p.add_argument("--max-rss-growth-kb-per-cycle", type=float, default=4.0)
    p.add_argument("--parts", default="sets,windows,elastic",
                   help="which of the three to cycle (comma-separated), to find a leak's source")
    p.add_argument("--json", help="also write the summary to this file (rank 0)")
    args = p.parse_args(argv)
    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(2)
    import bluefog.tensorflow as bf
    from bluefog.tensorflow import elastic

    bf.init()
    rank, size = bf.rank(), bf.size()
    folder = bf.broadcast_object(
        tempfile.mkdtemp(prefix="bluefog-soak-") if rank == 0 else None, root_rank=0,
        name="soak.folder")
    os.environ["BLUEFOG_ELASTIC_STATE_DIR"] = folder
    parts = set(args.parts.split(","))
    rng = np.random.default_rng(args.seed)
    variable = tf.Variable(np.zeros([64], np.float32))
    resets = [0]
    state = elastic.TensorFlowState([variable], cycle=0)
    state.register_reset_callbacks([lambda: resets.__setitem__(0, resets[0] + 1)])
    errors = []

    def check(what, got, want):
        if not np.allclose(np.asarray(got, np.float64), np.asarray(want, np.float64)):
            errors.append(f"cycle {cycle}: {what}: got {np.asarray(got)[:4]}, want "
                          f"{np.asarray(want)[:4]}")

    def value(r, c):
        return np.full([64], r + 1 + (c % 7), np.float32)

    cycle, warm, start = 0, None, time.monotonic()
    end = start + args.seconds
    while True:
        # Every rank decides alike whether to go on: rank 0's clock.
        go = bf.broadcast_object(time.monotonic() < end if rank == 0 else None, root_rank=0,
                                 name="soak.go")
        if not go:
            break
        if warm is None and time.monotonic() - start >= args.warmup_fraction * args.seconds:
            warm = dict(counts(folder), cycle=cycle)
        members = sorted(int(r) for r in rng.choice(size, int(rng.integers(1, size + 1)),
                                                    replace=False))
        try:
            if "sets" in parts:
                cycle_set(bf, members, rank, cycle, value, check)
            if "windows" in parts:
                cycle_window(bf, rank, cycle, value, check)
            if "elastic" in parts:
                cycle_elastic(state, variable, cycle, value, check, errors)
        except Exception as e:  # every error is a failure of the soak
            errors.append(f"cycle {cycle}: {type(e).__name__}: {str(e)[:300]}")
            break
        cycle += 1

    final = counts(folder)
    warm = warm or dict(final, cycle=0)
    measured = max(cycle - warm["cycle"], 1)
    growth_kb = final["rss_kb"] - warm["rss_kb"]
    problems = list(errors)
    if growth_kb > args.max_rss_growth_mb * 1024:
        problems.append(f"RSS grew {growth_kb} KB after the warm-up")
    if growth_kb / measured > args.max_rss_growth_kb_per_cycle and cycle - warm["cycle"] >= 50:
        problems.append(f"RSS grew {growth_kb / measured:.1f} KB per cycle")
    for what in ("fds", "threads", "state_files"):
        if final[what] > warm[what]:
            problems.append(f"{what}: {warm[what]} after the warm-up, {final[what]} at the end")
    n_bad = int(bf.allreduce(tf.constant(len(problems)), average=False, name="soak.bad"))
    for problem in problems[:20]:
        print(f"SOAK rank {rank}: FAIL {problem}", file=sys.stderr, flush=True)
    summary = {"ok": n_bad == 0, "size": size, "seconds": args.seconds, "cycles": cycle,
               "resets": resets[0], "warm": warm, "final": final,
               "rss_growth_kb_per_cycle": round(growth_kb / measured, 2),
               "problems_all_ranks": n_bad}
    if rank == 0:
        print("SOAK SUMMARY " + json.dumps(summary), flush=True)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(summary, f)
    bf.barrier()
    if rank == 0:
        shutil.rmtree(folder, ignore_errors=True)
    return 0 if n_bad == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
