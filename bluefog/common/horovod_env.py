"""Horovod's ``HOROVOD_*`` environment variables, read as aliases of bluefog's ``BLUEFOG_*``.

``apply()`` runs at ``init()``, before the runtime reads its configuration: each ``HOROVOD_``
variable with a bluefog counterpart sets that counterpart unless the ``BLUEFOG_`` name is set
already (the ``BLUEFOG_`` name wins). Rank 0 prints one notice listing what was mapped, and the
Horovod variables that have no meaning here. Log levels are normalised (any case; Horovod's
``fatal`` is bluefog's ``error``, its quietest level).
"""

from __future__ import annotations

import os
import sys
from typing import Dict, List, MutableMapping, Tuple

# HOROVOD_ name -> (BLUEFOG_ name, converter of the value). Units are the same on both sides
# (bytes, milliseconds, seconds) except where a converter says otherwise.
ALIASES: Dict[str, str] = {
    "HOROVOD_FUSION_THRESHOLD": "BLUEFOG_FUSION_THRESHOLD",
    "HOROVOD_CYCLE_TIME": "BLUEFOG_CYCLE_TIME",
    "HOROVOD_CACHE_CAPACITY": "BLUEFOG_CACHE_CAPACITY",
    "HOROVOD_TIMELINE": "BLUEFOG_TIMELINE",
    "HOROVOD_STALL_CHECK_TIME_SECONDS": "BLUEFOG_STALL_CHECK_TIME",
    "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": "BLUEFOG_STALL_SHUTDOWN_TIME",
    "HOROVOD_HIERARCHICAL_ALLREDUCE": "BLUEFOG_HIERARCHICAL_ALLREDUCE",
    "HOROVOD_LOG_LEVEL": "BLUEFOG_LOG_LEVEL",
    "HOROVOD_GLOO_TIMEOUT_SECONDS": "BLUEFOG_GLOO_TIMEOUT",
    "HOROVOD_GLOO_IFACE": "BLUEFOG_GLOO_IFACE",
    "HOROVOD_CONTROLLER": "BLUEFOG_BACKEND",
}

# Horovod variables that have no counterpart here, with the reason the notice gives.
IGNORED: Dict[str, str] = {
    "HOROVOD_GPU_OPERATIONS": "no GPU collectives (CPU only)",
    "HOROVOD_GPU_ALLREDUCE": "no GPU collectives (CPU only)",
    "HOROVOD_CPU_OPERATIONS": "the backend is chosen by the launcher (BLUEFOG_BACKEND)",
    "HOROVOD_HIERARCHICAL_ALLGATHER": "allgather has no hierarchical variant here",
    "HOROVOD_AUTOTUNE": "no autotuner; bfrun --fusion-threshold-mb/--cycle-time-ms set the knobs",
    "HOROVOD_NUM_NCCL_STREAMS": "no NCCL",
    "HOROVOD_MPI_THREADS_DISABLE": "bluefog asks MPI for the thread level it needs",
    "HOROVOD_TIMELINE_MARK_CYCLES": "the timeline has no cycle markers",
    "HOROVOD_LOG_TIMESTAMP": "log lines carry no timestamp",
    "HOROVOD_LOG_HIDE_TIME": "log lines carry no timestamp",
}

LOG_LEVELS = ("trace", "debug", "info", "warning", "error")


def normalize_log_level(value: str) -> str:
    """A log level in any case; ``fatal`` (Horovod's) becomes ``error``; ``warn`` ``warning``.
    Unknown values are returned unchanged, for the runtime to report."""
    level = value.strip().lower()
    return {"fatal": "error", "warn": "warning"}.get(level, level)


def _convert(bluefog_name: str, value: str) -> str:
    if bluefog_name == "BLUEFOG_LOG_LEVEL":
        return normalize_log_level(value)
    if bluefog_name == "BLUEFOG_BACKEND":
        return value.strip().lower()
    return value


def apply(environ: MutableMapping[str, str] = os.environ) -> Tuple[List[str], List[str]]:
    """Maps ``HOROVOD_*`` variables in ``environ`` onto their ``BLUEFOG_*`` names.

    Returns (mapped, ignored): lines ``HOROVOD_X -> BLUEFOG_Y`` for the variables mapped (or
    shadowed by a ``BLUEFOG_`` name set already), and ``HOROVOD_Z (why)`` for those that have
    no meaning here. Also normalises ``BLUEFOG_LOG_LEVEL``'s case.
    """
    mapped, ignored = [], []
    for horovod_name, bluefog_name in ALIASES.items():
        value = environ.get(horovod_name)
        if value is None:
            continue
        if bluefog_name in environ:
            mapped.append(f"{horovod_name} -> not used, {bluefog_name} is set")
            continue
        environ[bluefog_name] = _convert(bluefog_name, value)
        mapped.append(f"{horovod_name} -> {bluefog_name}")
    for horovod_name, why in IGNORED.items():
        if horovod_name in environ:
            ignored.append(f"{horovod_name} ({why})")
    if "BLUEFOG_LOG_LEVEL" in environ:
        environ["BLUEFOG_LOG_LEVEL"] = normalize_log_level(environ["BLUEFOG_LOG_LEVEL"])
    return mapped, ignored


def notice(mapped: List[str], ignored: List[str]) -> str:
    """The one notice ``init()`` prints on rank 0; empty when nothing was mapped or ignored."""
    parts = []
    if mapped:
        parts.append("Horovod environment variables read as bluefog's: " + "; ".join(mapped))
    if ignored:
        parts.append("ignored (no meaning here): " + "; ".join(ignored))
    return ("bluefog: " + ". ".join(parts) + ".") if parts else ""


def apply_and_announce(environ: MutableMapping[str, str] = os.environ) -> None:
    """``apply`` and print its notice once, on the launcher's rank 0 (stderr)."""
    mapped, ignored = apply(environ)
    text = notice(mapped, ignored)
    rank = environ.get("OMPI_COMM_WORLD_RANK", environ.get("PMI_RANK", environ.get("RANK", "0")))
    if text and rank in ("0", ""):
        print(text, file=sys.stderr, flush=True)
