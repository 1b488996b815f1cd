"""What this build of bluefog has, under Horovod's names, so scripts that ask keep working.

bluefog runs every collective over MPI on the CPU: MPI is built and enabled; Gloo, NCCL, DDL,
oneCCL, CUDA and ROCm are not. None of these needs ``init()``.
"""

from __future__ import annotations


def mpi_built() -> bool:
    """True: collectives run over MPI."""
    return True


def mpi_enabled() -> bool:
    """True: MPI is the controller and the transport (there is no other)."""
    return True


def gloo_built() -> bool:
    """False: there is no Gloo controller; ``bfrun`` launches with Open MPI."""
    return False


def gloo_enabled() -> bool:
    """False: there is no Gloo controller."""
    return False


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
