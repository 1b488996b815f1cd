"""Process sets: collectives over a subset of the ranks, as Horovod's ``hvd.ProcessSet``.

A set is registered on every rank (``add_process_set``, collectively, in the same order on
every rank: ranks that pass different sets get an error), and then gets its own communicator
and its own background thread in the core, so ranks outside it never block on its
collectives and two sets run concurrently. Pass ``process_set=`` to a collective (allreduce,
grouped_allreduce, allgather, broadcast, alltoall, reducescatter, grouped_reducescatter) or to
``DistributedGradientTape`` / ``DistributedOptimizer``; only the set's ranks may call it.
Averages divide by the set's size; ``broadcast``'s ``root_rank`` is a job-wide rank.
"""

from __future__ import annotations

import threading
from typing import Dict, List, Optional, Sequence, Union

from bluefog.common import basics

__all__ = ["ProcessSet", "global_process_set", "add_process_set", "remove_process_set",
           "process_set_by_id"]


class ProcessSet:
    """A set of ranks. ``process_set_id`` is None until the set is registered."""

    def __init__(self, ranks: Sequence[int]):
        try:
            values = [int(r) for r in ranks]
        except (TypeError, ValueError):
            raise TypeError(f"bluefog ProcessSet: ranks must be a sequence of ints, got "
                            f"{ranks!r}") from None
        self.ranks: List[int] = sorted(set(values))
        self.process_set_id: Optional[int] = None

    def size(self) -> Optional[int]:
        """The number of ranks in the set (None before it is registered)."""
        if self.process_set_id is None:
            return None
        return len(self.ranks)

    def rank(self) -> Optional[int]:
        """This process's index in the set, -1 when it is not in it (None before it is
        registered)."""
        if self.process_set_id is None:
            return None
        return self.ranks.index(basics.rank()) if self.included() else -1

    def included(self) -> Optional[bool]:
        """Whether this process is in the set (None before it is registered)."""
        if self.process_set_id is None:
            return None
        return basics.rank() in self.ranks

    def __repr__(self) -> str:
        return f"ProcessSet(process_set_id={self.process_set_id}, ranks={self.ranks})"


class _GlobalProcessSet(ProcessSet):
    """Every rank of the job (id 0): the default of every collective."""

    def __init__(self):
        super().__init__([])
        self.process_set_id = 0

    @property
    def ranks(self) -> List[int]:
        return list(range(basics.size())) if basics.is_initialized() else []

    @ranks.setter
    def ranks(self, value) -> None:  # set by ProcessSet.__init__; the ranks come from the job
        pass

    def __repr__(self) -> str:
        return "ProcessSet(process_set_id=0, ranks=all)"


global_process_set = _GlobalProcessSet()
_lock = threading.Lock()
_registered: Dict[int, ProcessSet] = {0: global_process_set}


def add_process_set(process_set: Union[ProcessSet, Sequence[int]]) -> ProcessSet:
    """Registers ``process_set`` (a ProcessSet or a list of ranks) and returns it.

    Collective over every rank of the job: each must call it with the same ranks, in the same
    order of calls. Raises ValueError for ranks outside the job or a set registered already,
    and BluefogError when ranks disagree.
    """
    if not isinstance(process_set, ProcessSet):
        process_set = ProcessSet(process_set)
    if process_set.process_set_id is not None:
        raise ValueError(f"bluefog add_process_set: {process_set} is registered already")
    if not basics.is_initialized():
        raise ValueError("bluefog add_process_set: bluefog is not initialized; call bf.init() "
                         "first")
    bad = [r for r in process_set.ranks if not 0 <= r < basics.size()]
    if bad or not process_set.ranks:
        raise ValueError(f"rank {basics.rank()}: bluefog add_process_set: ranks "
                         f"{process_set.ranks} must be a non-empty list of ranks in "
                         f"[0, {basics.size()})")
    set_id = basics.add_process_set_ranks(process_set.ranks)
    process_set.process_set_id = set_id
    with _lock:
        _registered[set_id] = process_set
    return process_set


def remove_process_set(process_set: ProcessSet) -> bool:
    """Removes a registered set on every rank (collective, like ``add_process_set``).

    Its pending collectives fail; the ProcessSet can be registered again. Returns False for a
    set that is not registered, and refuses the global set (ValueError).
    """
    if process_set is global_process_set or process_set.process_set_id == 0:
        raise ValueError("bluefog remove_process_set: the global process set cannot be removed")
    set_id = process_set.process_set_id
    if set_id is None:
        return False
    basics.remove_process_set_id(set_id)
    with _lock:
        _registered.pop(set_id, None)
    process_set.process_set_id = None
    return True


def process_set_by_id(set_id: int) -> ProcessSet:
    """The registered ProcessSet with this id (0: the global set); KeyError if none."""
    with _lock:
        return _registered[set_id]
