"""``bfrun``: launch a training script on N processes with Open MPI's ``mpirun``.

    bfrun -np 4 python train.py --epochs 3
    bfrun -np 8 -H server1:4,server2:4 python train.py
    bfrun -np 8 --hostfile hosts.txt python train.py
    bfrun --min-np 2 --max-np 4 -H a:2,b:2 python train.py               # elastic
    bfrun --min-np 2 --host-discovery-script ./hosts.sh python train.py  # elastic
    bfrun --gloo -np 3 --min-np 2 -H localhost:3 python train.py         # elastic, in place

It runs ``mpirun`` with the options bluefog needs (``--bind-to none``, ``--oversubscribe``,
``--allow-run-as-root`` when run as root), forwards the relevant environment variables to every
rank (also on other hosts), and exits with ``mpirun``'s exit status: non-zero when a rank fails.
With ``--min-np`` (elastic mode, bluefog/run/elastic_driver.py) it stays alive instead and
relaunches the job on the hosts that remain or that are discovered; with ``--gloo`` too, the
workers keep running and re-form the job in place (bluefog/run/gloo_elastic.py), which is
also the mode chosen when mpirun is not on PATH (as Horovod's elastic mode, always on Gloo).
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import threading
from typing import Dict, List, Optional, Sequence

from bluefog.common import job_page
from bluefog.run import (
    elastic_driver,
    elastic_hosts,
    gloo_elastic,
    gloo_launch,
    horovod_flags,
    mpirun_output,
)
from bluefog.run.timeline_files import merge_timeline, timeline_to_merge

INSTALL_HINT = ("bfrun starts the ranks with Open MPI's mpirun. Install it, e.g. on Debian/Ubuntu "
                "`sudo apt-get install openmpi-bin` (add libopenmpi-dev to build bluefog), or put "
                "the folder holding mpirun on PATH.")

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")

# With other hosts, Open MPI notices a silent host (power loss, cut link) only through TCP
# keepalive on its out-of-band connections, by default after 300 s idle plus 9 probes 20 s
# apart: about 8 minutes of hanging. These settings end such a job in about 25 s instead.
# Each is left out when --mpi-args sets it.
MULTIHOST_MCA = (("oob_tcp_keepalive_time", "10"), ("oob_tcp_keepalive_intvl", "5"),
                 ("oob_tcp_keepalive_probes", "3"))


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="bfrun",
        description="Run a command on N processes with Open MPI (bluefog's launcher).",
        epilog="Example: bfrun -np 4 python train.py --epochs 3")
    p.add_argument("-np", "-n", "--num-proc", dest="np", type=int,
                   help="number of processes (ranks) to start (elastic mode: at most this "
                        "many at the first launch; default --max-np)")
    p.add_argument("-H", "--hosts", dest="hosts",
                   help="comma-separated hosts with slot counts, e.g. host1:4,host2:4 "
                        "(default: this machine)")
    p.add_argument("-hostfile", "--hostfile", dest="hostfile",
                   help="Open MPI hostfile: one 'host slots=N' per line")
    p.add_argument("--timeline-filename", dest="timeline",
                   help="record a bluefog timeline; sets BLUEFOG_TIMELINE for every rank. A "
                        "name ending in .json (as Horovod's): one file with every rank's "
                        "events, merged when the job ends")
    p.add_argument("--timeline-per-rank", dest="timeline_per_rank", action="store_true",
                   help="keep one timeline file per rank (rank 0 the given name, rank r "
                        "<stem>.rank<r>.json) instead of merging them")
    p.add_argument("--job-page", dest="job_page", metavar="[HOST:]PORT",
                   help="rank 0 serves the live job page (docs/job-page.md) on this port, "
                        "on 127.0.0.1 unless a host is given; sets BLUEFOG_JOB_PAGE for "
                        "every rank")
    p.add_argument("-x", dest="env", action="append", default=[], metavar="NAME[=VALUE]",
                   help="also forward this environment variable (repeatable)")
    p.add_argument("--mpi-args", dest="mpi_args", default="",
                   help="extra arguments for mpirun, as one quoted string")
    e = p.add_argument_group("elastic training (docs/elastic.md); --min-np turns it on")
    e.add_argument("--min-np", dest="min_np", type=int,
                   help="the fewest ranks the job may run on: when hosts are lost, it goes on "
                        "from the last commit with the ranks left, down to this many")
    e.add_argument("--max-np", dest="max_np", type=int,
                   help="the most ranks (default: every available slot, or -np)")
    e.add_argument("--host-discovery-script", dest="host_discovery_script",
                   help="command printing the available hosts, one 'host:slots' per line; run "
                        "every --discovery-interval seconds (instead of -H)")
    e.add_argument("--discovery-interval", dest="discovery_interval", type=float, default=1.0,
                   help="seconds between two runs of the discovery script (default 1)")
    e.add_argument("--discovery-timeout", dest="discovery_timeout", type=float, default=30.0,
                   help="seconds a run of the discovery script may take; a longer one is "
                        "ended and counts as failed (default 30)")
    e.add_argument("--reset-limit", dest="reset_limit", type=int,
                   help="give up after the job re-formed (relaunched over mpirun) this many "
                        "times, for failures and resizes alike (default: no limit)")
    e.add_argument("--blacklist-cooldown-range", dest="blacklist_cooldown_range", type=float,
                   nargs=2, metavar=("MIN", "MAX"),
                   help="a blacklisted host (one where a worker failed) may come back after a "
                        "random MIN..MAX seconds, doubled at each further failure; default: "
                        "never")
    e.add_argument("--elastic-timeout", dest="elastic_timeout", type=float, default=600.0,
                   help="seconds to wait for --min-np slots before giving up (default 600)")
    e.add_argument("--state-dir", dest="state_dir",
                   help="folder (on each host) for the committed state, kept after the job: "
                        "a later bfrun with the same folder resumes from it (default: a "
                        "temporary folder, removed on success)")
    gloo_launch.add_arguments(p)
    p.add_argument("-q", "--quiet", action="store_true",
                   help="do not print the 'starting N ranks on H hosts' line")
    p.add_argument("--verbose", action="store_true", help="print the mpirun command")
    p.add_argument("--dry-run", action="store_true",
                   help="print the mpirun command and exit without running it")
    horovod_flags.add_to(p)
    p.add_argument("command", nargs=argparse.REMAINDER,
                   help="the command each rank runs, e.g. python train.py")
    return p


def _is_open_mpi(mpirun: str, env: Dict[str, str]) -> Optional[bool]:
    """True for Open MPI, False for another MPI, None when the version could not be read."""
    try:
        out = subprocess.run([mpirun, "--version"], capture_output=True, text=True, timeout=30,
                             env=env)
    except (OSError, subprocess.SubprocessError):
        return None
    text = out.stdout + out.stderr
    if "Open MPI" in text or "OpenRTE" in text or "Open RTE" in text:
        return True
    return False if text.strip() else None


def forwarded_env(env: Dict[str, str], extra: Sequence[str] = ()) -> List[str]:
    """Names of the variables of `env` passed to the ranks with `-x`: every variable set, as
    horovodrun forwards them, except the launcher's and the shell's own
    (``horovod_flags.exportable``), plus `extra`."""
    names = [k for k in sorted(env) if _NAME.match(k) and horovod_flags.exportable(k)]
    for k in extra:
        if k not in names:
            names.append(k)
    return names


def build_command(args: argparse.Namespace, mpirun: str, env: Dict[str, str]) -> List[str]:
    """The mpirun command line for the parsed bfrun arguments (env may be updated)."""
    cmd = [mpirun, "-np", str(args.np), "--bind-to", "none", "--oversubscribe"]
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        cmd.append("--allow-run-as-root")
    if args.hosts:
        cmd += ["-H", args.hosts]
    if args.hostfile:
        cmd += ["--hostfile", args.hostfile]
    extra = []
    for item in args.env:
        name, sep, value = item.partition("=")
        if not _NAME.match(name):
            raise SystemExit(f"bfrun: -x {item!r}: not a valid environment variable name")
        if sep:
            env[name] = value
        elif name not in env:
            raise SystemExit(f"bfrun: -x {name}: the variable is not set")
        extra.append(name)
    horovod_mpi, notices = horovod_flags.apply(args, env)
    for line in notices:
        print(f"bfrun: {line}", file=sys.stderr)
    if args.timeline:
        env["BLUEFOG_TIMELINE"] = args.timeline
    cmd += horovod_mpi
    for name in forwarded_env(env, extra):
        cmd += ["-x", name]
    user_args = shlex.split(args.mpi_args)
    if args.hosts or args.hostfile:
        for name, value in MULTIHOST_MCA:
            if name not in user_args:
                cmd += ["--mca", name, value]
    cmd += user_args
    cmd += args.command
    return cmd


def hosts_used(np_: int, hosts: Optional[str], hostfile: Optional[str]) -> Optional[int]:
    """How many hosts Open MPI's default mapping (by slot, hosts in order) puts `np_` ranks on;
    None when the hostfile cannot be read (mpirun then says why)."""
    if hosts:
        return len(elastic_hosts.assign(elastic_hosts.parse_host_spec(hosts), np_))
    if not hostfile:
        return 1
    try:
        with open(hostfile) as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    slots = []
    for line in lines:
        words = line.split("#", 1)[0].split()
        if words:
            counts = [w.partition("=")[2] for w in words[1:] if w.startswith("slots=")]
            slots.append((words[0], int(counts[0]) if counts and counts[0].isdigit() else 1))
    return len(elastic_hosts.assign(slots, np_)) or None


def _run_child(mpirun: str, cmd: List[str], env: Dict[str, str], path: Optional[str],
               np_: int, whole_lines: bool) -> int:
    """Runs mpirun as a child (not in bfrun's place) and returns its status; merges the
    timeline at ``path`` when it ends, and with ``whole_lines`` passes its output through
    ``mpirun_output`` (mpirun tags each chunk a rank writes; bfrun prints whole lines). SIGTERM
    and SIGHUP are passed on to mpirun; so is SIGINT unless bfrun runs in the terminal's
    foreground (where Ctrl-C reaches mpirun directly)."""
    pipe = subprocess.PIPE if whole_lines else None
    proc = subprocess.Popen(cmd, env=env, executable=mpirun, stdout=pipe, stderr=pipe,
                            preexec_fn=elastic_driver.end_with(os.getpid()))
    pumps = [threading.Thread(target=mpirun_output.pump, args=(stream, sink), daemon=True)
             for stream, sink in ((proc.stdout, sys.stdout.buffer),
                                  (proc.stderr, sys.stderr.buffer)) if stream is not None]
    for t in pumps:
        t.start()

    def forward(signum, _frame):
        if signum == signal.SIGINT:
            try:
                if os.tcgetpgrp(sys.stdin.fileno()) == os.getpgrp():
                    return
            except (OSError, ValueError):
                pass
        if proc.poll() is None:
            proc.send_signal(signum)

    handled = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    old = {s: signal.signal(s, forward) for s in handled}
    try:
        code = proc.wait()
        for t in pumps:
            t.join()
    finally:
        for s, h in old.items():
            signal.signal(s, h)
    if path:
        merge_timeline(path, np_)
    return 128 - code if code < 0 else code


def _elastic_requested(args: argparse.Namespace) -> bool:
    return any(v is not None for v in (args.min_np, args.max_np, args.host_discovery_script,
                                        args.reset_limit, args.blacklist_cooldown_range,
                                        args.state_dir))


def _run_elastic(args: argparse.Namespace, mpirun: str, env: Dict[str, str]) -> int:
    command = args.command

    def launch_command(hosts, np_, launch_env):
        one = argparse.Namespace(**vars(args))
        one.np, one.hosts, one.hostfile, one.command = np_, elastic_hosts.host_spec(hosts), None, []
        return build_command(one, mpirun, launch_env)

    return elastic_driver.ElasticDriver(args, command, env, launch_command).run()


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = _parser().parse_args(argv)
    if args.version or args.check_build:
        print(horovod_flags.env_for_check_build() if args.check_build
              else horovod_flags.version_text())
        return 0
    if args.command and args.command[0] == "--":
        args.command = args.command[1:]
    if not args.command:
        print("bfrun: no command given; usage: bfrun -np N python train.py", file=sys.stderr)
        return 2
    elastic = _elastic_requested(args)
    if elastic and args.gloo and args.np and not (args.hosts or args.host_discovery_script):
        args.hosts = f"localhost:{args.np}"  # as bfrun --gloo -np N without -H
    if elastic:
        problem = elastic_driver.check_args(args)
        if problem:
            print(f"bfrun: {problem}", file=sys.stderr)
            return 2
    elif args.np is None:
        print("bfrun: -np N is required (the number of ranks), or --min-np for elastic "
              "training", file=sys.stderr)
        return 2
    problem = horovod_flags.check(args)
    if problem:
        print(f"bfrun: {problem}", file=sys.stderr)
        return 2
    if args.np is not None and not 1 <= args.np <= elastic_hosts.MAX_SLOTS:
        print(f"bfrun: -np must be from 1 to {elastic_hosts.MAX_SLOTS} (the number of ranks), "
              f"got {args.np}", file=sys.stderr)
        return 2
    if args.hosts and not elastic:  # elastic mode checked them above
        try:
            elastic_hosts.parse_host_spec(args.hosts)
        except ValueError as e:
            print(f"bfrun: {e}", file=sys.stderr)
            return 2
    if args.job_page is not None:
        try:
            job_page.parse_address(args.job_page, "--job-page")
        except ValueError as e:
            print(f"bfrun: {e}", file=sys.stderr)
            return 2
        os.environ[job_page.VARIABLE] = args.job_page  # forwarded to the ranks as all set
    if args.hostfile and not os.path.isfile(args.hostfile):
        print(f"bfrun: hostfile {args.hostfile!r} does not exist", file=sys.stderr)
        return 2

    no_mpirun = shutil.which("mpirun", path=os.environ.get("PATH", os.defpath)) is None
    if elastic and not args.gloo and no_mpirun:
        # Horovod's elastic mode runs on Gloo: without mpirun, so does bfrun's.
        print("bfrun: elastic: mpirun not found on PATH: running the job in place on Gloo "
              "(as with --gloo)", file=sys.stderr, flush=True)
        args.gloo = True
    if args.gloo:
        if elastic:
            if args.state_dir:
                print("bfrun: --state-dir: an option of the relaunching elastic mode (over "
                      "mpirun); --gloo keeps the workers running and the commits in memory",
                      file=sys.stderr)
                return 2
            return gloo_elastic.main(args, forwarded_env)
        return gloo_launch.main(args, forwarded_env)

    env = dict(os.environ)
    mpirun = shutil.which("mpirun", path=env.get("PATH", os.defpath))
    if mpirun is None:
        print(f"bfrun: mpirun was not found on PATH. {INSTALL_HINT}", file=sys.stderr)
        return 127
    if _is_open_mpi(mpirun, env) is False:
        print(f"bfrun: {mpirun} is not Open MPI's mpirun. {INSTALL_HINT}", file=sys.stderr)
        return 127

    if elastic:
        if args.dry_run:
            print("bfrun: --dry-run is not available in elastic mode (each launch depends on "
                  "the hosts of the moment)", file=sys.stderr)
            return 2
        return _run_elastic(args, mpirun, env)
    cmd = build_command(args, mpirun, env)
    if args.verbose or args.dry_run:
        print("bfrun: " + " ".join(shlex.quote(c) for c in cmd), file=sys.stderr, flush=True)
    if args.dry_run:
        return 0
    if not args.quiet:
        print(elastic_hosts.starting_line(args.np, hosts_used(args.np, args.hosts, args.hostfile)),
              file=sys.stderr)
    sys.stdout.flush()
    sys.stderr.flush()
    merged = timeline_to_merge(args, env)
    # mpirun's --tag-output tags chunks, not lines (a traceback comes out shredded): bfrun
    # reads its output and prints whole lines. Not with timestamps, whose format is mpirun's.
    whole_lines = bool(args.tag_output) and not args.timestamp_output
    if merged or whole_lines:
        return _run_child(mpirun, cmd, env, merged, args.np, whole_lines)
    try:
        # mpirun takes bfrun's place: signals (Ctrl-C) reach it directly, and its exit status,
        # non-zero when a rank fails, is bfrun's.
        os.execve(mpirun, cmd, env)
    except OSError as e:
        print(f"bfrun: could not run {mpirun}: {e}", file=sys.stderr)
        return 127
    return 0  # not reached


if __name__ == "__main__":
    sys.exit(main())
