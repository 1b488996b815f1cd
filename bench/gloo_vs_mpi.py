"""Gloo vs MPI: bf.allreduce of 1-64 MiB float32 at 2 ranks on this host (`make bench-gloo`).

The driver launches the same worker alternately with `bfrun --gloo` and `mpirun` (--rounds
times each, interleaved, because these VMs drift by 2-4x within minutes), takes the median
per size over every call of every round, and prints a table with the ratio Gloo / MPI (above 1:
Gloo is slower). The worker (this file with --worker) times eager calls of one tensor per size
after warm-up; a call's time is the slower rank's.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SIZES_MIB = (1, 4, 16, 64)


def worker(calls: int) -> None:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import numpy as np
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(2)
    import bluefog.tensorflow as bf

    bf.init()
    out = {}
    for mib in SIZES_MIB:
        t = tf.constant(np.ones(mib * 262144, np.float32))
        name = f"bench_{mib}"
        for _ in range(2):
            bf.allreduce(t, average=False, name=name)
        times = []
        for _ in range(calls):
            bf.barrier()
            start = time.perf_counter()
            bf.allreduce(t, average=False, name=name)
            took = time.perf_counter() - start
            times.append(float(bf.allreduce(tf.constant([took]), op=bf.Max).numpy()[0]))
        out[mib] = times
    if bf.rank() == 0:
        print("RESULT " + json.dumps({"backend": bf.backend(), "times": out}), flush=True)


def launch(backend: str, calls: int) -> dict:
    py = sys.executable
    me = [py, os.path.abspath(__file__), "--worker", "--calls", str(calls)]
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    if backend == "gloo":
        cmd = [py, "-m", "bluefog.run", "--gloo", "-np", "2", *me]
    else:
        cmd = ["mpirun", "--oversubscribe", "--bind-to", "none", "-np", "2"]
        if os.geteuid() == 0:
            cmd.append("--allow-run-as-root")
        cmd += me
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env, cwd=REPO)
    for line in out.stdout.splitlines():
        if "RESULT " in line:
            return json.loads(line.split("RESULT ", 1)[1])
    raise SystemExit(f"{backend} run failed ({out.returncode}):\n{out.stdout[-3000:]}"
                     f"{out.stderr[-3000:]}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--calls", type=int, default=8, help="timed calls per size and launch")
    p.add_argument("--rounds", type=int, default=2, help="launches per backend, interleaved")
    args = p.parse_args()
    if args.worker:
        worker(args.calls)
        return
    times = {"gloo": {m: [] for m in SIZES_MIB}, "mpi": {m: [] for m in SIZES_MIB}}
    for r in range(args.rounds):
        for backend in (("gloo", "mpi") if r % 2 == 0 else ("mpi", "gloo")):
            res = launch(backend, args.calls)
            assert res["backend"] == backend, res["backend"]
            for mib, ts in res["times"].items():
                times[backend][int(mib)] += ts
    print(f"bf.allreduce, 2 ranks on one host, median of {args.rounds} x {args.calls} calls")
    print("| size | Gloo | MPI | Gloo / MPI |")
    print("|---|---|---|---|")
    for mib in SIZES_MIB:
        g = statistics.median(times["gloo"][mib])
        m = statistics.median(times["mpi"][mib])
        print(f"| {mib} MiB | {g * 1e3:.1f} ms | {m * 1e3:.1f} ms | {g / m:.2f} |")


if __name__ == "__main__":
    main()
