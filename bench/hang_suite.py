"""The hang doctor against ten injected hangs, on MPI and on Gloo: does every waiting rank print a
diagnosis naming the culprit, and what it is doing, within BLUEFOG_STALL_CHECK_TIME + 10 s?

    .venv/bin/python bench/hang_suite.py [--backend mpi|gloo|both] [--stall 2] [--out FILE.json]

Each case is a job of 3 ranks in which rank 2 is the culprit. The job prints READY once every
rank is past init; the harness reads every rank's output line by line as it comes, and stops
the job when each expected line has appeared (or READY + stall + 10 s passed). A case scores
when every expected pattern appeared in time; the time reported is READY to the last of them.
A rank that dies is not a hang but an error: that case scores when the survivors' error names
the dead rank (Gloo), or mpirun names it as it ends the job (MPI).
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

_PRELUDE = textwrap.dedent("""
    import os, signal, sys, time
    import tensorflow as tf
    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    import bluefog.tensorflow as bf
    bf.init()
    r = bf.rank()
    x = tf.ones([256])
    bf.allreduce(x, name="warm")
    if r == 0:
        print("READY", flush=True)
    """)

# name -> (what the ranks run, [patterns that must appear]); rank 2 is the culprit.
_NEVER = r"rank 2 never called {op}; it is in {doing}"
CASES = {
    "skips a collective": (
        "if r != 2: bf.allreduce(x, name='a')\ntime.sleep(60)",
        [r"\[bluefog rank {v}\] WARNING: hang doctor: allreduce 'a' has waited [\d.]+ s on rank "
         r"{v}\.\n  rank 2 never called allreduce 'a'; it is in no bluefog operation"]),
    "calls another collective": (
        "if r != 2: bf.allreduce(x, name='b')\nelse: bf.allgather(x, name='b2')",
        [r"on rank {v}\.\n  rank 2 never called allreduce 'b'; it is in allgather 'b2'"]),
    "submits in another order": (
        "names = ['c2', 'c1'] if r == 2 else ['c1', 'c2']\n"
        "for n in names: bf.allreduce(x, name=n)",
        [r"on rank {v}\.\n  rank 2 never called allreduce 'c1'; it is in allreduce 'c2'"]),
    "dies mid-allreduce": (
        "big = tf.ones([4 << 20])\n"
        "if r == 2:\n    h = bf.allreduce_nonblocking(big, name='d')\n    os._exit(1)\n"
        "bf.allreduce(big, name='d')\nbf.allreduce(x, name='d2')",
        ["DEAD"]),
    "holds a window mutex": (
        "bf.win_create(tf.zeros([4]), name='mw')\n"
        "if r == 2:\n    with bf.win_mutex('mw', ranks=[0]):\n        time.sleep(60)\n"
        "else:\n    time.sleep(1)\n    with bf.win_mutex('mw', ranks=[0]): pass",
        [r"win_mutex_acquire 'mw' has waited [\d.]+ s on rank {v}\.\n  rank 2 holds the mutex of "
         r"window 'mw' since"]),
    "a neighbour never calls the neighbour op": (
        "if r != 2: bf.neighbor_allreduce(x, name='n')\ntime.sleep(60)",
        [r"on rank {v}\.\n  rank 2 never called neighbor_allreduce 'n'; it is in no bluefog"]),
    "sleeps in Python": (
        "if r == 2: time.sleep(60)\nbf.allreduce(x, name='g')",
        [r"on rank {v}\.\n  rank 2 never called allreduce 'g'; it is in no bluefog operation"]),
    "a process set's member is elsewhere": (
        "ps = bf.add_process_set([0, 2])\n"
        "if r == 0: bf.allreduce(x, name='s', process_set=ps)\n"
        "else: bf.allreduce(x, name='h')",
        [r"allreduce 's' \(process set \d+\) has waited [\d.]+ s on rank 0\.\n  rank 2 never "
         r"called allreduce 's'; it is in allreduce 'h'"]),
    "stuck in tf.data": (
        "def slow(v):\n    time.sleep(60) if r == 2 else None\n    return v\n"
        "ds = tf.data.Dataset.range(3).map(lambda v: tf.py_function(slow, [v], tf.int64))\n"
        "for _ in ds: bf.allreduce(x, name='t')",
        [r"on rank {v}\.\n  rank 2 never called allreduce 't'; it is in no bluefog operation"]),
    "is stopped (SIGSTOP)": (
        "if r == 2: os.kill(os.getpid(), signal.SIGSTOP)\nbf.allreduce(x, name='z')",
        [r"allreduce 'z' has waited [\d.]+ s on rank {v}\.\n  rank 2 did not answer within"]),
}
_DEAD = {"mpi": r"(rank 2|\[\[\d+,\d+\],2\]|process rank 2)", "gloo": r"rank\(s\) 2 left the job"}


class Job:
    """The ranks' processes, with every line they print and when it came."""

    def __init__(self, backend: str, code: str, stall: float):
        self.lines, self.lock, self.procs = [], threading.Lock(), []
        extra = {"BLUEFOG_STALL_CHECK_TIME": str(stall), "BLUEFOG_GLOO_TIMEOUT": "60"}
        if backend == "mpi":
            cmds = [(mpirun_prefix(3) + [PYTHON, "-c", code], job_env(extra))]
        else:
            port = free_port()
            cmds = [([PYTHON, "-c", code], gloo_env(k, 3, port, extra)) for k in range(3)]
        for cmd, env in cmds:
            p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env,
                                 cwd=REPO, text=True, errors="replace")
            self.procs.append(p)
            threading.Thread(target=self._read, args=(p,), daemon=True).start()

    def _read(self, p):
        for line in p.stdout:
            with self.lock:
                self.lines.append((time.time(), line))

    def text_until(self, t=None):
        with self.lock:
            return "".join(line for at, line in self.lines if t is None or at <= t)

    def first(self, pattern):
        """When the output first matched `pattern` (None: not yet)."""
        with self.lock:
            lines = list(self.lines)
        text, ends = "", []
        for at, line in lines:
            text += line
            ends.append((len(text), at))
        m = re.search(pattern, text)
        if not m:
            return None
        return next(at for end, at in ends if end >= m.end())

    def stop(self):
        for p in self.procs:
            kill_tree(p)


def run_case(backend, name, stall, limit):
    body, expected = CASES[name]
    code = _PRELUDE + body + "\nbf.shutdown()\n"
    patterns = []
    for e in expected:
        if e == "DEAD":
            patterns.append(_DEAD[backend])
        else:
            patterns += [e.format(v=v) for v in (0, 1) if not (name.startswith("a process") and v)]
    job = Job(backend, code, stall)
    start = time.time()
    ready = None
    try:
        while time.time() - start < 240:
            ready = ready or job.first(r"READY")
            if ready and (all(job.first(p) for p in patterns) or time.time() > ready + limit + 2):
                break
            if all(p.poll() is not None for p in job.procs):
                time.sleep(0.5)  # the last lines
                break
            time.sleep(0.2)
        found = [job.first(p) for p in patterns]
    finally:
        job.stop()
    ok = ready is not None and all(f is not None and f - ready <= limit for f in found)
    latency = max(f - ready for f in found) if ready and all(found) else None
    return {"case": name, "backend": backend, "ok": ok,
            "seconds_after_ready": None if latency is None else round(latency, 1),
            "output_tail": None if ok else job.text_until()[-3000:]}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--backend", choices=["mpi", "gloo", "both"], default="both")
    ap.add_argument("--stall", type=float, default=2.0)
    ap.add_argument("--case", action="append", help="run only these (repeatable)")
    ap.add_argument("--out")
    args = ap.parse_args()
    print(subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip(), flush=True)
    backends = ["mpi", "gloo"] if args.backend == "both" else [args.backend]
    results = []
    for backend in backends:
        for name in args.case or CASES:
            res = run_case(backend, name, args.stall, args.stall + 10)
            results.append(res)
            mark = "ok  " if res["ok"] else "MISS"
            print(f"{backend:5} {mark} {res['seconds_after_ready']!s:>5} s  {name}", flush=True)
            if not res["ok"]:
                print(textwrap.indent(res["output_tail"] or "", "    | "), flush=True)
    for backend in backends:
        got = [r for r in results if r["backend"] == backend]
        print(f"{backend}: {sum(r['ok'] for r in got)}/{len(got)} diagnosed within stall + 10 s")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
