"""What rank 0's job page knows: the ranks, each rank's reports over time, the straggler,
the elastic rounds. Pure Python: the training side records, the server's threads read.

Each report is one row per rank of ``FIELDS`` (cumulative counts; rank 0 takes differences).
The straggler is the rank the others wait for: per report interval each rank's *compute time
per step* is its step time less its share of the interval spent waiting for the other ranks
(``bf.flight_recorder``'s queued time). The rank with the highest compute time in at least
``STRAGGLER_WINS`` of the last ``STRAGGLER_WINDOW`` intervals, and at least 10% above the
median of the ranks in the latest one, is named.
"""

from __future__ import annotations

import collections
import math
import statistics
import threading
import time
from typing import Any, Callable, Dict, List, Optional

FIELDS = ("steps", "step_seconds", "bytes", "operations", "waiting_seconds", "interval_seconds",
          "elastic_round", "stalled", "oldest_pending_seconds")
HISTORY = 600
STRAGGLER_WINDOW = 5
STRAGGLER_WINS = 4
STRAGGLER_MARGIN = 0.10


class JobState:
    """Thread-safe: ``record`` from the training thread, the rest from the server's."""

    def __init__(self, history: int = HISTORY):
        self._lock = threading.Lock()
        self._history = history
        self.hosts: List[str] = []
        self.started = time.time()
        self._points: Dict[int, collections.deque] = {}
        self._last: Dict[int, List[float]] = {}
        self._leaders: collections.deque = collections.deque(maxlen=STRAGGLER_WINDOW)
        self._straggler: Optional[int] = None
        self.rounds: List[Dict[str, Any]] = []
        self.reports = 0

    def set_ranks(self, hosts: List[str], elastic_round: int) -> None:
        """A new job (the first, or one after an elastic reset) of ``len(hosts)`` ranks."""
        with self._lock:
            self.rounds.append({"time": time.time(), "round": elastic_round,
                                "size": len(hosts)})
            del self.rounds[:-100]
            self.hosts = list(hosts)
            self._points = {r: self._points.get(r, collections.deque(maxlen=self._history))
                            for r in range(len(hosts))}
            self._last = {}
            self._leaders.clear()
            self._straggler = None

    def record(self, rows: List[List[float]], now: Optional[float] = None) -> None:
        """One report: ``rows[r]`` is rank r's ``FIELDS``."""
        now = time.time() if now is None else now
        with self._lock:
            self.reports += 1
            compute = {}
            for r, row in enumerate(rows[:len(self.hosts)]):
                v = dict(zip(FIELDS, (float(x) for x in row)))
                last = self._last.get(r)
                self._last[r] = row
                if last is None:
                    continue
                prev = dict(zip(FIELDS, last))
                wall = max(v["interval_seconds"], 1e-9)
                share = min(max((v["waiting_seconds"] - prev["waiting_seconds"]) / wall, 0.0), 1)
                point = {"time": now, "step": v["steps"], "step_seconds": v["step_seconds"],
                         "bytes_per_second": max(v["bytes"] - prev["bytes"], 0) / wall,
                         "bytes": v["bytes"], "waiting_share": share,
                         "compute_seconds": v["step_seconds"] * (1.0 - share),
                         "stalled": int(v["stalled"]),
                         "oldest_pending_seconds": v["oldest_pending_seconds"]}
                self._points[r].append(point)
                compute[r] = point["compute_seconds"]
            self._judge(compute)

    def _judge(self, compute: Dict[int, float]) -> None:
        if len(compute) < 2 or len(compute) != len(self.hosts):
            return
        leader = max(compute, key=lambda r: compute[r])
        self._leaders.append(leader)
        median = statistics.median(compute.values())
        wins = sum(1 for r in self._leaders if r == leader)
        clear = compute[leader] > (1.0 + STRAGGLER_MARGIN) * median
        self._straggler = leader if wins >= STRAGGLER_WINS and clear else None

    @property
    def straggler(self) -> Optional[int]:
        with self._lock:
            return self._straggler

    def latest(self) -> Dict[int, Dict[str, Any]]:
        with self._lock:
            return {r: dict(p[-1]) for r, p in self._points.items() if p}

    def snapshot(self, since: float = 0.0) -> Dict[str, Any]:
        """Everything the page draws (points newer than ``since``), JSON-ready."""
        with self._lock:
            return {"hosts": list(self.hosts), "started": self.started,
                    "reports": self.reports, "straggler": self._straggler,
                    "rounds": list(self.rounds),
                    "points": {str(r): [p for p in pts if p["time"] > since]
                               for r, pts in self._points.items()}}


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _number(x: float) -> str:
    if math.isnan(x):
        return "NaN"
    if math.isinf(x):
        return "+Inf" if x > 0 else "-Inf"
    return repr(float(x))


_METRICS = (
    ("bluefog_step_seconds", "gauge", "Mean step time over the last report interval.",
     "step_seconds"),
    ("bluefog_steps_total", "counter", "Steps this rank has reported.", "step"),
    ("bluefog_sent_bytes_total", "counter",
     "Bytes of the tensors this rank handed to collectives and window operations.", "bytes"),
    ("bluefog_bytes_per_second", "gauge", "Collective bytes per second over the last interval.",
     "bytes_per_second"),
    ("bluefog_waiting_share", "gauge",
     "Share of the last interval this rank waited for the other ranks.", "waiting_share"),
    ("bluefog_compute_seconds", "gauge", "Step time less the waiting: the straggler's is highest.",
     "compute_seconds"),
    ("bluefog_stalled_operations", "gauge",
     "Operations pending longer than BLUEFOG_STALL_CHECK_TIME.", "stalled"),
)


def metrics_text(state: JobState, rank0_stalls: Callable[[], List[Dict[str, Any]]]) -> str:
    """The state in Prometheus' text exposition format (version 0.0.4)."""
    latest = state.latest()
    hosts = state.snapshot(since=math.inf)["hosts"]
    lines = ["# HELP bluefog_ranks Ranks in the job.", "# TYPE bluefog_ranks gauge",
             f"bluefog_ranks {len(hosts)}",
             "# HELP bluefog_rank_info The host of each rank.", "# TYPE bluefog_rank_info gauge"]
    lines += [f'bluefog_rank_info{{rank="{r}",host="{_label(h)}"}} 1'
              for r, h in enumerate(hosts)]
    for name, kind, help_text, key in _METRICS:
        lines += [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"]
        lines += [f'{name}{{rank="{r}"}} {_number(p[key])}' for r, p in sorted(latest.items())]
    straggler = state.straggler
    lines += ["# HELP bluefog_straggler The rank the others wait for (-1: none).",
              "# TYPE bluefog_straggler gauge",
              f"bluefog_straggler {-1 if straggler is None else straggler}",
              "# HELP bluefog_elastic_rounds_total Jobs (elastic rounds) this page has seen.",
              "# TYPE bluefog_elastic_rounds_total counter",
              f"bluefog_elastic_rounds_total {len(state.rounds)}",
              "# HELP bluefog_rank0_pending_operations Rank 0's pending operations, now.",
              "# TYPE bluefog_rank0_pending_operations gauge",
              f"bluefog_rank0_pending_operations {len(rank0_stalls())}"]
    return "\n".join(lines) + "\n"
