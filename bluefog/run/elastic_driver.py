"""The elastic driver: ``bfrun --min-np M [--max-np X] (-H ... | --host-discovery-script S)``.

bfrun stays alive for the whole job and runs it as a series of ``mpirun`` launches. Each launch
uses the hosts that are available then (minus the blacklist), up to ``--max-np`` slots. The
ranks keep their last ``commit()`` on each host's disk (``BLUEFOG_ELASTIC_STATE_DIR``), so a
launch carries on from the newest commit of the previous one. A launch ends:

* with status 0: the job is done;
* with ``RESIZE_EXIT_CODE``: the ranks stopped on purpose at a commit because the driver told
  them (``HOST_UPDATE_SIGNAL`` through mpirun) that hosts came or went; relaunch on the new set;
* with ``GIVE_UP_EXIT_CODE`` (or a rank's "reset callback raised" line): a bug every relaunch
  would repeat; the job ends;
* otherwise: a process or host failed. The host mpirun blames is blacklisted, then relaunch on
  the others, as long as ``--min-np`` slots remain and ``--reset-limit`` is not used up.

``mpirun`` runs in a session of its own, so a Ctrl-C reaches the driver alone, which stops the
launch with one SIGTERM (what Open MPI reads as "end the job": a SIGINT followed by a SIGTERM
makes it abort without stopping its ranks); and it gets SIGTERM from the kernel when the
driver dies, SIGKILL included, so no launch outlives its driver.

docs/elastic.md, "How it works", says why it is built this way (Open MPI 4.1 cannot shrink a
running job).
"""

from __future__ import annotations

import collections
import ctypes
import os
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from typing import Callable, Deque, Dict, List, Optional, Tuple

from bluefog.common import elastic_env
from bluefog.run import elastic_hosts as eh
from bluefog.run.discovery import Discovery, run_script

# A process without a handler drops HOST_UPDATE_SIGNAL (its default action is to ignore it), so
# the driver repeats it until the launch ends.
_RESIGNAL_S = 3.0
_OUTPUT_LINES = 400  # lines of mpirun output kept for reading its verdict
# After a Ctrl-C / SIGTERM, how long mpirun gets to end its ranks before they are killed.
_STOP_GRACE_S = 10.0
_PR_SET_PDEATHSIG = 1
_RESET_FAILED = re.compile(r"bluefog elastic: rank (\d+): " + re.escape(elastic_env.RESET_FAILED))


def log(msg: str) -> None:
    print(f"bfrun: elastic: {msg}", file=sys.stderr, flush=True)


class ElasticDriver:
    """Runs the launches. ``build_command(hosts, np, env)`` gives mpirun's command line for one
    launch (bfrun's options applied) without the rank command."""

    def __init__(self, args, command: List[str], env: Dict[str, str],
                 build_command: Callable[[eh.Hosts, int, Dict[str, str]], List[str]]):
        self.args = args
        self.command = command
        self.env = env
        self.build_command = build_command
        cooldown = tuple(args.blacklist_cooldown_range) if args.blacklist_cooldown_range else None
        self.blacklist = eh.Blacklist(cooldown)
        self.fixed_hosts: Optional[eh.Hosts] = (
            eh.parse_host_spec(args.hosts) if args.hosts else None)
        self.discovered: eh.Hosts = []
        self.last_discovery_problem: Optional[str] = None
        self.discovery: Optional[Discovery] = None
        self.lost: List[Tuple[str, str]] = []
        self.resets = 0
        self.proc: Optional[subprocess.Popen] = None
        self.stopping = 0  # the signal that asked the driver to stop (0: none)
        self.stop_requests = 0
        self.terminated: Optional[subprocess.Popen] = None  # the mpirun sent its one SIGTERM
        self.output: Deque[str] = collections.deque(maxlen=_OUTPUT_LINES)
        if args.state_dir:
            self.state_dir, self.keep = os.path.abspath(args.state_dir), True
        else:
            self.state_dir = os.path.join(tempfile.gettempdir(),
                                          f"bluefog-elastic-{uuid.uuid4().hex[:12]}")
            self.keep = False

    # -- hosts ---------------------------------------------------------------------------------

    def discover(self) -> Optional[eh.Hosts]:
        """The discovery script's hosts, or None when it failed (reported once per distinct
        problem; the previous list is kept). Runs on the discovery thread after the first
        time."""
        try:
            hosts = run_script(self.args.host_discovery_script, self.args.discovery_timeout,
                               self.env)
        except ValueError as e:
            self._discovery_problem(str(e))
            return None
        self.last_discovery_problem = None
        return hosts

    def _discovery_problem(self, problem: str) -> None:
        if problem != self.last_discovery_problem:
            log(f"{problem}; keeping the previous host list ({eh.host_spec(self.discovered)})")
            self.last_discovery_problem = problem

    def available(self, now: float) -> eh.Hosts:
        hosts = self.fixed_hosts if self.fixed_hosts is not None else self.discovered
        return self.blacklist.filter(hosts, now)

    def target(self, now: float) -> eh.Hosts:
        cap = self.args.max_np
        if self.resets == 0 and self.args.np is not None:
            cap = self.args.np if cap is None else min(cap, self.args.np)
        return eh.assign(self.available(now), cap)

    def refresh(self) -> None:
        """Takes the discovery thread's newest hosts, if it found any since; never waits for
        the script."""
        if self.discovery is not None:
            found = self.discovery.take()
            if found is not None:
                self.discovered = found

    def wait_for_hosts(self) -> Optional[eh.Hosts]:
        """Hosts for the next launch; None when fewer than --min-np slots come within the
        elastic timeout (at once when nothing can change: fixed hosts, no cooldown)."""
        deadline = time.time() + self.args.elastic_timeout
        said = False
        while not self.stopping:
            self.refresh()
            now = time.time()
            hosts = self.target(now)
            if eh.total_slots(hosts) >= self.args.min_np:
                return hosts
            can_change = self.fixed_hosts is None or self.blacklist.waiting(now)
            if not can_change or now >= deadline:
                return None
            if not said:
                log(f"{eh.total_slots(hosts)} slot(s) available, waiting up to "
                    f"{self.args.elastic_timeout:.0f} s for --min-np {self.args.min_np}")
                said = True
            time.sleep(min(self.args.discovery_interval, 0.5))
        return None

    # -- one launch ----------------------------------------------------------------------------

    def _pump(self, stream, sink) -> None:
        for line in iter(stream.readline, ""):
            sink.write(line)
            sink.flush()
            self.output.append(line)
        stream.close()

    def launch(self, hosts: eh.Hosts) -> int:
        np_ = eh.total_slots(hosts)
        env = dict(self.env)
        env[elastic_env.ENV_ELASTIC] = "1"
        env[elastic_env.ENV_RESTART] = str(self.resets)
        env[elastic_env.ENV_STATE_DIR] = self.state_dir
        cmd = self.build_command(hosts, np_, env)
        cmd[1:1] = ["--mca", "ess_base_forward_signals", elastic_env.HOST_UPDATE_SIGNAL_NAME]
        cmd += self.command
        log(f"launch {self.resets}: {np_} rank(s) on {eh.host_spec(hosts)} at {time.time():.3f}")
        if self.args.verbose:
            log(" ".join(shlex.quote(c) for c in cmd))
        self.output.clear()
        self.proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True, errors="replace",
                                     bufsize=1, start_new_session=True,
                                     preexec_fn=end_with(os.getpid()))
        pumps = [threading.Thread(target=self._pump, args=(self.proc.stdout, sys.stdout),
                                  daemon=True),
                 threading.Thread(target=self._pump, args=(self.proc.stderr, sys.stderr),
                                  daemon=True)]
        for t in pumps:
            t.start()
        signalled_at = None
        stop_seen = 0
        stop_deadline = 0.0
        next_poll = time.time() + self.args.discovery_interval
        while self.proc.poll() is None:
            time.sleep(0.1)
            now = time.time()
            if self.stopping and self.terminated is not self.proc:  # stopped while starting
                self._terminate()
            if self.stop_requests != stop_seen:  # said here, not in the signal handler
                if stop_seen == 0:
                    log(f"interrupted: stopping the ranks (SIGTERM to mpirun; they are killed "
                        f"if still running after {_STOP_GRACE_S:.0f} s, or at a second Ctrl-C)")
                stop_deadline = now + _STOP_GRACE_S if self.stop_requests == 1 else now
                stop_seen = self.stop_requests
            if stop_seen and now >= stop_deadline:
                log("killing mpirun and the ranks on this host")
                _kill_tree(self.proc.pid)
                stop_deadline = float("inf")
            if self.stopping or now < next_poll:
                continue
            next_poll = now + self.args.discovery_interval
            self.refresh()
            want = self.target(now)
            if eh.changed(want, hosts) and eh.total_slots(want) >= self.args.min_np:
                if signalled_at is None or now - signalled_at >= _RESIGNAL_S:
                    if signalled_at is None:
                        log(f"hosts changed to {eh.host_spec(want)}; the ranks stop at their "
                            "next commit")
                    self._signal(elastic_env.HOST_UPDATE_SIGNAL)
                    signalled_at = now
        for t in pumps:
            t.join(timeout=10)
        return self.proc.returncode

    def remove_state(self, hosts: eh.Hosts) -> None:
        """Deletes the temporary commit folder on the hosts of the last launch. Not done by the
        ranks at the end of ``run``: a failure after it (evaluation, saving) relaunches the
        job, which must then find the final commit instead of starting over."""
        one_each = [(h, 1) for h, _ in hosts]
        cmd = self.build_command(one_each, len(one_each), dict(self.env))
        cmd += ["rm", "-rf", self.state_dir]
        try:
            subprocess.run(cmd, env=self.env, capture_output=True, timeout=60)
        except (OSError, subprocess.SubprocessError) as e:
            log(f"could not remove {self.state_dir} on the hosts: {e}")

    def _signal(self, sig) -> None:
        if self.proc is not None and self.proc.poll() is None:
            try:
                self.proc.send_signal(sig)
            except ProcessLookupError:
                pass

    def stop(self, signum, _frame) -> None:
        """Ctrl-C / SIGTERM: end the current launch (one SIGTERM to mpirun; the launch loop
        says so, and kills what is left after a grace period or a second request) and do not
        relaunch."""
        if not self.stopping:
            self.stopping = signum
            self._terminate()
        self.stop_requests += 1

    def _terminate(self) -> None:
        """The one SIGTERM to the current mpirun (a second one would make Open MPI abort)."""
        if self.proc is not None and self.terminated is not self.proc:
            self.terminated = self.proc
            self._signal(signal.SIGTERM)

    def stopped(self, hosts: Optional[eh.Hosts]) -> int:
        """The end of a job stopped by a signal: the temporary folder removed (the user asked
        the job to end; a --state-dir folder is kept), status 128 + the signal."""
        if not self.keep and hosts:
            self.remove_state(hosts)
            log(f"stopped; removed {self.state_dir}")
        elif self.keep:
            log(f"stopped; the last commit stays in {self.state_dir}")
        else:
            log("stopped")
        return 128 + int(self.stopping)

    # -- the job -------------------------------------------------------------------------------

    def fail(self, why: str, hint: str = "") -> int:
        lost = f" Lost: {eh.describe(self.lost)}." if self.lost else ""
        log(f"giving up: {why}.{lost}")
        if hint:
            log(hint)
        if self.resets or self.lost:
            log(f"the last commit stays in {self.state_dir} on the hosts that made it; to "
                f"resume from it, run the job again with --state-dir {self.state_dir}")
        return 1

    def _blacklist_hint(self, now: float) -> str:
        """What to change when hosts blacklisted for good are why too few slots remain (on
        one host, the first lost rank)."""
        gone = [h for h in self.blacklist.excluded(now) if self.blacklist.until(h) == float("inf")]
        if not gone:
            return ""
        return (f"{', '.join(gone)} blacklisted for good after a failure, as this mode does "
                f"without --blacklist-cooldown-range MIN MAX (with it, a failed host takes "
                f"workers again after MIN to MAX s). Or run with --gloo: the workers that "
                f"survive re-form the job in place, on the same hosts, and go on")

    def run(self) -> int:
        signal.signal(signal.SIGINT, self.stop)
        signal.signal(signal.SIGTERM, self.stop)
        log(f"state of the commits under {self.state_dir} on each host"
            + ("" if self.keep else " (removed when the job succeeds or is stopped)"))
        if self.fixed_hosts is None:
            self.discovered = self.discover() or []  # nothing to watch yet: wait for it
            self.discovery = Discovery(self.discover, self.args.discovery_interval)
        try:
            return self._run()
        finally:
            if self.discovery is not None:
                self.discovery.stop()

    def _run(self) -> int:
        launched: Optional[eh.Hosts] = None
        while True:
            hosts = self.wait_for_hosts()
            if self.stopping:
                return self.stopped(launched)
            if hosts is None:
                now = time.time()
                have = eh.total_slots(self.target(now))
                return self.fail(f"{have} slot(s) left, below --min-np {self.args.min_np}",
                                 self._blacklist_hint(now))
            launched = hosts
            rc = self.launch(hosts)
            ended = time.time()
            if self.stopping:
                return self.stopped(hosts)
            failed_resets = sorted({int(r) for r in _RESET_FAILED.findall("".join(self.output))})
            if rc != 0 and (failed_resets or rc == elastic_env.GIVE_UP_EXIT_CODE):
                where = f"on rank(s) {failed_resets}" if failed_resets else "on a rank"
                return self.fail(f"a reset callback raised {where} (the traceback is above); "
                                 "every relaunch would raise again. Fix it and run the job "
                                 "again")
            if rc == 0:
                log(f"the job finished after {self.resets} reset(s)")
                if not self.keep:
                    self.remove_state(hosts)
                return 0
            if rc == elastic_env.RESIZE_EXIT_CODE:
                log(f"the ranks stopped at a commit for the new hosts at {ended:.3f}")
            else:
                failures = eh.find_failures("".join(self.output), hosts)
                if failures:
                    for host, _ in failures:
                        self.blacklist.add(host, ended)
                    self.lost += failures
                    log(f"launch {self.resets} failed (exit {rc}) at {ended:.3f}: "
                        f"{eh.describe(failures)}; blacklisted "
                        f"{', '.join(h for h, _ in failures)}")
                else:
                    self.lost.append(("?", f"launch {self.resets} exited with status {rc}"))
                    log(f"launch {self.resets} failed (exit {rc}) at {ended:.3f}; mpirun's "
                        "output names no host, so none is blacklisted")
            if self.args.reset_limit is not None and self.resets >= self.args.reset_limit:
                return self.fail(f"--reset-limit {self.args.reset_limit} reached")
            self.resets += 1


def end_with(parent: int) -> Optional[Callable[[], None]]:
    """A ``preexec_fn`` that makes the child get SIGTERM when ``parent`` dies (Linux; None
    elsewhere). SIGTERM is what makes mpirun end its ranks and daemons."""
    if not sys.platform.startswith("linux"):
        return None
    prctl = ctypes.CDLL(None, use_errno=True).prctl  # looked up before the fork

    def setup() -> None:
        prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)
        if os.getppid() != parent:  # the parent died before prctl: nobody will signal
            os.kill(os.getpid(), signal.SIGTERM)

    return setup


def _descendants(pid: int) -> List[int]:
    """pid's descendants on this host, from /proc (empty where there is none)."""
    children: Dict[int, List[int]] = {}
    try:
        entries = [e for e in os.listdir("/proc") if e.isdigit()]
    except OSError:
        return []
    for entry in entries:
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def _kill_tree(pid: int) -> None:
    """SIGKILL to pid and its descendants on this host (mpirun and its local ranks; the daemons
    on other hosts end their ranks when mpirun's connection drops)."""
    for victim in [pid] + _descendants(pid):
        try:
            os.kill(victim, signal.SIGKILL)
        except OSError:
            pass


def check_args(args) -> Optional[str]:
    """What is wrong with the elastic options, or None."""
    if args.min_np is None:
        return "elastic mode needs --min-np (the fewest ranks the job may run on)"
    if args.min_np < 1:
        return f"--min-np must be >= 1, got {args.min_np}"
    if args.max_np is not None and args.max_np < args.min_np:
        return f"--max-np {args.max_np} is below --min-np {args.min_np}"
    if bool(args.hosts) == bool(args.host_discovery_script):
        return ("elastic mode needs the hosts: either -H host1:slots,host2:slots or "
                "--host-discovery-script SCRIPT (not both)")
    if args.hostfile:
        return "elastic mode takes -H or --host-discovery-script, not --hostfile"
    if args.reset_limit is not None and args.reset_limit < 0:
        return f"--reset-limit must be >= 0, got {args.reset_limit}"
    if args.blacklist_cooldown_range:
        low, high = args.blacklist_cooldown_range
        if not 0 <= low <= high:
            return f"--blacklist-cooldown-range needs 0 <= MIN <= MAX, got {low} {high}"
    if args.hosts:
        try:
            hosts = eh.parse_host_spec(args.hosts)
        except ValueError as e:
            return str(e)
        slots = eh.total_slots(eh.assign(hosts, args.max_np))
        if slots < args.min_np:
            return f"-H {args.hosts} has {slots} slot(s), fewer than --min-np {args.min_np}"
    return None
