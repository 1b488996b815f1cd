"""Horovod's mpi4py entry points: ProcessSet(mpi4py_comm), ProcessSet.mpi_comm and
init(comm=communicator). mpi4py is optional (``pip install mpi4py``, built against the
system's Open MPI); without it, or on the Gloo backend, these tests skip.
"""

import numpy as np
import pytest
import tensorflow as tf

import bluefog.tensorflow as bf
from bluefog.common import basics

pytest.importorskip("mpi4py", reason="mpi4py is not installed (optional test dependency: "
                                     "pip install mpi4py, which builds against Open MPI)")
if bf.backend() != "mpi":
    pytest.skip("mpi4py communicators need the MPI backend (this run is on "
                f"{bf.backend()})", allow_module_level=True)

from mpi4py import MPI  # noqa: E402


def test_process_set_from_a_split_communicator(rank, size):
    """As in Horovod's docs: every rank passes its own half of COMM_WORLD.Split; each rank's
    set holds its communicator's ranks and reduces over them only."""
    sub = MPI.COMM_WORLD.Split(color=rank % 2, key=rank)
    ps = bf.ProcessSet(sub)
    mine = [r for r in range(size) if r % 2 == rank % 2]
    assert ps.mpi_comm is sub and ps.ranks == mine and ps.process_set_id is None
    assert bf.add_process_set(ps) is ps and ps.process_set_id is not None
    assert ps.rank() == mine.index(rank) and ps.size() == len(mine) and ps.included()
    assert "mpi_comm=" in repr(ps)
    out = bf.allreduce(tf.constant([float(rank + 1), 1.0]), average=False, process_set=ps,
                       name="mpi4py.split")
    np.testing.assert_allclose(out.numpy(), [sum(r + 1 for r in mine), len(mine)])
    # Both halves were registered on every rank, with the same ids everywhere.
    ids = sorted(set(MPI.COMM_WORLD.allgather(ps.process_set_id)))
    assert len(ids) == min(size, 2)
    for set_id in ids:
        assert bf.remove_process_set(basics.process_set_by_id(set_id))
    sub.Free()


def test_init_takes_a_communicator_of_every_process(rank, size):
    """init(comm) with COMM_WORLD or a duplicate (also positional, Horovod's order) is
    accepted (bluefog is initialized already: a no-op after the checks) and recorded as the
    global set's mpi_comm; a communicator of fewer processes is refused, naming ProcessSet."""
    bf.init(MPI.COMM_WORLD)
    dup = MPI.COMM_WORLD.Dup()
    bf.init(comm=dup, process_sets="dynamic")
    assert bf.global_process_set.mpi_comm is dup
    assert bf.ProcessSet([0]).mpi_comm is None
    if size > 1:
        sub = MPI.COMM_WORLD.Split(color=rank % 2, key=rank)
        with pytest.raises(ValueError, match=rf"an mpi4py communicator of {sub.Get_size()} of "
                                             rf"the job's {size} processes.*bf.ProcessSet"):
            bf.init(comm=sub)
        sub.Free()
    bf.global_process_set.mpi_comm = None
    dup.Free()
