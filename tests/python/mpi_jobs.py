"""Starting multi-rank jobs from a plain pytest (not itself under mpirun), with a hard timeout.

A job that outlives its timeout is ended with its whole process tree (mpirun and every rank it
started, found through /proc), so a hang fails the test instead of blocking it or leaving
orphaned ranks behind.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from typing import Dict, List, Optional, Sequence

# bfrun's tag on a rank's output line (horovodrun's): "[1,RANK]<stdout>:" from mpirun's
# --tag-output, "[RANK]<stdout>:" with --gloo; optional, for patterns anchored at a line start.
TAG = r"(?:\[(?:\d+,)?\d+\]<std(?:out|err)>:)?"

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PYTHON = sys.executable


def have_mpirun() -> bool:
    return shutil.which("mpirun") is not None


def netns_skip_reason() -> Optional[str]:
    """Why tests with network-namespace hosts cannot run here (None when they can)."""
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return "needs root to create network namespaces (ip netns); run the tests as root"
    for tool in ("ip", "unshare"):
        if shutil.which(tool) is None:
            return f"the {tool} command is not installed"
    if not have_mpirun():
        return "mpirun not installed"
    probe = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True)
    if probe.returncode != 0:
        return f"ip netns is not usable here: {probe.stderr.strip()}"
    return None


def bfrun_available() -> bool:
    return os.path.isfile(os.path.join(REPO, "bluefog", "run", "bfrun.py"))


def mpirun_prefix(np_: int, launcher: str = "mpirun", extra: Sequence[str] = ()) -> List[str]:
    """The launcher command for np_ ranks: Open MPI's mpirun or bluefog's bfrun."""
    if launcher == "bfrun":
        cmd = [PYTHON, "-m", "bluefog.run", "-np", str(np_)]
        if extra:
            cmd += ["--mpi-args=" + " ".join(extra)]
        return cmd
    cmd = ["mpirun", "--oversubscribe", "--bind-to", "none", "-np", str(np_)]
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        cmd.append("--allow-run-as-root")
    return cmd + list(extra)


def job_env(extra: Optional[Dict[str, str]] = None) -> Dict[str, str]:
    env = dict(os.environ)
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    env["PYTHONUNBUFFERED"] = "1"
    env.setdefault("OMPI_MCA_rmaps_base_oversubscribe", "1")
    # Each job learns the one-host paths afresh, whatever earlier runs on this machine chose.
    env.setdefault("BLUEFOG_PATH_CACHE", "0")
    # The ranks import bluefog from this checkout (the compiled libraries are found through
    # sys.path, i.e. the installed package).
    env["PYTHONPATH"] = REPO + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    if extra:
        env.update(extra)
    return env


@dataclasses.dataclass
class JobResult:
    returncode: int
    output: str  # stdout and stderr, interleaved
    started: float  # time.time() at start
    ended: float  # time.time() when the launcher and all its output had ended
    timed_out: bool

    @property
    def wall(self) -> float:
        return self.ended - self.started

    def tail(self, n: int = 6000) -> str:
        return self.output[-n:]


def descendants(pid: int) -> List[int]:
    children: Dict[int, List[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def kill_tree(proc: subprocess.Popen) -> None:
    """SIGTERM to the launcher (mpirun then ends its ranks), then SIGKILL to what is left."""
    victims = descendants(proc.pid)
    try:
        proc.terminate()
        proc.wait(timeout=10)
    except (subprocess.TimeoutExpired, OSError):
        pass
    for pid in [proc.pid] + victims + descendants(proc.pid):
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pass


def run_job(cmd: Sequence[str], timeout: float, env: Optional[Dict[str, str]] = None,
            cwd: str = REPO) -> JobResult:
    started = time.time()
    proc = subprocess.Popen(list(cmd), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            env=job_env(env), cwd=cwd, text=True, errors="replace")
    timed_out = False
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        timed_out = True
        kill_tree(proc)
        out, _ = proc.communicate()
    return JobResult(proc.returncode, out or "", started, time.time(), timed_out)


def alive(pid: int) -> bool:
    """Whether pid is a process that has not exited (a zombie counts as exited)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


class BackgroundJob:
    """A launcher in a session of its own (as a terminal's foreground job: a signal to its
    process group reaches what a Ctrl-C would), its output read as it comes."""

    def __init__(self, cmd: Sequence[str], env: Optional[Dict[str, str]] = None,
                 cwd: str = REPO):
        self.proc = subprocess.Popen(list(cmd), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     env=job_env(env), cwd=cwd, text=True, errors="replace",
                                     start_new_session=True)
        self.started = time.time()
        self.lines: List[str] = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append(line)

    @property
    def output(self) -> str:
        return "".join(self.lines)

    def wait_for(self, pattern: str, timeout: float):
        deadline = time.time() + timeout
        while time.time() < deadline:
            found = re.search(pattern, self.output, re.M)
            if found:
                return found
            if self.proc.poll() is not None:
                break
            time.sleep(0.05)
        raise AssertionError(f"never saw {pattern!r}:\n{self.output[-6000:]}")

    def finish(self, timeout: float) -> str:
        """Waits for the launcher to end; returns the whole output. A hang fails the test
        with the output, after killing the job."""
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"the job did not finish in {timeout} s:\n"
                                 f"{self.output[-6000:]}") from None
        self.reader.join(timeout=10)
        return self.output

    def wait_gone(self, pids: Sequence[int], timeout: float) -> List[int]:
        """Waits until none of pids is alive; returns those still alive after timeout."""
        deadline = time.time() + timeout
        while time.time() < deadline and any(alive(p) for p in pids):
            time.sleep(0.1)
        return [p for p in pids if alive(p)]

    def kill(self, pids: Sequence[int] = ()) -> None:
        """SIGKILL to the launcher's tree and to pids (what a test leaves behind)."""
        for pid in [self.proc.pid, *descendants(self.proc.pid), *pids]:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        self.reader.join(timeout=10)


def discovery_script(tmp_path, first: str):
    """A host discovery script printing a hosts file's lines (``first`` at the start); returns
    (the hosts file, the script): write the file to change the hosts."""
    hosts = tmp_path / "hosts.txt"
    hosts.write_text(first + "\n")
    script = tmp_path / "discover.sh"
    # Shell builtins only: some tests run bfrun with a PATH cut down to a few tools.
    script.write_text(f"#!/bin/sh\nwhile IFS= read -r line; do echo \"$line\"; done < {hosts}\n")
    script.chmod(0o755)
    return hosts, script
