"""What the fixed and the elastic Ray executors share: the variables a worker must not
inherit, and one line that says why a worker's function failed."""

from __future__ import annotations

import re

import ray

# Variables a worker must not inherit from whatever started Ray: an MPI launcher's (they would
# make bluefog pick MPI) and another job's rendezvous.
_LAUNCHER_PREFIXES = ("OMPI_", "PMIX_", "PMI_", "OPAL_", "PRTE_")
_RENDEZVOUS = ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK",
               "LOCAL_WORLD_SIZE", "TF_CONFIG", "BLUEFOG_JOB_TOKEN")


def _plain(text: str) -> str:
    return re.sub(r"\x1b\[[0-9;]*m", "", text)


def _summary(error: BaseException) -> str:
    """One line: the function's own exception (Ray wraps it), or the worker's death."""
    if isinstance(error, ray.exceptions.RayActorError):
        return "its worker process died or its node was lost"
    cause = getattr(error, "cause", None)
    if isinstance(cause, BaseException):
        error = cause
    text = _plain(str(error)).strip().splitlines()
    return f"{type(error).__name__}: {text[-1] if text else ''}"
