"""What the in-place elastic driver (``gloo_elastic.py``) reads of its workers' progress in the
store it serves: who reached a round's rendezvous, who returned from the training function,
who reported a failed collective (the keys: ``bluefog/common/elastic_rounds.py``).

Two decisions rest on it, both about a worker the others would otherwise wait for:

* **A hung worker** (stopped, frozen) leaves the others waiting in their next collective,
  with no error: the negotiation waits for a rank busy elsewhere as long as it takes. Each
  worker's heartbeat (``elastic/alive/<id>``, every second from a thread of its own) tells it
  apart from a busy one: a worker not heard from for ``deadline`` seconds is killed by the
  driver and so lost, and the others re-form without it (the deadline is half the workers'
  ``BLUEFOG_GLOO_TIMEOUT``, at least 5 s).
* **A worker that finished** (its training function returned, e.g. on an uneven shard) leaves
  the others waiting for its collectives; once they report the failure or wait in a newer
  round, the job ends, as Horovod's driver ends it when a worker succeeds.
"""

from __future__ import annotations

from typing import Dict, List, Optional, Set, Tuple

from bluefog.common import elastic_rounds


class RoundWatch:
    def __init__(self, store, deadline: float):
        self.store = store
        self.deadline = deadline
        self.history: Dict[int, List[str]] = {}  # every round's members, in rank order
        self.round = -1
        self.beats: Dict[str, Tuple[Optional[bytes], float]] = {}  # last value, seen when

    def published(self, n: int, members: List[str]) -> None:
        self.round = n
        self.history[n] = list(members)

    def arrived(self, n: int) -> List[str]:
        """The members of round ``n`` that reached its Gloo rendezvous (each rank sets
        ``bluefog/arrived/<rank>`` under the round's prefix when it does)."""
        key = elastic_rounds.prefix(n) + "bluefog/arrived/"
        return [w for r, w in enumerate(self.history.get(n, []))
                if self.store.get(f"{key}{r}") is not None]

    def joined_round(self, wid: str) -> int:
        """The newest round whose rendezvous worker ``wid`` reached (-1: none)."""
        for n in range(self.round, -1, -1):
            if wid in self.arrived(n):
                return n
        return -1

    def rank_in(self, wid: str, n: int) -> str:
        members = self.history.get(n, [])
        return f"rank {members.index(wid)} of round {n}" if wid in members else "in no round"

    # -- hung workers --------------------------------------------------------------------------

    def silent(self, now: float, alive: List[str]) -> List[str]:
        """Those of ``alive`` (running workers) whose heartbeat has not changed for more than
        the deadline, by this process's clock. A worker beats from its first bf.init() on
        (one that never beat yet may still be importing its modules)."""
        late = []
        for wid in alive:
            value = self.store.get(f"elastic/alive/{wid}")
            seen = self.beats.get(wid)
            if seen is None or seen[0] != value:
                self.beats[wid] = (value, now)
            elif value is not None and now - seen[1] > self.deadline:
                late.append(wid)
        return late

    # -- finished workers ----------------------------------------------------------------------

    def finished(self, exited_ok: Set[str]) -> Dict[str, int]:
        """The current members whose training function returned (or, in ``exited_ok``, whose
        process exited 0), with the round each was last in then."""
        done = {}
        for wid in self.history.get(self.round, []):
            value = self.store.get(f"elastic/finished/{wid}")
            if value is not None:
                done[wid] = int(value)
            elif wid in exited_ok:
                done[wid] = self.joined_round(wid)
        return done

    def waiting_for(self, finished: Dict[str, int], unfinished: List[str]) -> List[str]:
        """Those of ``unfinished`` that wait for a finished worker: they reported a failed
        collective, or reached a round, after it finished."""
        first = min(finished.values())
        failed = {w: self.store.get(f"elastic/failed/{w}") for w in unfinished}
        return [w for w in unfinished
                if failed[w] is not None and int(failed[w]) >= first
                or self.joined_round(w) > first]
