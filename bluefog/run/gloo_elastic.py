"""In-place elastic training on Gloo: ``bfrun --gloo --min-np M [--max-np X] [-np N]
(-H hosts | --host-discovery-script S) python train.py``.

bfrun starts one worker process per slot and stays alive as the job's driver. It serves the
Gloo rendezvous store itself (bluefog/common/gloo_store.py), so the store outlives every
worker, and runs the job as a series of *rounds* (bluefog/common/elastic_rounds.py): each round
lists the workers in rank order and has a key prefix of its own in the store.

* A worker that dies (any exit but 0) leaves its round. Its peers' collectives fail at once
  (their Gloo connections to it break); the driver publishes the next round with the workers
  that remain, and they join it without restarting: ``bf.elastic.run`` restores the last
  commit, calls ``bf.shutdown()`` and ``bf.init()``, synchronizes and goes on.
* Fewer than ``--min-np`` workers left: the job ends with status 1 and a line naming the
  workers lost.
* New slots (from the discovery script): the driver starts workers for them (up to
  ``--max-np``); once they wait for a round, it publishes one that includes them, which the
  running workers notice at their next ``commit()`` (``HostsUpdatedInterrupt``); the new
  workers receive the state by broadcast before their first step.
* A worker not heard from (its heartbeat) for half the workers' Gloo timeout is hung: the
  driver kills it, and it is lost as a dead one is (bluefog/run/elastic_watch.py).
* Every worker exited 0: the job is done. A worker that returns from the training function
  while others still train ends the job (status 1) once they find it gone, as Horovod's
  driver does.
* A host where a worker failed is blacklisted: no new worker starts there, for good or, with
  ``--blacklist-cooldown-range MIN MAX``, for a random MIN..MAX seconds doubled at each further
  failure there. The host's other workers go on (a lost process is not a lost host; if the host
  is gone, they are lost too).
* ``--reset-limit K``: the job re-forms (a worker lost, workers joining) at most K times; the
  next time it ends with status 1 instead.

Each line a worker prints comes out prefixed with ``[id]`` (the worker ids 0..N-1 of the
first round are its ranks; later workers get the next ids).
"""

from __future__ import annotations

import os
import secrets
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import Dict, List, Optional, Sequence

from bluefog.common import elastic_rounds, gloo_store
from bluefog.run import elastic_hosts as eh
from bluefog.run import gloo_launch, horovod_flags
from bluefog.run.discovery import Discovery, run_script
from bluefog.run.elastic_watch import RoundWatch

# How long the driver waits, after a worker reported a failed collective, for the death that
# explains it before it re-forms the job with the same workers anyway.
_FAILURE_GRACE_S = 2.0
_POLL_S = 0.02
# The workers' BLUEFOG_GLOO_TIMEOUT when the environment sets none (csrc/core/config.h).
_DEFAULT_GLOO_TIMEOUT_S = 300.0


def log(msg: str) -> None:
    print(f"bfrun: elastic: {msg}", file=sys.stderr, flush=True)


class _GiveUp(Exception):
    """The job cannot go on (--reset-limit reached): the driver ends every worker."""


class Worker:
    def __init__(self, wid: str, host: str, proc: subprocess.Popen):
        self.wid = wid
        self.host = host
        self.proc = proc
        self.ended = False
        self.stopped = False  # stopped by the driver (its slot went away): not a failure
        self.hung = False  # killed by the driver: its heartbeat stopped


class GlooElasticDriver:
    def __init__(self, args, env: Dict[str, str], extra_names: Sequence[str], forwarded_env):
        self.args = args
        self.env = env
        self.extra_names = list(extra_names)
        self.forwarded_env = forwarded_env
        self.workers: Dict[str, Worker] = {}
        self.next_id = 0
        self.round = -1
        self.members: List[str] = []  # the current round's workers, in rank order
        self.lost: List[str] = []
        self.joining: List[str] = []  # started, not yet in a round
        self.secret = secrets.token_hex(16)
        self.out_lock = threading.Lock()
        self.fixed = eh.parse_host_spec(args.hosts) if args.hosts else None
        self.max_np = args.max_np
        self.discovery: Optional[Discovery] = None
        self.failure_seen: Dict[str, float] = {}
        cooldown = getattr(args, "blacklist_cooldown_range", None)
        self.blacklist = eh.Blacklist(tuple(cooldown) if cooldown else None)
        self.reset_limit: Optional[int] = getattr(args, "reset_limit", None)
        self.resets = 0
        self.cut_short = ""  # why the job ended while workers were still training
        self._watch: Optional[RoundWatch] = None
        # on_line(worker id, is_stderr, line) -> None to print the line as it is, else what to
        # print instead (b"": nothing): bluefog.run takes its result out of the line.
        self.on_line = None

    # -- hosts ---------------------------------------------------------------------------------

    def hosts(self) -> Optional[eh.Hosts]:
        if self.fixed is not None:
            return self.fixed
        try:
            return run_script(self.args.host_discovery_script, self.args.discovery_timeout,
                              self.env)
        except ValueError:
            return None

    # -- workers -------------------------------------------------------------------------------

    def worker_env(self, wid: str) -> Dict[str, str]:
        """What a worker needs to find the job (besides what bf.init() reads from rounds)."""
        return {"MASTER_ADDR": self.addr, "MASTER_PORT": str(self.port),
                "BLUEFOG_JOB_TOKEN": self.secret, "BLUEFOG_BACKEND": "gloo",
                "BLUEFOG_GLOO_EXTERNAL_STORE": "1", elastic_rounds.ENV_WORKER: wid}

    def start_worker(self, host: str) -> str:
        wid = str(self.next_id)
        self.next_id += 1
        self.workers[wid] = Worker(wid, host, self.spawn(wid, host))
        return wid

    def spawn(self, wid: str, host: str):
        """Starts worker ``wid`` on ``host``; returns an object with subprocess.Popen's poll(),
        returncode, wait(timeout) and pid (a process of its own group), or stop()."""
        env = {k: v for k, v in self.env.items()
               if not k.startswith(gloo_launch._LAUNCHER_PREFIXES) and k != "TF_CONFIG"}
        for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
            env.pop(k, None)
        env.update(self.worker_env(wid), PYTHONUNBUFFERED="1")
        command = list(self.args.command)
        remote_env = None
        if not gloo_launch.is_local(host):
            agent = shlex.split(self.args.rsh_agent or self.env.get("BLUEFOG_RSH_AGENT")
                                or "ssh")
            names = list(self.forwarded_env(self.env, self.extra_names)) + [
                "MASTER_ADDR", "MASTER_PORT", "BLUEFOG_JOB_TOKEN", "BLUEFOG_BACKEND",
                "BLUEFOG_GLOO_EXTERNAL_STORE", "PYTHONUNBUFFERED", elastic_rounds.ENV_WORKER]
            remote_env = gloo_launch.remote_input(env, names)
            command = gloo_launch.remote_command(agent, host, command)
            env = self.env
        proc = gloo_launch.start_rank(command, env, remote_env)
        gloo_launch.janitor().watch(proc)
        for stream, sink in ((proc.stdout, sys.stdout.buffer), (proc.stderr, sys.stderr.buffer)):
            threading.Thread(target=self._forward, args=(wid, stream, sink), daemon=True).start()
        return proc

    @staticmethod
    def stop(proc, sig: int = signal.SIGTERM) -> None:
        if hasattr(proc, "stop"):
            proc.stop()
            return
        try:
            os.killpg(proc.pid, sig)
        except OSError:
            pass

    def _forward(self, wid: str, stream, sink) -> None:
        prefix = f"[{wid}]".encode()
        is_err = sink is sys.stderr.buffer
        for line in iter(stream.readline, b""):
            if self.on_line is not None:
                kept = self.on_line(wid, is_err, line)
                if kept is not None:
                    if not kept:
                        continue
                    line = kept
            with self.out_lock:
                sink.write(prefix + (b" " if line.strip() else b"") + line)
                if not line.endswith(b"\n"):
                    sink.write(b"\n")
                sink.flush()

    def end_all(self) -> None:
        procs = [w.proc for w in self.workers.values() if w.proc.poll() is None]
        for p in procs:
            self.stop(p)
            if getattr(p, "stdin", None) is not None:
                try:
                    p.stdin.close()
                except OSError:
                    pass
        deadline = time.time() + gloo_launch.GRACE_S
        for p in procs:
            try:
                p.wait(timeout=max(0.1, deadline - time.time()))
            except subprocess.TimeoutExpired:
                self.stop(p, signal.SIGKILL)
                p.wait()

    # -- rounds --------------------------------------------------------------------------------

    @property
    def watch(self) -> RoundWatch:
        """The workers' progress in the store (made with the store, which run() starts). A
        worker not heard from for half the workers' Gloo timeout (at least 5 s) is hung."""
        if self._watch is None:
            self._watch = RoundWatch(self.store, max(5.0, gloo_timeout(self.env) / 2))
        return self._watch

    def publish(self, members: List[str], why: str) -> None:
        old = self.round
        if old >= 0:
            if self.reset_limit is not None and self.resets >= self.reset_limit:
                raise _GiveUp(f"--reset-limit {self.reset_limit} reached: the job re-formed "
                              f"{self.resets} time(s) and would again ({why})")
            self.resets += 1
        self.round += 1
        self.members = list(members)
        self.watch.published(self.round, self.members)
        hosts = [self.workers[w].host for w in members]
        self.store.set(elastic_rounds.round_key(self.round),
                       elastic_rounds.record(self.round, self.members, hosts))
        self.store.set(elastic_rounds.ROUND_KEY, str(self.round).encode())
        if old >= 0:  # a rendezvous of the old round still waiting for a lost worker ends
            self.store.set(elastic_rounds.prefix(old) + "bluefog/abort", b"1")
        self.joining = [w for w in self.joining if w not in members]
        log(f"round {self.round}: {len(members)} worker(s) {members} ({why})")

    def _gone_prefix(self) -> str:
        return elastic_rounds.prefix(max(self.round, 0))

    # -- the job -------------------------------------------------------------------------------

    def run(self) -> int:
        hosts = self.hosts() or []
        slots = eh.assign(hosts, self.max_np)
        first = eh.total_slots(slots)
        if self.args.np is not None:
            first = min(first, self.args.np)
        if first < self.args.min_np:
            log(f"giving up: {first} slot(s) available, below --min-np {self.args.min_np}")
            return 1
        bind = self.listen(hosts)
        port = self.args.gloo_port or 0
        self.store = gloo_store.StoreServer(bind, port, gloo_store.job_token(self.secret),
                                            gone_prefix=self._gone_prefix)
        self.port = self.store.port
        members = []
        for host in eh.rank_hosts(slots)[:first]:
            members.append(self.start_worker(host))
        self.publish(members, "start")
        if self.fixed is None:
            self.discovery = Discovery(self.hosts, self.args.discovery_interval)

        stopped: List[int] = []

        def on_signal(signum, _frame):
            stopped.append(signum)
            raise KeyboardInterrupt

        handled = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
        in_main = threading.current_thread() is threading.main_thread()
        old = {s: signal.signal(s, on_signal) for s in handled} if in_main else {}
        try:
            return self.loop()
        except KeyboardInterrupt:
            sig = stopped[0] if stopped else signal.SIGINT
            log(f"interrupted ({signal.Signals(sig).name}): ending every worker")
            self.end_all()
            return 128 + sig
        finally:
            for s, h in old.items():
                signal.signal(s, h)
            if self.discovery is not None:
                self.discovery.stop()
            self.store.close()

    def listen(self, hosts: eh.Hosts) -> str:
        """Sets self.addr (where workers reach the store); returns the address to bind: the
        narrowest that every worker reaches (loopback when they all run on this host)."""
        everyone_local = all(gloo_launch.is_local(h) for h, _ in hosts)
        self.addr = "127.0.0.1" if everyone_local else socket.getfqdn()
        return "127.0.0.1" if everyone_local else gloo_launch.listen_address()

    def loop(self) -> int:
        """Watches the workers until the job ends; returns bfrun's exit status."""
        try:
            return self._loop()
        except _GiveUp as e:
            lost = f" Lost: {'; '.join(self.lost)}" if self.lost else ""
            log(f"giving up: {e}.{lost}")
            self.end_all()
            return 1

    def _loop(self) -> int:
        while True:
            now = time.monotonic()
            dead = []
            for w in list(self.workers.values()):
                if w.ended or w.proc.poll() is None:
                    continue
                w.ended = True
                code = w.proc.returncode
                if code == 0:
                    continue
                how = (f"killed by signal {signal.Signals(-code).name}" if code < 0
                       else f"exited with status {code}")
                if w.hung:
                    how += " by bfrun: it hung"
                where = (f"rank {self.members.index(w.wid)} of round {self.round}"
                         if w.wid in self.members else "not yet in a round")
                self.lost.append(f"worker {w.wid} on {w.host} ({how})")
                log(f"worker {w.wid} ({where}, on {w.host}) {how}")  # the cause, then its effect
                if not w.stopped:
                    self._blacklist(w.host, now)
                dead.append(w.wid)
                if w.wid in self.joining:
                    self.joining.remove(w.wid)
            running = [m for m in self.members if not self.workers[m].ended]
            ok = [m for m in self.members if self.workers[m].ended
                  and self.workers[m].proc.returncode == 0]
            finished = self.watch.finished(set(ok))
            if finished:
                # A worker finished: the job is ending (the others finish too, or fail). One
                # that waits for a finished worker instead is stopped: nothing can re-form.
                if not self.cut_short:
                    self._end_early(finished, [m for m in running if m not in finished])
                if running:
                    time.sleep(_POLL_S)
                    continue
                for w in self.joining:
                    self.stop(self.workers[w].proc)
                if self.cut_short:
                    log(f"job failed: {self.cut_short}")
                    return 1
                failed = [m for m in self.members if m not in ok]
                if failed:
                    log(f"job failed: worker(s) {failed} exited with an error after "
                        f"{len(ok)} finished")
                    return 1
                log(f"job done: {len(ok)} worker(s) finished")
                return 0
            if any(m in dead for m in self.members):
                if len(running) < self.args.min_np:
                    log(f"giving up: {len(running)} worker(s) left, below --min-np "
                        f"{self.args.min_np}. Lost: {'; '.join(self.lost)}")
                    self.end_all()
                    return 1
                ready = self._ready_joiners(len(running))
                self.publish(running + ready, f"lost worker(s) {[m for m in dead]}")
                continue
            self._check_failures(running, now)
            self._check_heartbeats(now)
            self._grow(running, now)
            time.sleep(_POLL_S)

    def _blacklist(self, host: str, now: float) -> None:
        """A worker failed on ``host``: no new worker starts there (for a while, with
        --blacklist-cooldown-range); its other workers go on."""
        self.blacklist.add(host, now)
        until = self.blacklist.until(host)
        when = "for good" if until == float("inf") else f"for {until - now:.0f} s"
        log(f"host {host} blacklisted {when}: no new worker starts there")

    def _ready_joiners(self, count: int) -> List[str]:
        room = (self.max_np or 1 << 30) - count
        ready = [w for w in self.joining if self.store.get(f"elastic/waiting/{w}") is not None]
        return ready[:max(room, 0)]

    def _check_failures(self, running: List[str], now: float) -> None:
        """A worker left its round for a failed collective but no worker died: after a grace
        period, the job is re-formed with the same workers (a broken connection, a timeout)."""
        for key in self.store.keys("elastic/failed/"):
            wid = key.rsplit("/", 1)[1]
            if self.store.get(key) != str(self.round).encode():
                continue
            first = self.failure_seen.setdefault(f"{self.round}/{wid}", now)
            if now - first > _FAILURE_GRACE_S:
                self.publish(running + self._ready_joiners(len(running)),
                             f"worker {wid} reported a failed collective")
                return

    def _end_early(self, finished: Dict[str, int], unfinished: List[str]) -> None:
        """Workers still in the training function after another returned from it wait for it
        in vain (elastic_watch.py): the job ends, as Horovod's ends when a worker succeeds."""
        if not self.watch.waiting_for(finished, unfinished):
            return
        names = ", ".join(f"worker {w} ({self.watch.rank_in(w, r)})"
                          for w, r in sorted(finished.items()))
        self.cut_short = (f"{names} returned from the training function while worker(s) "
                          f"{unfinished} had not; a worker that returns ends the job. Give "
                          "every worker the same number of steps (uneven shards make one "
                          "finish first: drop the remainder, or pad)")
        log(f"{self.cut_short}; stopping worker(s) {unfinished}")
        for wid in unfinished:
            self.workers[wid].stopped = True
            self.stop(self.workers[wid].proc)

    def _check_heartbeats(self, now: float) -> None:
        """Kills the workers whose heartbeat stopped (elastic_watch.py): lost as dead ones are,
        the others re-form without them instead of waiting for them."""
        alive = [w for w, x in self.workers.items() if not x.ended and not x.hung]
        for wid in self.watch.silent(now, alive):
            w = self.workers[wid]
            where = (self.watch.rank_in(wid, self.round) if wid in self.members
                     else "not yet in a round")
            log(f"worker {wid} ({where}, on {w.host}) has not been heard from for "
                f"{self.watch.deadline:.0f} s (half of BLUEFOG_GLOO_TIMEOUT): it is taken for "
                "hung and killed")
            w.hung = True
            self.stop(w.proc, signal.SIGKILL)

    def _grow(self, running: List[str], now: float) -> None:
        hosts = self.discovery.take() if self.discovery is not None else None
        if hosts is None:
            ready = self._ready_joiners(len(running))
        else:
            alive = [w for w in self.workers.values() if not w.ended]
            per_host: Dict[str, int] = {}
            for w in alive:
                per_host[w.host] = per_host.get(w.host, 0) + 1
            room = (self.max_np or 1 << 30) - len(alive)
            listed = dict(hosts)
            for host in sorted(per_host):
                # Fewer slots there now (or none): its newest workers are stopped, and the
                # job re-forms without them as after a failure.
                extra = per_host[host] - listed.get(host, 0)
                on_host = [w for w in alive if w.host == host]
                for w in sorted(on_host, key=lambda w: int(w.wid))[-extra:] if extra > 0 \
                        else []:
                    log(f"stopping worker {w.wid} on {host}: the discovery script lists "
                        f"{listed.get(host, 0)} slot(s) there")
                    w.stopped = True
                    self.stop(w.proc)
                    per_host[host] -= 1
            for host, slots in hosts:
                if not self.blacklist.allows(host, now):
                    continue
                while slots > per_host.get(host, 0) and room > 0:
                    wid = self.start_worker(host)
                    self.joining.append(wid)
                    log(f"started worker {wid} on {host} (new slot)")
                    per_host[host] = per_host.get(host, 0) + 1
                    room -= 1
            ready = self._ready_joiners(len(running))
        if ready:
            self.publish(running + ready, f"worker(s) {ready} joining")


def gloo_timeout(env: Dict[str, str]) -> float:
    """The workers' Gloo timeout in seconds, as their bf.init() reads it from ``env``."""
    for name in ("BLUEFOG_GLOO_TIMEOUT", "HOROVOD_GLOO_TIMEOUT_SECONDS"):
        try:
            value = float(env[name])
        except (KeyError, ValueError):
            continue
        if 0 < value < float("inf"):
            return value
    return _DEFAULT_GLOO_TIMEOUT_S


def main(args, forwarded_env) -> int:
    env = dict(os.environ)
    extra = []
    for item in args.env:
        name, sep, value = item.partition("=")
        if sep:
            env[name] = value
        elif name not in env:
            print(f"bfrun: -x {name}: the variable is not set", file=sys.stderr)
            return 2
        extra.append(name)
    notices = horovod_flags.apply_gloo(args, env)
    if args.timeline:
        notices.append("--timeline-filename: ignored (in-place elastic training renumbers the "
                       "ranks each time the job re-forms)")
    for line in notices:
        print(f"bfrun: {line}", file=sys.stderr)
    sys.stdout.flush()
    sys.stderr.flush()
    return GlooElasticDriver(args, env, extra, forwarded_env).run()
