"""``import bluefog.tensorflow as bf``: TensorFlow collectives and training helpers over MPI."""

from bluefog.common.basics import (  # noqa: F401
    BluefogError,
    init,
    is_initialized,
    local_rank,
    local_size,
    mpi_threads_supported,
    rank,
    shutdown,
    size,
)
from bluefog.tensorflow.mpi_ops import allgather, allreduce, broadcast  # noqa: F401
