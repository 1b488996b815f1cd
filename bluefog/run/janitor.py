"""Ends a launcher's ranks when the launcher dies without ending them (SIGKILL, a crash).

The launcher (bfrun --gloo, its elastic driver, bluefog.run) starts each rank in a process
group of its own and ends those groups itself when it can. PR_SET_PDEATHSIG covers its death
only for each rank's first process: a rank started as a wrapper script (``bfrun ./train.sh``)
loses the script, and the script's Python child would train on with parent 1. So the launcher
also starts this script, as a process of its own session, and writes to its standard input
one line per group: ``+PGID`` when a rank's group starts, ``-PGID`` when the launcher has
reaped that rank (its number may be reused from then on). Standard input ends when the launcher
exits, however it exits: the groups still listed then are sent SIGTERM, and SIGKILL after the
grace period (argv[1], seconds) to whatever is left.

Only the standard library, and run as a file, not a module of the package: it starts fast and
needs nothing else on the path.
"""

import os
import signal
import sys
import time


def _alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except OSError:
        return False


def _end(groups, grace_s: float) -> None:
    for pgid in groups:
        try:
            os.killpg(pgid, signal.SIGTERM)
        except OSError:
            pass
    deadline = time.monotonic() + grace_s
    left = [g for g in groups if _alive(g)]
    while left and time.monotonic() < deadline:
        time.sleep(0.05)
        left = [g for g in left if _alive(g)]
    for pgid in left:
        try:
            os.killpg(pgid, signal.SIGKILL)
        except OSError:
            pass


def main() -> int:
    # The launcher's signals are the launcher's to handle (it ends the ranks itself); this
    # process only acts once the launcher is gone.
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    grace_s = float(sys.argv[1]) if len(sys.argv) > 1 else 5.0
    groups = set()
    for line in sys.stdin:
        line = line.strip()
        if len(line) > 1 and line[0] in "+-" and line[1:].isdigit():
            pgid = int(line[1:])
            if line[0] == "+":
                groups.add(pgid)
            else:
                groups.discard(pgid)
    _end(sorted(groups), grace_s)
    return 0


if __name__ == "__main__":
    sys.exit(main())
