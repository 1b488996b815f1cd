"""``bfrun --gloo``: start the ranks without mpirun, on the Gloo backend.

    bfrun --gloo -np 4 python train.py
    bfrun --gloo -np 8 -H server1:4,server2:4 python train.py          # ssh to the other hosts
    bfrun --gloo -np 4 -H a:2,b:2 --rsh-agent ./agent.sh python train.py  # agent HOST CMD

bfrun starts every rank itself: a local rank as a child process, a rank on another host through
the remote shell (``ssh HOST CMD``, or ``--rsh-agent``). Rank 0 serves the rendezvous store
(csrc/transport/gloo/tcp_store.cc), as it does when a scheduler starts the ranks: the store has
one implementation, and bfrun needs neither the native library nor a listener of its own, so
the store stays the job's only listener. bfrun picks the store's port (a free one when rank 0
is on this host) and a random per-job token (BLUEFOG_JOB_TOKEN), and gives each rank MASTER_ADDR,
MASTER_PORT, RANK, WORLD_SIZE, LOCAL_RANK and LOCAL_WORLD_SIZE.

Each line a rank prints comes out prefixed with ``[rank]<stdout>:`` or ``[rank]<stderr>:``, as
Horovod's Gloo launcher tags them (``tag=False``: as it is). When a rank fails, bfrun ends the
others and exits with that rank's status, naming it; Ctrl-C, SIGTERM or SIGHUP ends every rank.
"""

from __future__ import annotations

import argparse
import ctypes
import ipaddress
import os
import random
import secrets
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from bluefog.run import elastic_hosts, horovod_flags
from bluefog.run.timeline_files import merge_timeline, timeline_to_merge

# Variables an MPI launcher sets: a rank that inherits them would take itself for an MPI rank.
_LAUNCHER_PREFIXES = ("OMPI_", "PMIX_", "PMI_", "OPAL_", "PRTE_")
_LOCAL_NAMES = ("localhost", "127.0.0.1", "::1")
# Seconds the ranks get to exit after SIGTERM before SIGKILL.
GRACE_S = 5.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """bfrun's Gloo options (kept here so that bfrun.py only hooks them in)."""
    g = parser.add_argument_group("without mpirun (docs/launching.md)")
    g.add_argument("--gloo", action="store_true",
                   help="start the ranks directly on the Gloo backend, without mpirun")
    g.add_argument("--rsh-agent", dest="rsh_agent",
                   help="with --gloo: command that runs a command on another host, called as "
                        "AGENT HOST COMMAND (default: $BLUEFOG_RSH_AGENT, else ssh)")
    g.add_argument("--gloo-port", dest="gloo_port", type=horovod_flags.tcp_port,
                   help="with --gloo: rank 0's rendezvous port (default: a free port when rank "
                        "0 runs on this host, else a random one from 20000-39999)")


class LaunchError(RuntimeError):
    """A rank's process could not be started (the others were ended)."""


@dataclass
class Rank:
    rank: int
    host: str
    local_rank: int
    local_size: int


def is_local(host: str) -> bool:
    return host in _LOCAL_NAMES or host in (socket.gethostname(), socket.getfqdn())


def listen_address() -> str:
    """Where a listener of this host binds when processes on other hosts must reach it by
    this host's name (socket.getfqdn()): the address that name resolves to, so that no other
    interface accepts; every interface ("") when the name resolves only to loopback (a
    Debian-style /etc/hosts) or to nothing this host can bind."""
    try:
        infos = socket.getaddrinfo(socket.getfqdn(), None, type=socket.SOCK_STREAM)
    except OSError:
        return ""
    for family, _, _, _, sockaddr in infos:
        addr = sockaddr[0]
        if ipaddress.ip_address(addr.split("%")[0]).is_loopback:
            continue
        try:
            with socket.socket(family, socket.SOCK_STREAM) as s:
                s.bind((addr, 0))
            return addr
        except OSError:
            continue
    return ""


def plan(np_: int, hosts_spec: Optional[str]) -> List[Rank]:
    """The ranks, filling the hosts in order (as Open MPI maps by slot). Raises ValueError."""
    if np_ < 1:
        raise ValueError(f"-np must be >= 1, got {np_}")
    hosts = (elastic_hosts.parse_host_spec(hosts_spec) if hosts_spec else [("localhost", np_)])
    if elastic_hosts.total_slots(hosts) < np_:
        raise ValueError(f"-np {np_} is more than the {elastic_hosts.total_slots(hosts)} slots "
                         f"of -H {hosts_spec}")
    ranks: List[Rank] = []
    for host, slots in elastic_hosts.assign(hosts, np_):
        ranks += [Rank(len(ranks) + i, host, i, slots) for i in range(slots)]
    return ranks


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def rendezvous(ranks: List[Rank], port: Optional[int]) -> Tuple[str, int]:
    """MASTER_ADDR and MASTER_PORT: rank 0's host. 127.0.0.1 when every rank is local."""
    first = ranks[0].host
    everyone_local = all(is_local(r.host) for r in ranks)
    addr = "127.0.0.1" if everyone_local else (
        socket.getfqdn() if first in _LOCAL_NAMES else first)
    if port is None:
        port = free_port() if is_local(first) else random.randint(20000, 39999)
    return addr, port


def rank_env(base: Dict[str, str], r: Rank, size: int, addr: str, port: int,
             token: str) -> Dict[str, str]:
    env = {k: v for k, v in base.items()
           if not k.startswith(_LAUNCHER_PREFIXES) and k != "TF_CONFIG"}
    env.update(MASTER_ADDR=addr, MASTER_PORT=str(port), RANK=str(r.rank), WORLD_SIZE=str(size),
               LOCAL_RANK=str(r.local_rank), LOCAL_WORLD_SIZE=str(r.local_size),
               BLUEFOG_JOB_TOKEN=token, BLUEFOG_BACKEND="gloo", PYTHONUNBUFFERED="1")
    return env


def remote_input(env: Dict[str, str], names: Sequence[str]) -> bytes:
    """What `remote_command`'s shell reads first from its input: one line per variable of
    `names` set in `env`, then ``.``. A value's bytes other than printable ASCII, quotes and
    backslashes are octal escapes for printf(1)'s ``%b``, so that every line is one line."""
    def escaped(value: str) -> str:
        return "".join(c if c.isascii() and c.isprintable() and c not in "'\\" else
                       "".join(f"\\0{b:03o}" for b in c.encode()) for c in value)

    lines = [f"{k}=$(printf '%bx' '{escaped(env[k])}'); {k}=${{{k}%x}}; export {k}"
             for k in names if k in env]
    return ("\n".join(lines + ["."]) + "\n").encode()


def remote_command(agent: Sequence[str], host: str, command: Sequence[str]) -> List[str]:
    """AGENT HOST 'cd CWD && sh -c ...': the command runs in bfrun's folder with the variables
    that the shell reads first from its input (`remote_input`), and ends when the remote
    shell's input closes (bfrun ended it or died), since ssh does not pass signals on. No
    variable's value is on any command line, where every local user of either host could read
    it (/proc/PID/cmdline): only the command is. Where the host has setsid(1), the command runs
    in a process group of its own and the whole group is ended, so that a wrapper script's
    children end with it."""
    # read(1) of sh takes one byte at a time from a pipe, so nothing past the "." line is
    # consumed. Input that ends before it (bfrun died) ends the rank before it starts.
    # A background job's input is /dev/null unless redirected: fd 3 keeps the remote input.
    # A background job of a shell without job control is no group leader, so setsid(1) execs
    # in place (no fork): $p is then the group's id.
    # A signal to this shell (a stand-in for ssh that keeps it in bfrun's rank group) is passed
    # on to that group.
    inner = ("while :; do IFS= read -r l || exit 1; [ \"$l\" = . ] && break; eval \"$l\"; "
             "done; "
             "exec 3<&0; g=; command -v setsid >/dev/null 2>&1 && g=setsid; "
             "$g " + " ".join(shlex.quote(c) for c in command) + " </dev/null & p=$!; "
             "end() { kill -TERM -$p 2>/dev/null || kill -TERM $p 2>/dev/null; }; "
             "trap 'end; exit 143' TERM; trap 'end; exit 130' INT; trap 'end; exit 129' HUP; "
             "{ cat <&3 >/dev/null 2>&1; end; } & w=$!; "
             "wait $p; s=$?; kill $w 2>/dev/null; exit $s")
    line = f"cd {shlex.quote(os.getcwd())} 2>/dev/null; exec sh -c {shlex.quote(inner)}"
    return [*agent, host, line]


def start_rank(cmd: List[str], env: Dict[str, str], remote_env: Optional[bytes]
               ) -> subprocess.Popen:
    """Starts one rank's process (of its own group, ended with this process): `cmd` itself, or
    for a remote rank (`remote_env` from `remote_input`) the remote shell, whose input then
    carries the variables and stays open while the rank should run."""
    p = subprocess.Popen(cmd, env=env,
                         stdin=subprocess.DEVNULL if remote_env is None else subprocess.PIPE,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         preexec_fn=_die_with_parent)
    if remote_env is not None:
        try:
            p.stdin.write(remote_env)
            p.stdin.flush()
        except OSError:
            pass  # the remote shell already ended: its status says why
    return p


def _die_with_parent() -> None:
    """In the child: SIGTERM when bfrun dies, even by SIGKILL (Linux), so no rank outlives it."""
    os.setsid()
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


class Janitor:
    """Ends the ranks' process groups if this process dies without ending them: a process of
    its own session (bluefog/run/janitor.py) reading the groups from a pipe that only this
    process writes, so the pipe's end is this process's death. PR_SET_PDEATHSIG alone reaches
    only a rank's first process, not what a wrapper script it runs started."""

    def __init__(self):
        self.lock = threading.Lock()
        try:
            self.proc: Optional[subprocess.Popen] = subprocess.Popen(
                [sys.executable, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                              "janitor.py"), str(GRACE_S)],
                stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, start_new_session=True)
        except OSError:
            self.proc = None  # PDEATHSIG still ends each rank's first process

    def _send(self, line: str) -> None:
        if self.proc is None:
            return
        with self.lock:
            try:
                self.proc.stdin.write(f"{line}\n".encode())
                self.proc.stdin.flush()
            except (OSError, ValueError):
                pass

    def watch(self, proc: subprocess.Popen) -> None:
        """Ends `proc`'s process group (its pid: started with setsid) if this process dies
        first; forgets it once it has been reaped."""
        self._send(f"+{proc.pid}")

        def reaped():
            proc.wait()
            self._send(f"-{proc.pid}")

        threading.Thread(target=reaped, daemon=True).start()


_janitor: Optional[Janitor] = None
_janitor_lock = threading.Lock()


def janitor() -> Janitor:
    """This process's janitor, started at its first rank."""
    global _janitor
    with _janitor_lock:
        if _janitor is None:
            _janitor = Janitor()
        return _janitor


class Job:
    """The ranks of one job: started, their output forwarded, ended together."""

    def __init__(self, ranks: List[Rank], commands: List[List[str]], envs: List[Dict[str, str]],
                 on_line: Optional[Callable[[int, bool, bytes], Optional[bytes]]] = None,
                 out=None, err=None, tag: bool = True,
                 remote_envs: Optional[List[Optional[bytes]]] = None):
        self.ranks = ranks
        self.on_line = on_line
        self.tag = tag
        self.out = out or sys.stdout.buffer
        self.err = err or sys.stderr.buffer
        self.lock = threading.Lock()
        self.procs: List[subprocess.Popen] = []
        self.readers: List[threading.Thread] = []
        self.exits: List[int] = []  # rank indices in the order their processes ended
        for r, cmd, env, remote_env in zip(ranks, commands, envs,
                                           remote_envs or [None] * len(ranks)):
            try:
                p = start_rank(cmd, env, remote_env)
            except OSError as e:
                self.terminate()
                raise LaunchError(f"cannot start rank {r.rank} on {r.host}: {cmd[0]}: "
                                  f"{e.strerror or e}") from e
            self.procs.append(p)
            janitor().watch(p)
            for stream, is_err in ((p.stdout, False), (p.stderr, True)):
                t = threading.Thread(target=self._forward, args=(r.rank, stream, is_err),
                                     daemon=True)
                t.start()
                self.readers.append(t)
            threading.Thread(target=self._await, args=(len(self.procs) - 1,), daemon=True).start()

    def _await(self, index: int) -> None:
        self.procs[index].wait()
        with self.lock:
            self.exits.append(index)

    def _forward(self, rank: int, stream, is_err: bool) -> None:
        prefix = f"[{rank}]<{'stderr' if is_err else 'stdout'}>:".encode() if self.tag else b""
        for line in iter(stream.readline, b""):
            if self.on_line is not None:
                kept = self.on_line(rank, is_err, line)
                if kept is not None:
                    if not kept:
                        continue
                    line = kept
            sink = self.err if is_err else self.out
            with self.lock:
                sink.write(prefix + line)
                if not line.endswith(b"\n"):
                    sink.write(b"\n")
                sink.flush()

    def terminate(self, sig: int = signal.SIGTERM) -> None:
        """Signals every rank's process group, then SIGKILL after GRACE_S, and closes their
        input (which ends a remote rank)."""
        for p in self.procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, sig)
                except OSError:
                    pass
            if p.stdin is not None:
                try:
                    p.stdin.close()
                except OSError:
                    pass
        deadline = time.time() + GRACE_S
        for p in self.procs:
            try:
                p.wait(timeout=max(0.1, deadline - time.time()))
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except OSError:
                    pass
                p.wait()

    def wait(self, timeout: Optional[float] = None) -> Tuple[int, Optional[int], str]:
        """Waits until every rank exited 0, one failed, or `timeout` passed: (status, failed
        rank or None, message). Ends the other ranks when one fails."""
        deadline = None if timeout is None else time.time() + timeout
        failed: Optional[int] = None
        while True:
            codes = [p.poll() for p in self.procs]
            for p, c in zip(self.procs, codes):
                if c is not None and p.stdin is not None and not p.stdin.closed:
                    p.stdin.close()  # ends what is left of an exited remote rank
            with self.lock:
                bad = [i for i in self.exits if self.procs[i].returncode != 0]
            if bad:
                failed = bad[0]  # the first to fail; the others may have failed because of it
                break
            if all(c == 0 for c in codes) and len(self.exits) == len(self.procs):
                break
            if deadline is not None and time.time() > deadline:
                self.terminate()
                self._drain()
                return 124, None, f"the job did not finish within {timeout:g} s; ended it"
            time.sleep(0.05)
        if failed is None:
            self._drain()
            return 0, None, ""
        code = self.procs[failed].returncode
        running = sum(1 for p in self.procs if p.poll() is None)
        self.terminate()
        self._drain()
        r = self.ranks[failed]
        how = (f"was killed by signal {signal.Signals(-code).name}" if code < 0
               else f"exited with status {code}")
        msg = (f"rank {r.rank} (on {r.host}) {how}; ended the {running} rank(s) still running")
        return (code if code > 0 else 128 - code), r.rank, msg

    def _drain(self) -> None:
        for t in self.readers:
            t.join(timeout=5)


def launch(command: Sequence[str], np_: int, hosts: Optional[str] = None,
           env: Optional[Dict[str, str]] = None, extra_names: Sequence[str] = (),
           rsh_agent: Optional[str] = None, port: Optional[int] = None,
           token: Optional[str] = None,
           forwarded_env: Optional[Callable[[Dict[str, str], Sequence[str]], List[str]]] = None,
           **job_kwargs) -> Job:
    """Starts `command` as every rank of a Gloo job and returns the running Job.
    `forwarded_env(env, extra_names)` names the variables a remote rank gets (bfrun's choice)."""
    ranks = plan(np_, hosts)
    addr, port = rendezvous(ranks, port)
    token = token or secrets.token_hex(16)
    base = dict(os.environ if env is None else env)
    agent = shlex.split(rsh_agent or base.get("BLUEFOG_RSH_AGENT") or "ssh")
    names = list(forwarded_env(base, extra_names) if forwarded_env else extra_names) + [
        "MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
        "BLUEFOG_JOB_TOKEN", "BLUEFOG_BACKEND", "PYTHONUNBUFFERED"]
    commands, envs, remote_envs = [], [], []
    for r in ranks:
        renv = rank_env(base, r, np_, addr, port, token)
        local = is_local(r.host)
        envs.append(renv if local else base)
        commands.append(list(command) if local else remote_command(agent, r.host, command))
        remote_envs.append(None if local else remote_input(renv, names))
    return Job(ranks, commands, envs, remote_envs=remote_envs, **job_kwargs)


def main(args: argparse.Namespace,
         forwarded_env: Callable[[Dict[str, str], Sequence[str]], List[str]]) -> int:
    """bfrun --gloo: runs the job in the foreground and returns bfrun's exit status."""
    if args.hostfile:
        print("bfrun: --gloo takes hosts with -H host1:slots,host2:slots, not --hostfile",
              file=sys.stderr)
        return 2
    env = dict(os.environ)
    extra = []
    for item in args.env:
        name, sep, value = item.partition("=")
        if not name.isidentifier():
            print(f"bfrun: -x {item!r}: not a valid environment variable name", file=sys.stderr)
            return 2
        if sep:
            env[name] = value
        elif name not in env:
            print(f"bfrun: -x {name}: the variable is not set", file=sys.stderr)
            return 2
        extra.append(name)
    for line in horovod_flags.apply_gloo(args, env):
        print(f"bfrun: {line}", file=sys.stderr)
    if args.timeline:
        env["BLUEFOG_TIMELINE"] = args.timeline
    try:
        ranks = plan(args.np, args.hosts)
    except ValueError as e:
        print(f"bfrun: {e}", file=sys.stderr)
        return 2
    if args.verbose or args.dry_run:
        addr, port = rendezvous(ranks, args.gloo_port)
        for r in ranks:
            print(f"bfrun: rank {r.rank} on {r.host} (local {r.local_rank} of {r.local_size}), "
                  f"rendezvous {addr}:{port}: {shlex.join(args.command)}", file=sys.stderr)
        if args.dry_run:
            return 0
    if not args.quiet:
        print(elastic_hosts.starting_line(len(ranks), len({r.host for r in ranks})),
              file=sys.stderr)
    sys.stdout.flush()
    sys.stderr.flush()
    stopped: List[int] = []

    def on_signal(signum, _frame):
        stopped.append(signum)
        raise KeyboardInterrupt

    # Installed before the ranks start, so that a signal that comes as soon as they run (their
    # first output) ends them too. SIGINT as well: a shell starts a background job with SIGINT
    # ignored, which Python keeps.
    handled = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    old = {s: signal.signal(s, on_signal) for s in handled}
    job = None
    merged = None
    try:
        try:
            job = launch(args.command, args.np, args.hosts, env, extra, args.rsh_agent,
                         args.gloo_port, forwarded_env=forwarded_env, tag=args.tag_output)
        except LaunchError as e:
            print(f"bfrun: {e}", file=sys.stderr)
            return 127
        merged = timeline_to_merge(args, env)
        code, _, msg = job.wait()
    except KeyboardInterrupt:
        sig = stopped[0] if stopped else signal.SIGINT
        print(f"bfrun: {signal.Signals(sig).name}: ending all {len(ranks)} ranks",
              file=sys.stderr, flush=True)
        if job is not None:  # else the ranks started so far die with bfrun (PDEATHSIG)
            job.terminate()
        if merged:
            merge_timeline(merged, args.np)
        return 128 + sig
    finally:
        for s, h in old.items():
            signal.signal(s, h)
    if merged:
        merge_timeline(merged, args.np)
    if msg:
        print(f"bfrun: {msg}", file=sys.stderr, flush=True)
    return code
