"""Pure logic of the elastic driver: hosts, slots, the blacklist, and reading mpirun's verdict.

Nothing here starts a process: all of it is tested without MPI (tests/python/test_elastic_hosts.py).
"""

from __future__ import annotations

import random
import re
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

Hosts = List[Tuple[str, int]]  # (host, slots), in launch order

_HOST = re.compile(r"^[A-Za-z0-9_.\-\[\]:]+$")
# The most ranks a job, or slots a host, may have: a count beyond it is a typo (or a value
# wrapped around), and starting that many processes would never end.
MAX_SLOTS = 65536


def parse_host_spec(spec: str, what: str = "-H") -> Hosts:
    """``host1:2,host2`` -> [("host1", 2), ("host2", 1)]. Raises ValueError with the reason."""
    hosts: Hosts = []
    for item in spec.split(","):
        item = item.strip()
        if not item:
            continue
        hosts.append(_parse_one(item, what))
    if not hosts:
        raise ValueError(f"{what} {spec!r}: no hosts")
    return _merge(hosts, what)


def parse_discovery_output(text: str) -> Hosts:
    """The hosts a discovery script printed: one ``host`` or ``host:slots`` per line.

    Blank lines and lines starting with ``#`` are ignored. Raises ValueError naming the bad line.
    """
    hosts: Hosts = []
    for n, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        hosts.append(_parse_one(line, f"discovery script line {n}"))
    return _merge(hosts, "discovery script")


def _parse_one(item: str, what: str) -> Tuple[str, int]:
    host, sep, slots = item.rpartition(":")
    if sep and not slots.isdigit() and item.count(":") == 1:  # (an IPv6 address has several)
        raise ValueError(f"{what}: {item!r}: {slots!r} is not a number of slots; write "
                         f"'host' or 'host:slots'")
    if not sep or not slots.isdigit():
        host, slots = item, "1"
    if not host or not _HOST.match(host):
        raise ValueError(f"{what}: {item!r} is not 'host' or 'host:slots'")
    if int(slots) < 1:
        raise ValueError(f"{what}: {item!r} has {slots} slots; a host needs at least 1")
    if int(slots) > MAX_SLOTS:
        raise ValueError(f"{what}: {item!r} has {slots} slots; a host takes at most "
                         f"{MAX_SLOTS}")
    return host, int(slots)


def _merge(hosts: Hosts, what: str) -> Hosts:
    seen: Dict[str, int] = {}
    for host, slots in hosts:
        if host in seen:
            raise ValueError(f"{what}: host {host!r} is listed twice")
        seen[host] = slots
    return list(seen.items())


def assign(hosts: Hosts, max_np: Optional[int]) -> Hosts:
    """The slots a launch uses: hosts in order, each with its slots, up to ``max_np`` in all."""
    out: Hosts = []
    left = max_np if max_np is not None else sum(s for _, s in hosts)
    for host, slots in hosts:
        if left <= 0:
            break
        take = min(slots, left)
        out.append((host, take))
        left -= take
    return out


def total_slots(hosts: Hosts) -> int:
    return sum(s for _, s in hosts)


def host_spec(hosts: Hosts) -> str:
    """The ``-H`` argument of mpirun for these hosts."""
    return ",".join(f"{h}:{s}" for h, s in hosts)


def rank_hosts(hosts: Hosts) -> List[str]:
    """Host of each rank: Open MPI's default mapping (by slot) fills the hosts in order."""
    return [h for h, s in hosts for _ in range(s)]


class Blacklist:
    """Hosts that failed. Without a cooldown range they stay out for good; with one, a host
    comes back after a random wait in [low, high] seconds, doubled at each further failure
    (a host that keeps failing is tried less and less often)."""

    def __init__(self, cooldown: Optional[Tuple[float, float]] = None, seed: Optional[int] = None):
        self._cooldown = cooldown
        self._failures: Dict[str, int] = {}
        self._until: Dict[str, float] = {}
        self._rng = random.Random(seed)

    def add(self, host: str, now: float) -> None:
        self._failures[host] = self._failures.get(host, 0) + 1
        if self._cooldown is None:
            self._until[host] = float("inf")
        else:
            low, high = self._cooldown
            wait = self._rng.uniform(low, high) * 2 ** (self._failures[host] - 1)
            self._until[host] = now + wait

    def until(self, host: str) -> float:
        """When ``host`` may be used again (inf: never; 0: not blacklisted)."""
        return self._until.get(host, 0.0)

    def allows(self, host: str, now: float) -> bool:
        return now >= self._until.get(host, 0.0)

    def filter(self, hosts: Hosts, now: float) -> Hosts:
        return [(h, s) for h, s in hosts if self.allows(h, now)]

    def waiting(self, now: float) -> List[str]:
        """Hosts out for now but due back (a cooldown)."""
        return [h for h, t in self._until.items() if now < t != float("inf")]

    def excluded(self, now: float) -> List[str]:
        return [h for h, t in self._until.items() if now < t]

    def __contains__(self, host: str) -> bool:
        return host in self._until


# What Open MPI 4.1's mpirun prints when a job ends because one process or one daemon was lost.
_SIGNAL = re.compile(r"process rank (\d+) with PID \d+ on node (\S+) exited on signal (\d+)")
_EXIT = re.compile(r"Process name:\s*\[\[\d+,\d+\],(\d+)\]\s*\n?\s*Exit code:\s*(\d+)")
_LOST_DAEMON = re.compile(r"Remote daemon:\s*\[\[\d+,\d+\],(\d+)\]\s*on node\s*(\S+)")
_DAEMON_FAILED = re.compile(r"daemon.*?on node\s+(\S+)", re.IGNORECASE)
# A rank that exits through Python shuts bluefog down first, and the others fail with this
# (docs/errors.md); mpirun then reports whichever rank exited first, often a survivor.
_SHUT_DOWN = re.compile(r"bluefog has been shut down \(rank (\d+) shut down")


def find_failures(output: str, launched: Hosts) -> List[Tuple[str, str]]:
    """The (host, reason) pairs mpirun's output blames for the end of a job, in the order it
    reported them; empty when it names nobody. ``launched`` maps ranks to hosts."""
    ranks = rank_hosts(launched)
    names = [h for h, _ in launched]
    found: List[Tuple[str, str]] = []

    def add(host: Optional[str], reason: str) -> None:
        if host is not None and all(host != h for h, _ in found):
            found.append((host, reason))

    def host_of_node(node: str) -> Optional[str]:
        node = node.rstrip(".,")
        if node in names:
            return node
        short = [h for h in names if h.split(".")[0] == node.split(".")[0]]
        return short[0] if len(short) == 1 else None

    for m in _LOST_DAEMON.finditer(output):
        add(host_of_node(m.group(2)), f"lost contact with the host's daemon (node {m.group(2)})")
    for m in _SIGNAL.finditer(output):
        r = int(m.group(1))
        host = ranks[r] if r < len(ranks) else host_of_node(m.group(2))
        add(host, f"rank {r} exited on signal {m.group(3)}")
    for m in _SHUT_DOWN.finditer(output):
        r = int(m.group(1))
        if r < len(ranks):
            add(ranks[r], f"rank {r} shut down while the others still ran")
    for m in _EXIT.finditer(output):
        if _SHUT_DOWN.search(output):
            break
        r, code = int(m.group(1)), int(m.group(2))
        if r < len(ranks):
            add(ranks[r], f"rank {r} exited with status {code}")
    if not found:
        for m in _DAEMON_FAILED.finditer(output):
            add(host_of_node(m.group(1)), f"its daemon failed (node {m.group(1)})")
    return found


def describe(hosts: Iterable[Tuple[str, str]]) -> str:
    return "; ".join(f"{h} ({why})" for h, why in hosts)


def changed(a: Sequence[Tuple[str, int]], b: Sequence[Tuple[str, int]]) -> bool:
    """Whether two slot assignments differ (a new order alone is no reason to relaunch)."""
    return sorted(a) != sorted(b)


def starting_line(np_: int, hosts: Optional[int]) -> str:
    """What bfrun prints as it starts a job of `np_` ranks on `hosts` hosts (None: not known);
    left out with -q."""
    ranks = f"{np_} rank{'s' if np_ != 1 else ''}"
    where = f" on {hosts} host{'s' if hosts != 1 else ''}" if hosts else ""
    return f"bfrun: starting {ranks}{where}"
