"""The straggler report against injected lateness, on MPI and on Gloo: does the runtime measure
how late a rank comes, name it, and name no one when no rank is late?

    .venv/bin/python bench/straggler_report.py [--backend mpi|gloo|both] [--seconds 6]
        [--launches 1] [--out FILE.json]

Each case is a job of 3 ranks running steps of a little compute (a 128x128 matmul) and a 64 KiB
allreduce for --seconds (every 50th step also a broadcast of whether to stop); rank 2 sleeps
DELAY before each allreduce. Rank 0 logs the straggler
every second (BLUEFOG_STRAGGLER_REPORT=1). The harness reads the output as it comes and notes
when rank 0 first named a rank (seconds after every rank was past init); at the end rank 0
prints bf.straggler_report(). Reported per case: the injected delay, rank 2's measured lag, the
largest lag of the others, the rank named (or none) and how soon. With --launches N every case
runs N times (launches interleaved), then a summary gives each case's worst launch: the lag
furthest from the delay, the others' largest lag, the latest naming, and whether any launch
named the wrong rank or (with a delay) no one.
"""
import argparse
import json
import os
import re
import subprocess
import sys
import textwrap
import threading
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "tests", "python"))
from gloo_jobs import free_port, gloo_env  # noqa: E402
from mpi_jobs import PYTHON, job_env, kill_tree, mpirun_prefix  # noqa: E402

_JOB = textwrap.dedent("""
    import json, sys, time
    import tensorflow as tf
    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    import bluefog.tensorflow as bf
    bf.init()
    r = bf.rank()
    delay, seconds = float(sys.argv[1]), float(sys.argv[2])
    w = tf.random.normal([128, 128])
    x = tf.ones([16384])
    bf.allreduce(x, name="warm")
    if r == 0:
        print("READY", flush=True)
    # Every rank runs the same number of steps: rank 0 decides when to stop.
    end = time.time() + seconds
    step = 0
    while True:
        tf.matmul(w, w)
        if r == 2 and delay > 0:
            time.sleep(delay)
        bf.allreduce(x, name="grad")
        step += 1
        if step % 50 == 0:  # rarely: the lag per op is then the delay per step
            stop = bf.broadcast(tf.constant([1 if time.time() > end else 0]), 0, name="stop")
            if int(stop.numpy()[0]):
                break
    if r == 0:
        print("REPORT " + json.dumps(bf.straggler_report()), flush=True)
    bf.shutdown()
    """)

NAMED = re.compile(r"\[bluefog rank 0\] WARNING: straggler: the other ranks wait for rank (\d+)")


def run_case(backend: str, delay: float, seconds: float, size: int = 3) -> dict:
    extra = {"BLUEFOG_STRAGGLER_REPORT": "1"}
    cmd = [PYTHON, "-c", _JOB, str(delay), str(seconds)]
    if backend == "mpi":
        procs = [subprocess.Popen(mpirun_prefix(size) + cmd, env=job_env(extra),
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                  start_new_session=True)]
    else:
        port = free_port()
        procs = [subprocess.Popen(cmd, env=gloo_env(r, size, port, extra),
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                  start_new_session=True) for r in range(size)]
    state = {"ready": None, "named": None, "named_rank": None, "report": None}
    lock = threading.Lock()

    def read(p):
        for line in p.stdout:
            now = time.time()
            with lock:
                if line.startswith("READY") and state["ready"] is None:
                    state["ready"] = now
                m = NAMED.search(line)
                if m and state["named"] is None:
                    state["named"] = now
                    state["named_rank"] = int(m.group(1))
                if line.startswith("REPORT "):
                    state["report"] = json.loads(line[len("REPORT "):])

    threads = [threading.Thread(target=read, args=(p,), daemon=True) for p in procs]
    for t in threads:
        t.start()
    deadline = time.time() + seconds + 120
    for p in procs:
        try:
            p.wait(timeout=max(1.0, deadline - time.time()))
        except subprocess.TimeoutExpired:
            kill_tree(p)
    for t in threads:
        t.join(timeout=5)
    report = state["report"] or {"ranks": [], "straggler": None}
    lags = [r["mean_lag_seconds"] for r in report["ranks"]]
    return {
        "backend": backend, "ranks": size, "delay_ms": delay * 1e3,
        "lag_ms": lags[2] * 1e3 if len(lags) > 2 else None,
        "others_max_lag_ms": max(lags[:2]) * 1e3 if len(lags) > 2 else None,
        "straggler": report.get("straggler"),
        "logged": state["named_rank"],
        "named_after_s": (state["named"] - state["ready"]
                          if state["named"] and state["ready"] else None),
        "ops": report.get("ops"),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--backend", choices=["mpi", "gloo", "both"], default="both")
    ap.add_argument("--seconds", type=float, default=6.0)
    ap.add_argument("--delays", default="0,0.002,0.005,0.02", help="seconds, comma separated")
    ap.add_argument("--launches", type=int, default=1, help="runs of every case, interleaved")
    ap.add_argument("--out", help="write the rows as JSON here")
    args = ap.parse_args()
    backends = ["mpi", "gloo"] if args.backend == "both" else [args.backend]
    delays = [float(d) for d in args.delays.split(",")]
    rows = []

    def f(v, fmt):
        return format(v, fmt) if v is not None else "-"

    print(f"{'launch':6} {'backend':8} {'delay ms':>8} {'lag ms':>8} {'others ms':>9} "
          f"{'named':>6} {'logged':>6} {'after s':>7} {'ops':>6}")
    for launch in range(args.launches):
        for delay in delays:
            for backend in backends:  # interleaved: each delay on both backends in turn
                row = dict(run_case(backend, delay, args.seconds), launch=launch)
                rows.append(row)
                print(f"{launch:6} {backend:8} {row['delay_ms']:8.1f} "
                      f"{f(row['lag_ms'], '8.2f')} {f(row['others_max_lag_ms'], '9.2f')} "
                      f"{f(row['straggler'], '>6')} {f(row['logged'], '>6')} "
                      f"{f(row['named_after_s'], '7.1f')} {f(row['ops'], '>6')}", flush=True)
    if args.launches > 1:
        print(f"\nworst of {args.launches} launches:")
        print(f"{'backend':8} {'delay ms':>8} {'lag ms':>8} {'others ms':>9} {'after s':>7} "
              "wrong")
        for delay in delays:
            for backend in backends:
                mine = [r for r in rows if r["backend"] == backend and r["delay_ms"] == delay * 1e3]
                lags = [r["lag_ms"] for r in mine if r["lag_ms"] is not None]
                lag = max(lags, key=lambda v: abs(v - delay * 1e3)) if lags else None
                others = max((r["others_max_lag_ms"] for r in mine
                              if r["others_max_lag_ms"] is not None), default=None)
                expect = 2 if delay > 0 else None
                wrong = sum(1 for r in mine if r["straggler"] != expect or r["logged"] != expect)
                afters = [r["named_after_s"] for r in mine if r["named_after_s"] is not None]
                print(f"{backend:8} {delay * 1e3:8.1f} {f(lag, '8.2f')} {f(others, '9.2f')} "
                      f"{f(max(afters) if afters else None, '7.1f')} {wrong}")
    if args.out:
        with open(args.out, "w") as fh:
            json.dump(rows, fh, indent=1)


if __name__ == "__main__":
    main()
