"""Starting Gloo jobs (no mpirun) from a plain pytest or the command line, with a hard timeout.

Each rank is a process of its own with MASTER_ADDR=127.0.0.1, a free MASTER_PORT, RANK and
WORLD_SIZE, and none of an MPI launcher's variables, as a scheduler without MPI starts them.
A job that outlives its timeout is ended with every rank's process tree.

    python tests/python/gloo_jobs.py -np 2 [--timeout S] -- command [args...]
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import tempfile
import time
from typing import Callable, Dict, List, Optional, Sequence

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from mpi_jobs import REPO, JobResult, job_env, kill_tree  # noqa: E402

_LAUNCHER_PREFIXES = ("OMPI_", "PMIX_", "PMI_", "OPAL_", "PRTE_")
_RENDEZVOUS = ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "TF_CONFIG")


def gloo_built() -> bool:
    """Whether the installed bluefog has the Gloo backend (tests without it skip)."""
    try:
        from bluefog.common.capabilities import gloo_built as built

        return built()
    except Exception:  # noqa: BLE001 - no built package: nothing to run
        return False


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def gloo_env(rank: int, size: int, port: int, extra: Optional[Dict[str, str]] = None,
             rendezvous: bool = True) -> Dict[str, str]:
    """The environment of one rank: job_env() without MPI launcher variables, plus the
    rendezvous (or, with rendezvous=False, without any of its variables)."""
    env = {k: v for k, v in job_env().items()
           if not k.startswith(_LAUNCHER_PREFIXES) and k not in _RENDEZVOUS}
    if rendezvous:
        env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                   WORLD_SIZE=str(size))
    env.setdefault("BLUEFOG_GLOO_TIMEOUT", "60")
    if extra:
        env.update(extra)
    return env


def no_mpi_launcher_env() -> Dict[str, str]:
    """job_env() for ``bluefog.run`` and the like: no MPI launcher's variables, one TF thread
    of each kind per rank, BLUEFOG_GLOO_TIMEOUT 60 s."""
    env = job_env({"BLUEFOG_GLOO_TIMEOUT": "60", "TF_NUM_INTRAOP_THREADS": "1",
                   "TF_NUM_INTEROP_THREADS": "1"})
    return {k: v for k, v in env.items() if not k.startswith(_LAUNCHER_PREFIXES)}


def run_gloo_job(cmd: Sequence[str], np_: int, timeout: float,
                 env: Optional[Dict[str, str]] = None, ranks: Optional[Sequence[int]] = None,
                 cwd: str = REPO,
                 rank_env: Optional[Callable[[int, int], Dict[str, str]]] = None) -> JobResult:
    """Runs `cmd` as ranks 0..np_-1 (or only `ranks` of them: the others never come).
    With `rank_env`, rank r's variables are rank_env(r, port) instead of the rendezvous.
    returncode is the worst rank's; output has every rank's, rank 0 first, each under a
    header."""
    port = free_port()
    started = time.time()
    procs: List[subprocess.Popen] = []
    logs = []
    for r in ranks if ranks is not None else range(np_):
        log = tempfile.TemporaryFile(mode="w+", errors="replace")
        logs.append((r, log))
        rank_vars = gloo_env(r, np_, port, env, rendezvous=rank_env is None)
        if rank_env is not None:
            rank_vars.update(rank_env(r, port))
        procs.append(subprocess.Popen(list(cmd), stdout=log, stderr=subprocess.STDOUT,
                                      env=rank_vars, cwd=cwd))
    deadline = started + timeout
    timed_out = False
    for p in procs:
        try:
            p.wait(timeout=max(0.1, deadline - time.time()))
        except subprocess.TimeoutExpired:
            timed_out = True
            break
    if timed_out:
        for p in procs:
            kill_tree(p)
    codes = [p.wait() for p in procs]
    output = []
    for (r, log), code in zip(logs, codes):
        log.seek(0)
        output.append(f"==== rank {r} of {np_} (exit {code}) ====\n{log.read()}")
        log.close()
    worst = max(codes, key=lambda c: (c != 0, abs(c)))
    return JobResult(worst, "\n".join(output), started, time.time(), timed_out)


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-np", type=int, required=True)
    parser.add_argument("--timeout", type=float, default=900)
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    cmd = args.command[1:] if args.command[:1] == ["--"] else args.command
    result = run_gloo_job(cmd, args.np, args.timeout)
    print(result.output)
    if result.timed_out:
        print(f"gloo_jobs: timed out after {args.timeout} s; every rank was ended")
        return 124
    return result.returncode


if __name__ == "__main__":
    sys.exit(main())
