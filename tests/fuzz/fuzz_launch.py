"""The launch fuzzer: random launch configurations at 2-3 processes must each end in a clear
error on every process or a correct job; never a hang, never a silently wrong job.

    python tests/fuzz/fuzz_launch.py [--cases 500] [--seed S] [--modes env,tf_config,bfrun,mpirun]
                                     [--only I,J] [--verbose]

The cases (tests/fuzz/fuzz_launch_cases.py) set torchrun's variables, TF_CONFIG,
``BLUEFOG_*``/``HOROVOD_*`` settings and bfrun's options. Every process runs
tests/fuzz/launch_worker.py (``bf.init()`` and one allreduce through the C++ core, without
TensorFlow), which prints ``LAUNCH OK ...`` or ``LAUNCH ERROR ...``. Each case is judged:

* ``ok``: every process joined the job it was configured for (rank and size as its variables
  say, where they say it plainly) and the allreduce of rank + 1 came out size(size+1)/2;
* ``clear``: the processes that did not finish so ended with a clear error (bluefog's or the
  launcher's message, naming what to change), and no process joined a wrong job;
* ``hang``: the case outlived its timeout (its processes are killed);
* ``wrong``: a process reported another rank or size than configured, or a wrong sum;
* ``unclear``: a process failed without a clear message (a bare Python exception, a crash by
  a signal, a traceback), or ended with status 0 without its verdict line.

The last three fail the run. Prints the seed first, every failing case with what it set, and
a one-line JSON summary; ``--only`` reruns cases of the same seed. Exit status 1 on failures.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import time
from typing import Dict, List, Optional, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.join(os.path.dirname(HERE), "python")]

from fuzz_launch_cases import Case, make_case  # noqa: E402

from mpi_jobs import REPO, descendants, job_env  # noqa: E402

PYTHON = sys.executable
WORKER = os.path.join("tests", "fuzz", "launch_worker.py")
MODES = ["env", "env", "env", "tf_config", "tf_config", "bfrun", "bfrun", "mpirun"]
_LAUNCHER = ("OMPI_", "PMIX_", "PMI_", "OPAL_", "PRTE_", "HOROVOD_", "BLUEFOG_")
_RENDEZVOUS = ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK",
               "LOCAL_WORLD_SIZE", "TF_CONFIG")
_OK = re.compile(r"LAUNCH OK rank (-?\d+) size (-?\d+) local \S+ sum ([\d.e+]+) good (\d)")
_ERROR = re.compile(r"LAUNCH ERROR (\w+): (.*)")
# Exception types that are bluefog's or a launcher's own answers; anything else escaping to the
# program (KeyError, AttributeError, ...) is an internal failure, not an explanation.
_CLEAR_TYPES = {"BluefogError", "ValueError", "RuntimeError", "BluefogInternalError",
                "AbortedError", "InternalError", "FailedPreconditionError",
                "InvalidArgumentError"}
# A clear message says what is wrong with what: a rank, a variable, an option, the job.
_NAMES = re.compile(r"rank|RANK|WORLD_SIZE|MASTER_|TF_CONFIG|BLUEFOG_|HOROVOD_|LOCAL_|bfrun|"
                    r"mpirun|--|job|Gloo|MPI")


def base_env() -> Dict[str, str]:
    """The test environment without any launcher's, rendezvous or bluefog variables; every
    case's Gloo timeout is 3 s unless it sets its own, so that a rank that never comes makes
    the others fail within the case's time."""
    env = {k: v for k, v in job_env().items()
           if not k.startswith(_LAUNCHER) and k not in _RENDEZVOUS}
    env["BLUEFOG_GLOO_TIMEOUT"] = "3"
    return env


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _end(proc: subprocess.Popen) -> None:
    """SIGKILL to a case's process and everything under it (its own session)."""
    for pid in [proc.pid] + descendants(proc.pid):
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except OSError:
        pass


def run_processes(commands: List[Tuple[List[str], Dict[str, str]]], timeout: float
                  ) -> Tuple[bool, List[Tuple[int, str]]]:
    """Starts every command at once; returns whether the case timed out and each process's
    (exit status, output)."""
    procs, logs = [], []
    for cmd, env in commands:
        log = tempfile.TemporaryFile(mode="w+", errors="replace")
        logs.append(log)
        procs.append(subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env,
                                      cwd=REPO, start_new_session=True))
    deadline = time.time() + timeout
    timed_out = False
    for p in procs:
        try:
            p.wait(timeout=max(0.1, deadline - time.time()))
        except subprocess.TimeoutExpired:
            timed_out = True
            break
    for p in procs:
        _end(p) if timed_out or p.poll() is None else None
    results = []
    for p, log in zip(procs, logs):
        code = p.wait()
        log.seek(0)
        results.append((code, log.read()))
        log.close()
    return timed_out, results


def commands(case: Case) -> List[Tuple[List[str], Dict[str, str]]]:
    base = base_env()
    if case.mode in ("env", "tf_config"):
        return [([PYTHON, WORKER], {**base, **env}) for env in case.envs]
    gloo = ["--gloo"] if case.mode == "bfrun" else []
    cmd = [PYTHON, "-m", "bluefog.run", *gloo, *case.args, PYTHON, WORKER]
    return [(cmd, {**base, **case.envs[0]})]


def _clear(kind: str, message: str) -> bool:
    return kind in _CLEAR_TYPES and len(message) >= 30 and bool(_NAMES.search(message))


def _launcher_error(out: str) -> Optional[str]:
    """bfrun's or argparse's own line refusing the launch, if any."""
    for line in out.splitlines():
        if re.match(r"(bfrun: |usage: |bfrun\.py: error|__main__\.py: error|.*: error: )", line):
            if "error" in line or line.startswith("bfrun: "):
                return line
    if "mpirun" in out and ("not enough slots" in out or "exited on signal" not in out):
        box = re.search(r"^(mpirun|Primary job|A request|There are not enough).*$", out, re.M)
        if box:
            return box.group(0)
    return None


def judge(case: Case, timed_out: bool, results: List[Tuple[int, str]]) -> Tuple[str, str]:
    """The case's verdict (ok, clear, hang, wrong, unclear) and what it rests on."""
    if timed_out:
        tails = " || ".join(out.strip().splitlines()[-1][:200] if out.strip() else "(no output)"
                            for _, out in results)
        return "hang", f"no end within {case.timeout:g} s; last lines: {tails}"
    oks: List[Tuple[int, int, float, bool, Optional[Tuple[int, int]]]] = []
    problems: List[str] = []
    errors = 0
    first_error = ""
    for i, (code, out) in enumerate(results):
        expected = case.expected[i] if case.expected and i < len(case.expected) else None
        found_ok = [tuple(m) for m in _OK.findall(out)]
        found_err = _ERROR.findall(out)
        for rank, size, total, good in found_ok:
            oks.append((int(rank), int(size), float(total), good == "1", expected))
        for kind, message in found_err:
            errors += 1
            first_error = first_error or f"{kind}: {message[:200]}"
            if not _clear(kind, message):
                problems.append(f"process {i}: unclear {kind}: {message[:300]}")
        if code < 0:
            problems.append(f"process {i}: killed by signal {-code}: "
                            f"{out.strip()[-300:]}")
        elif code == 0 and not found_ok and case.mode in ("env", "tf_config"):
            problems.append(f"process {i}: exit 0 without a verdict: {out.strip()[-300:]}")
        elif code != 0 and not found_err and case.mode in ("env", "tf_config"):
            problems.append(f"process {i}: exit {code} without a clear error: "
                            f"{out.strip()[-300:]}")
    wrong = []
    for rank, size, total, good, expected in oks:
        if not good or total != size * (size + 1) / 2:
            wrong.append(f"rank {rank} of {size}: sum {total:g}, expected {size * (size + 1) // 2}")
        if expected is not None and (size != expected[1] or
                                     expected[0] is not None and rank != expected[0]):
            wrong.append(f"rank {rank} of {size}, configured as rank {expected[0]} of "
                         f"{expected[1]}")
    if case.mode in ("bfrun", "mpirun"):
        code, out = results[0]
        ranks = sorted(r for r, s, *_ in oks)
        if code == 0:
            sizes = {s for _, s, *_ in oks}
            if not oks or len(sizes) != 1 or ranks != list(range(sizes.pop())):
                wrong.append(f"bfrun exited 0 with ranks {ranks} reporting {len(oks)} OK lines")
        elif errors == 0 and _launcher_error(out) is None:
            problems.append(f"bfrun exit {code} without a clear error: {out.strip()[-400:]}")
        elif code > 128 and errors == 0:
            problems.append(f"bfrun ended by signal {code - 128}: {out.strip()[-300:]}")
    if wrong:
        return "wrong", "; ".join(wrong)
    if problems:
        return "unclear", " | ".join(problems)
    if case.mode in ("env", "tf_config") and len(oks) == len(results):
        return "ok", f"{len(oks)} processes"
    if case.mode in ("bfrun", "mpirun") and results[0][0] == 0:
        return "ok", f"{len(oks)} ranks"
    said = first_error or _launcher_error(results[0][1]) or ""
    return "clear", (f"{errors} clear error(s), {len(oks)} process(es) in a correct job; "
                     f"{said[:200]}")


def run_case(case: Case) -> Tuple[str, str]:
    timed_out, results = run_processes(commands(case), case.timeout)
    return judge(case, timed_out, results)


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", type=int, default=500)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--modes", default=",".join(sorted(set(MODES))))
    parser.add_argument("--only", default="", help="comma-separated case numbers to run")
    parser.add_argument("--verbose", action="store_true", help="print every case's verdict")
    args = parser.parse_args(argv)
    seed = args.seed if args.seed is not None else random.randrange(1 << 31)
    modes = [m for m in MODES if m in args.modes.split(",")]
    only = {int(i) for i in args.only.split(",") if i.strip()}
    print(f"FUZZ LAUNCH seed {seed}: {args.cases} cases, modes {sorted(set(modes))} "
          f"(rerun one: --seed {seed} --only N)", flush=True)
    rng = random.Random(seed)
    counts: Dict[str, int] = {}
    failures: List[str] = []
    started = time.time()
    for index in range(args.cases):
        case = make_case(index, rng, free_port(), modes)
        if only and index not in only:
            continue
        t0 = time.time()
        verdict, detail = run_case(case)
        counts[verdict] = counts.get(verdict, 0) + 1
        line = f"{case.describe()} -> {verdict.upper()} ({time.time() - t0:.1f} s): {detail}"
        if verdict in ("hang", "wrong", "unclear"):
            failures.append(line)
            print(f"FUZZ LAUNCH FAIL {line}", flush=True)
        elif args.verbose:
            print(f"FUZZ LAUNCH {line}", flush=True)
    summary = {"seed": seed, "cases": sum(counts.values()), "wall_s": round(time.time() - started),
               **{k: counts.get(k, 0) for k in ("ok", "clear", "hang", "wrong", "unclear")}}
    print("FUZZ LAUNCH SUMMARY " + json.dumps(summary), flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
