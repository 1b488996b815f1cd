"""``bfrun``: launch a training script on N processes with Open MPI's ``mpirun``.

    bfrun -np 4 python train.py --epochs 3
    bfrun -np 8 -H server1:4,server2:4 python train.py
    bfrun -np 8 --hostfile hosts.txt python train.py

It runs ``mpirun`` with the options bluefog needs (``--bind-to none``, ``--oversubscribe``,
``--allow-run-as-root`` when run as root), forwards the relevant environment variables to every
rank (also on other hosts), and exits with ``mpirun``'s exit status: non-zero when a rank fails.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import shutil
import subprocess
import sys
from typing import Dict, List, Optional, Sequence

# Forwarded to the ranks with `-x` when set: exact names, and every name with these prefixes.
FORWARDED_NAMES = ("PATH", "LD_LIBRARY_PATH", "LD_PRELOAD", "PYTHONPATH", "PYTHONHOME",
                   "PYTHONUNBUFFERED", "VIRTUAL_ENV", "CONDA_PREFIX", "HOME", "USER", "LANG",
                   "LC_ALL", "TMPDIR")
FORWARDED_PREFIXES = ("BLUEFOG_", "TF_", "OMP_", "KMP_", "MKL_", "KERAS_", "CUDA_", "NCCL_",
                      "XLA_", "PYTHON")

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
    p.add_argument("-np", "-n", "--num-proc", dest="np", type=int, required=True,
                   help="number of processes (ranks) to start")
    p.add_argument("-H", "--hosts", dest="hosts",
                   help="comma-separated hosts with slot counts, e.g. host1:4,host2:4 "
                        "(default: this machine)")
    p.add_argument("--hostfile", dest="hostfile",
                   help="Open MPI hostfile: one 'host slots=N' per line")
    p.add_argument("--timeline-filename", dest="timeline",
                   help="record a bluefog timeline; sets BLUEFOG_TIMELINE for every rank")
    p.add_argument("-x", dest="env", action="append", default=[], metavar="NAME[=VALUE]",
                   help="also forward this environment variable (repeatable)")
    p.add_argument("--mpi-args", dest="mpi_args", default="",
                   help="extra arguments for mpirun, as one quoted string")
    p.add_argument("--verbose", action="store_true", help="print the mpirun command")
    p.add_argument("--dry-run", action="store_true",
                   help="print the mpirun command and exit without running it")
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
    """Names of the variables of `env` passed to the ranks with `-x`."""
    names = [k for k in sorted(env) if _NAME.match(k) and (
        k in FORWARDED_NAMES or k.startswith(FORWARDED_PREFIXES))]
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
    if args.timeline:
        env["BLUEFOG_TIMELINE"] = args.timeline
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


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = _parser().parse_args(argv)
    if args.command and args.command[0] == "--":
        args.command = args.command[1:]
    if not args.command:
        print("bfrun: no command given; usage: bfrun -np N python train.py", file=sys.stderr)
        return 2
    if args.np < 1:
        print(f"bfrun: -np must be >= 1, got {args.np}", file=sys.stderr)
        return 2
    if args.hostfile and not os.path.isfile(args.hostfile):
        print(f"bfrun: hostfile {args.hostfile!r} does not exist", file=sys.stderr)
        return 2

    env = dict(os.environ)
    mpirun = shutil.which("mpirun", path=env.get("PATH", os.defpath))
    if mpirun is None:
        print(f"bfrun: mpirun was not found on PATH. {INSTALL_HINT}", file=sys.stderr)
        return 127
    if _is_open_mpi(mpirun, env) is False:
        print(f"bfrun: {mpirun} is not Open MPI's mpirun. {INSTALL_HINT}", file=sys.stderr)
        return 127

    cmd = build_command(args, mpirun, env)
    if args.verbose or args.dry_run:
        print("bfrun: " + " ".join(shlex.quote(c) for c in cmd), file=sys.stderr, flush=True)
    if args.dry_run:
        return 0
    sys.stdout.flush()
    sys.stderr.flush()
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
