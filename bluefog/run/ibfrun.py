"""``ibfrun``: an interactive bluefog cluster, for Jupyter and IPython (ipyparallel).

    ibfrun start -np 4                    # a controller and 4 engines, each engine a rank
    ibfrun start -np 8 -H a:4,b:4         # engines on two hosts (mpirun over ssh)
    ibfrun start -np 4 --gloo             # engines started by bfrun --gloo, no mpirun
    ibfrun stop

``start`` runs ipyparallel's controller, then ``bfrun`` with one engine per rank
(bluefog/run/ibfrun_engine.py), waits until every engine has registered (engine id = rank),
prints how to connect, and returns; the cluster runs in the background until ``stop``. A client
(``ipp.Client(profile="bluefog")``) then runs ``%%px`` cells on every engine, where
``bf.init()`` forms the job. The processes and their logs belong to the IPython profile
(``~/.ipython/profile_<name>``, or under ``$IPYTHONDIR``); the state file there
(``pid/ibfrun.json``) records the processes, so one profile holds at most one cluster.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from typing import Dict, List, Optional, Sequence

from bluefog.run import elastic_hosts, gloo_launch, horovod_flags

DEFAULT_PROFILE = "bluefog"
INSTALL_HINT = "ibfrun runs its cluster with ipyparallel: pip install ipyparallel"
_PROFILE_NAME = re.compile(r"^[A-Za-z0-9_.\-]+$")
_CLIENT_FILE = "ipcontroller-client.json"
_ENGINE_FILE = "ipcontroller-engine.json"
# Seconds between a SIGTERM and the SIGKILL that follows when a process is still there.
GRACE_S = 5.0


class IbfrunError(RuntimeError):
    """What ibfrun reports (on stderr, exit status 1) instead of a traceback."""


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="ibfrun",
        description="Start or stop an interactive bluefog cluster: an ipyparallel controller "
                    "and N engines, each engine one rank of a bluefog job, for %px cells in "
                    "Jupyter or IPython.",
        epilog="Example: ibfrun start -np 4; then in Jupyter: import ipyparallel as ipp; "
               "rc = ipp.Client(profile='bluefog')")
    p.add_argument("-v", "--version", action="store_true", help="print bluefog's version")
    sub = p.add_subparsers(dest="action", metavar="{start,stop}")
    start = sub.add_parser("start", help="start a cluster and wait until every engine is up")
    stop = sub.add_parser("stop", help="stop the cluster of a profile")
    for q in (start, stop):
        q.add_argument("--profile", "--ipython-profile", dest="profile", default=DEFAULT_PROFILE,
                       help=f"IPython profile that holds the cluster (default {DEFAULT_PROFILE}; "
                            "clients connect with ipp.Client(profile=NAME))")
    start.add_argument("-np", "-n", "--num-proc", dest="np", type=int, required=True,
                       help="number of engines (ranks)")
    start.add_argument("-H", "--hosts", dest="hosts",
                       help="comma-separated hosts with slot counts, e.g. host1:4,host2:4 "
                            "(default: this machine)")
    start.add_argument("-hostfile", "--hostfile", dest="hostfile",
                       help="Open MPI hostfile: one 'host slots=N' per line")
    start.add_argument("--gloo", action="store_true",
                       help="start the engines with bfrun --gloo (Gloo backend, no mpirun)")
    start.add_argument("-x", dest="env", action="append", default=[], metavar="NAME[=VALUE]",
                       help="also forward this environment variable to the engines (repeatable)")
    start.add_argument("--mpi-args", "--extra-mpi-flags", dest="mpi_args", default="",
                       help="extra arguments for mpirun, as one quoted string")
    start.add_argument("--timeout", type=float, default=120.0,
                       help="seconds to wait for the controller and every engine (default 120)")
    start.add_argument("--verbose", action="store_true",
                       help="print the commands that start the controller and the engines")
    stop.add_argument("--timeout", type=float, default=15.0,
                      help="seconds the engines get to exit after SIGTERM before they are "
                           "killed (default 15)")
    return p


# ----------------------------------------------------------------------------------------------
# The profile and its state file


class Profile:
    """An IPython profile's folders, and ibfrun's state file in it."""

    def __init__(self, name: str):
        if not _PROFILE_NAME.match(name):
            raise IbfrunError(f"--profile {name!r}: use letters, digits, '_', '.' and '-' only")
        from IPython.core.profiledir import ProfileDir
        from IPython.paths import get_ipython_dir

        self.name = name
        pd = ProfileDir.create_profile_dir_by_name(get_ipython_dir(), name)
        self.location = pd.location
        self.security_dir = pd.security_dir
        self.log_dir = pd.log_dir
        self.state_file = os.path.join(pd.pid_dir, "ibfrun.json")

    def path(self, name: str) -> str:
        return os.path.join(self.security_dir, name)

    def read_state(self) -> Optional[dict]:
        try:
            with open(self.state_file, encoding="utf-8") as f:
                return json.load(f)
        except FileNotFoundError:
            return None
        except (OSError, ValueError):
            return {}  # unreadable: treated as a cluster whose processes are gone

    def write_state(self, state: dict) -> None:
        tmp = self.state_file + ".tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(state, f, indent=1)
        os.replace(tmp, self.state_file)

    def clear(self) -> None:
        for path in (self.state_file, self.path(_CLIENT_FILE), self.path(_ENGINE_FILE)):
            try:
                os.remove(path)
            except FileNotFoundError:
                pass


def _alive(pid: Optional[int], marker: str) -> bool:
    """Whether `pid` runs and its command line holds `marker` (a recycled pid does not)."""
    if not pid:
        return False
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8", errors="replace") as f:
            if f.read().rsplit(")", 1)[-1].split()[0] == "Z":
                return False
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return marker.encode() in f.read()
    except (OSError, IndexError):
        pass
    if not os.path.isdir("/proc"):  # no procfs: only whether the pid exists
        try:
            os.kill(pid, 0)
            return True
        except OSError:
            return False
    return False


def _processes(state: dict) -> List[tuple]:
    """(what, pid, marker) of the cluster's processes recorded in `state`."""
    # "controller": ibfrun_controller's command line, or ipyparallel.controller's (a cluster
    # that an earlier ibfrun started).
    out = [("controller", state.get("controller"), "controller"),
           ("engines' launcher", state.get("launcher"), "ibfrun_engine")]
    for rank, pid in enumerate(state.get("engine_pids") or []):
        out.append((f"engine {rank}", pid, "ibfrun_engine"))
    # ipyparallel's nanny of each engine (it exits soon after its engine).
    for rank, pid in enumerate(state.get("nanny_pids") or []):
        out.append((f"engine {rank}'s nanny", pid, "ipyparallel.engine.nanny"))
    return out


def _running(state: Optional[dict]) -> List[tuple]:
    return [p for p in _processes(state or {}) if _alive(p[1], p[2])]


def _signal_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except OSError:
        try:
            os.kill(pid, sig)
        except OSError:
            pass


def _wait_gone(procs: Sequence[tuple], seconds: float) -> List[tuple]:
    deadline = time.monotonic() + seconds
    left = [p for p in procs if _alive(p[1], p[2])]
    while left and time.monotonic() < deadline:
        time.sleep(0.1)
        left = [p for p in left if _alive(p[1], p[2])]
    return left


def _tail(path: str, lines: int = 15) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.read().rstrip().splitlines()[-lines:]
    except OSError:
        return ""
    return "\n".join("    " + line for line in text)


# ----------------------------------------------------------------------------------------------
# start


def _needs_remote_controller(args: argparse.Namespace) -> bool:
    """Whether an engine may run on another host (then the controller listens on this host's
    address, instead of on localhost only)."""
    hosts: List[str] = []
    if args.hosts:
        hosts = [h for h, _ in elastic_hosts.parse_host_spec(args.hosts)]
    if args.hostfile:
        with open(args.hostfile, encoding="utf-8") as f:
            hosts = [line.split()[0] for line in f if line.split() and
                     not line.lstrip().startswith("#")]
    return any(not gloo_launch.is_local(h) for h in hosts)


def _engines_command(args: argparse.Namespace, profile: Profile) -> List[str]:
    cmd = [sys.executable, "-m", "bluefog.run", "-np", str(args.np)]
    if args.hosts:
        cmd += ["-H", args.hosts]
    if args.hostfile:
        cmd += ["--hostfile", args.hostfile]
    if args.gloo:
        cmd.append("--gloo")
    for item in args.env:
        cmd += ["-x", item]
    if args.mpi_args:
        cmd += ["--mpi-args", args.mpi_args]
    # The rank's own Python, so that the engines import the same bluefog and TensorFlow.
    return cmd + ["--", sys.executable, "-m", "bluefog.run.ibfrun_engine",
                  f"--profile={profile.name}"]


def _read_json(path: str, deadline: float, proc: subprocess.Popen, log: str) -> dict:
    while True:
        if os.path.exists(path):
            try:
                with open(path, encoding="utf-8") as f:
                    return json.load(f)
            except ValueError:
                pass  # being written
        if proc.poll() is not None:
            raise IbfrunError(f"the ipyparallel controller exited with status {proc.returncode} "
                              f"before writing {path}; its log ({log}):\n{_tail(log)}")
        if time.monotonic() > deadline:
            raise IbfrunError(f"the ipyparallel controller did not write {path} within the "
                              f"--timeout; its log ({log}):\n{_tail(log)}")
        time.sleep(0.1)


def _spawn(cmd: List[str], log: str, env: Dict[str, str]) -> subprocess.Popen:
    """A process in a session of its own (it outlives ibfrun and no terminal signals it),
    writing to `log`. What it creates is its owner's alone (umask 077): the controller's
    connection files hold the key that lets a client run code on every engine."""
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with open(fd, "wb") as out:
        return subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out,
                                stderr=subprocess.STDOUT, env=env, start_new_session=True,
                                umask=0o077)


def _private(path: str) -> None:
    """Makes `path` (a connection file) readable by its owner only, if it is not already."""
    if os.stat(path).st_mode & 0o077:
        os.chmod(path, 0o600)


def _wait_for_engines(client, n: int, deadline: float, launcher: subprocess.Popen,
                      log: str) -> None:
    while True:
        ids = set(client.ids)
        if len(ids) >= n:
            return
        if launcher.poll() is not None:
            raise IbfrunError(
                f"the engines' job ended (exit status {launcher.returncode}) with "
                f"{len(ids)} of {n} engines registered; missing ranks "
                f"{sorted(set(range(n)) - ids)}; its log ({log}):\n{_tail(log)}")
        if time.monotonic() > deadline:
            raise IbfrunError(
                f"{len(ids)} of {n} engines registered within the --timeout; missing ranks "
                f"{sorted(set(range(n)) - ids)}; the engines' log ({log}):\n{_tail(log)}")
        try:
            client.wait_for_engines(n, timeout=0.5, interactive=False)
        except TimeoutError:
            pass


def _engine_pids() -> tuple:
    """Run on an engine: its pid and its nanny's (None without a nanny)."""
    import os

    from ipyparallel.engine.app import IPEngine

    nanny = getattr(IPEngine.instance(), "nanny_pipe", None)
    return os.getpid(), getattr(nanny, "pid", None)


def start(args: argparse.Namespace) -> int:
    if args.np < 1:
        raise IbfrunError(f"-np must be >= 1, got {args.np}")
    if args.hostfile and not os.path.isfile(args.hostfile):
        raise IbfrunError(f"hostfile {args.hostfile!r} does not exist")
    if args.gloo and args.hostfile:
        raise IbfrunError("--gloo takes hosts with -H host1:slots,host2:slots, not --hostfile")
    try:
        import ipyparallel
    except ImportError as e:
        raise IbfrunError(f"{INSTALL_HINT} ({e})") from None
    if not args.gloo and shutil.which("mpirun") is None:
        raise IbfrunError("mpirun was not found on PATH: install Open MPI (e.g. `sudo apt-get "
                          "install openmpi-bin`), or start the engines with --gloo")
    try:
        remote = _needs_remote_controller(args)
    except (ValueError, OSError) as e:
        raise IbfrunError(str(e)) from None

    profile = Profile(args.profile)
    state = profile.read_state()
    running = _running(state)
    if running:
        what = ", ".join(f"{w} (pid {pid})" for w, pid, _ in running)
        raise IbfrunError(
            f"a cluster of profile {profile.name!r} is already running ({state.get('np', '?')} "
            f"engines, started {state.get('started', '?')}: {what}). Connect to it with "
            f"ipp.Client(profile={profile.name!r}), stop it with `ibfrun stop --profile "
            f"{profile.name}`, or start another one with a different --profile.")
    profile.clear()  # a cluster that ended without `ibfrun stop` left its files

    env = dict(os.environ, PYTHONUNBUFFERED="1")
    deadline = time.monotonic() + args.timeout
    controller_log = os.path.join(profile.log_dir, "ibfrun-controller.log")
    engines_log = os.path.join(profile.log_dir, "ibfrun-engines.log")
    controller_cmd = [sys.executable, "-m", "bluefog.run.ibfrun_controller",
                      f"--profile-dir={profile.location}"]
    if remote:
        # Engines on other hosts reach the controller at this host's address; the key of its
        # connection files authenticates every message (HMAC-SHA-256), the key never sent.
        controller_cmd.append(f"--ip={gloo_launch.listen_address() or '*'}")
    if args.verbose:
        print("ibfrun: " + shlex.join(controller_cmd), file=sys.stderr, flush=True)
    controller = _spawn(controller_cmd, controller_log, env)
    state = {"profile": profile.name, "np": args.np, "controller": controller.pid,
             "launcher": None, "engine_pids": [], "backend": "gloo" if args.gloo else "mpi",
             "hosts": args.hosts or args.hostfile or "localhost",
             "started": datetime.datetime.now().isoformat(timespec="seconds")}
    profile.write_state(state)
    client = None
    try:
        engine_info = _read_json(profile.path(_ENGINE_FILE), deadline, controller, controller_log)
        _read_json(profile.path(_CLIENT_FILE), deadline, controller, controller_log)
        for name in (_ENGINE_FILE, _CLIENT_FILE):
            _private(profile.path(name))
        # The engines read the controller's address and key from ipyparallel's variable, so
        # engines on other hosts need no copy of the file. bfrun forwards the variable through
        # mpirun's own channel (-x NAME, no value) or the remote shell's input: never argv.
        env["IPP_CONNECTION_INFO"] = json.dumps(engine_info)
        engines_cmd = _engines_command(args, profile)
        if args.verbose:
            print("ibfrun: " + shlex.join(engines_cmd), file=sys.stderr, flush=True)
        launcher = _spawn(engines_cmd, engines_log, env)
        state["launcher"] = launcher.pid
        profile.write_state(state)
        client = ipyparallel.Client(profile.path(_CLIENT_FILE),
                                    timeout=max(1.0, deadline - time.monotonic()))
        _wait_for_engines(client, args.np, deadline, launcher, engines_log)
        if sorted(client.ids) != list(range(args.np)):
            raise IbfrunError(f"the engines registered with ids {sorted(client.ids)} instead "
                              f"of their ranks 0..{args.np - 1} (another engine joined the "
                              f"controller of profile {profile.name!r}?)")
        pids = client[:].apply_sync(_engine_pids)
        state["engine_pids"] = [p[0] for p in pids]
        state["nanny_pids"] = [p[1] for p in pids]
        profile.write_state(state)
    except BaseException:
        if client is not None:
            client.close()
        _stop_processes(state, GRACE_S)
        profile.clear()
        raise
    client.close()
    how = "bfrun --gloo" if args.gloo else "mpirun"
    print(f"ibfrun: {args.np} engines are up (ranks 0..{args.np - 1}, engine id = rank, "
          f"started by {how}), profile {profile.name!r} ({profile.location}).\n"
          f"Connect from Jupyter or IPython:\n"
          f"    import ipyparallel as ipp\n"
          f"    rc = ipp.Client(profile={profile.name!r})\n"
          f"then run on every engine (a %%px cell):\n"
          f"    import bluefog.tensorflow as bf\n"
          f"    bf.init()\n"
          f"Stop the cluster with: ibfrun stop --profile {profile.name}\n"
          f"Logs: {controller_log}, {engines_log}", flush=True)
    return 0


# ----------------------------------------------------------------------------------------------
# stop


def _end(procs: List[tuple], first: Sequence[tuple], wait_s: float) -> List[tuple]:
    """SIGTERM to `first` (process groups), up to `wait_s` seconds for all of `procs` to end,
    then SIGKILL to those left. Returns those still there."""
    for _, pid, _ in first:
        _signal_group(pid, signal.SIGTERM)
    left = _wait_gone(procs, wait_s)
    if left:
        for _, pid, _ in left:
            _signal_group(pid, signal.SIGKILL)
        left = _wait_gone(left, GRACE_S)
    return left


def _stop_processes(state: dict, timeout: float) -> List[tuple]:
    """Ends the cluster's processes: SIGTERM to the engines' launcher (mpirun, or bfrun --gloo,
    passes it to every engine, which then exits through its atexit handlers, bluefog's
    shutdown included), SIGKILL to those left after `timeout` seconds; then the same for
    ipyparallel's own processes (the engines' nannies, the controller). Returns those that
    could not be ended."""
    procs = _running(state)
    job = [p for p in procs if p[0] == "engines' launcher" or p[0].startswith("engine ")
           and not p[0].endswith("nanny")]
    helpers = [p for p in procs if p not in job]
    launcher = [p for p in job if p[0] == "engines' launcher"]
    left = _end(job, launcher or job, timeout)
    return left + _end(helpers, helpers, GRACE_S)


def stop(args: argparse.Namespace) -> int:
    profile = Profile(args.profile)
    state = profile.read_state()
    if state is None:
        print(f"ibfrun: no cluster of profile {profile.name!r} is running (nothing to stop; "
              f"no {profile.state_file})", file=sys.stderr)
        return 1
    running = _running(state)
    if not running:
        profile.clear()
        print(f"ibfrun: the cluster of profile {profile.name!r} had already ended; removed "
              f"its files", file=sys.stderr)
        return 0
    left = _stop_processes(state, args.timeout)
    if left:
        what = ", ".join(f"{w} (pid {pid})" for w, pid, _ in left)
        raise IbfrunError(f"could not end {what} of profile {profile.name!r}")
    profile.clear()
    print(f"ibfrun: stopped the cluster of profile {profile.name!r} "
          f"({state.get('np', '?')} engines and the controller)", flush=True)
    return 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.version:
        print(horovod_flags.version_text())
        return 0
    if args.action is None:
        parser.print_usage(sys.stderr)
        print("ibfrun: say what to do: ibfrun start -np N, or ibfrun stop", file=sys.stderr)
        return 2
    try:
        return start(args) if args.action == "start" else stop(args)
    except IbfrunError as e:
        print(f"ibfrun {args.action}: {e}", file=sys.stderr, flush=True)
        return 1
    except KeyboardInterrupt:
        print(f"ibfrun {args.action}: interrupted", file=sys.stderr, flush=True)
        return 130


if __name__ == "__main__":
    sys.exit(main())
