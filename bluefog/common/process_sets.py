"""Process sets: collectives over a subset of the ranks, as Horovod's ``hvd.ProcessSet``.

A set is registered on every rank (``add_process_set``, collectively, in the same order on
every rank: ranks that pass different sets get an error), and then gets its own communicator
and its own background thread in the core, so ranks outside it never block on its
collectives and two sets run concurrently. Pass ``process_set=`` to a collective (allreduce,
grouped_allreduce, allgather, broadcast, alltoall, reducescatter, grouped_reducescatter) or to
``DistributedGradientTape`` / ``DistributedOptimizer``; only the set's ranks may call it.
Averages divide by the set's size; ``broadcast``'s ``root_rank`` is a job-wide rank.

The objects are defined in ``bluefog.common.basics`` (whose ``init(process_sets=...)``
registers sets, so they must sit below it) and this module is their public name.
"""

from bluefog.common.basics import (
    ProcessSet,
    add_process_set,
    global_process_set,
    process_set_by_id,
    remove_process_set,
)

__all__ = ["ProcessSet", "global_process_set", "add_process_set", "remove_process_set",
           "process_set_by_id"]
