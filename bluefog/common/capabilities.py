"""What this build of bluefog has, under Horovod's names, so scripts that ask keep working.

bluefog runs every collective on the CPU, over MPI (jobs started by mpirun, bfrun or srun) or,
when this build has it, over Gloo (jobs started with MASTER_ADDR, MASTER_PORT, RANK and
WORLD_SIZE); NCCL, DDL, oneCCL, CUDA and ROCm are not built. None of these needs ``init()``.
"""

from __future__ import annotations


def mpi_built() -> bool:
    """True: collectives run over MPI."""
    return True


def _running_backend() -> str | None:
    from bluefog.common import basics

    return basics.backend() if basics.is_initialized() else None


def mpi_enabled() -> bool:
    """Whether MPI runs this job (before ``init()``: True, MPI being the default)."""
    return _running_backend() in (None, "mpi")


def gloo_built() -> bool:
    """Whether this build has the Gloo backend (built when libgloo-dev was installed)."""
    from bluefog.common import basics

    return bool(basics._load().bluefog_gloo_built())


def gloo_enabled() -> bool:
    """Whether Gloo runs this job (started without an MPI launcher; docs/launching.md)."""
    return _running_backend() == "gloo"


def nccl_built() -> bool:
    """False: no GPU collectives (tensors are reduced on the CPU)."""
    return False


def ddl_built() -> bool:
    """False: no IBM DDL."""
    return False


def ccl_built() -> bool:
    """False: no oneCCL."""
    return False


def cuda_built() -> bool:
    """False: no CUDA kernels (the ops run on the CPU)."""
    return False


def rocm_built() -> bool:
    """False: no ROCm kernels."""
    return False
