"""mpi4py communicators where Horovod accepts them (``init(comm)``, ``ProcessSet(comm)``).

bluefog never imports mpi4py itself (importing it initializes MPI): a communicator can only
come from an application that did, so ``sys.modules`` tells whether an object may be one.
"""

from __future__ import annotations

import sys
from typing import List


def communicator(obj):
    """``obj`` when it is an mpi4py communicator, else None."""
    mpi = sys.modules.get("mpi4py.MPI")
    return obj if mpi is not None and isinstance(obj, mpi.Comm) else None


def is_whole_job(comm) -> bool:
    """Whether ``comm`` is an mpi4py communicator of every process (MPI_COMM_WORLD or a
    duplicate of it)."""
    if communicator(comm) is None:
        return False
    from mpi4py import MPI

    return MPI.Comm.Compare(comm, MPI.COMM_WORLD) in (MPI.IDENT, MPI.CONGRUENT)


def describe(comm) -> str:
    """What ``comm`` is, for an error message."""
    if communicator(comm) is not None:
        from mpi4py import MPI

        return (f"an mpi4py communicator of {comm.Get_size()} of the job's "
                f"{MPI.COMM_WORLD.Get_size()} processes")
    return "a list of ranks" if isinstance(comm, (list, tuple)) else repr(comm)


def world_ranks(comm) -> List[int]:
    """The ranks (in MPI_COMM_WORLD, which are bluefog's ranks under MPI) of the processes of
    the mpi4py communicator ``comm``."""
    from mpi4py import MPI

    if comm == MPI.COMM_NULL:
        raise ValueError("bluefog ProcessSet: the communicator is MPI.COMM_NULL (this process "
                         "is not in it); pass a communicator this process belongs to")
    if comm.Is_inter():
        raise ValueError("bluefog ProcessSet: an intercommunicator has no single set of ranks; "
                         "pass an intracommunicator")
    group, world = comm.Get_group(), MPI.COMM_WORLD.Get_group()
    try:
        return sorted(MPI.Group.Translate_ranks(group, list(range(group.Get_size())), world))
    finally:
        group.Free()
        world.Free()
