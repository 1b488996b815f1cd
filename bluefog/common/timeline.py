"""Horovod's ``start_timeline`` / ``stop_timeline``: record a timeline for part of a run.

The same Chrome trace as ``BLUEFOG_TIMELINE`` (each tensor's queue, negotiation and
communication phases; open it in Perfetto or ``chrome://tracing``), one file per rank.
"""

from __future__ import annotations

import os

from bluefog.common import basics


def rank_path(file_path: str, rank: int) -> str:
    """Rank 0 writes ``file_path``; rank r > 0 writes it with ``.rank<r>`` before the extension
    (``timeline.json`` -> ``timeline.rank1.json``)."""
    if rank == 0:
        return file_path
    stem, ext = os.path.splitext(file_path)
    return f"{stem}.rank{rank}{ext}"


def start_timeline(file_path: str, mark_cycles: bool = False) -> None:
    """Starts recording this rank's timeline into ``rank_path(file_path, rank)``, replacing a
    recording in progress (also one started by ``BLUEFOG_TIMELINE``). Every rank may call it
    independently. ``mark_cycles`` is accepted for Horovod's signature; bluefog has no cycles
    to mark (its rounds appear as each tensor's NEGOTIATE phase).
    """
    if not isinstance(file_path, (str, os.PathLike)) or not str(file_path):
        raise TypeError(f"start_timeline: file_path must be a path, got {file_path!r}")
    if not isinstance(mark_cycles, bool):
        raise TypeError(f"start_timeline: mark_cycles must be a bool, got {mark_cycles!r}")
    path = rank_path(os.fspath(file_path), basics.rank())  # raises when not initialized
    basics._check(basics._load().bluefog_start_timeline(path.encode()))


def stop_timeline() -> None:
    """Stops the recording (the file is complete JSON afterwards). A no-op when none runs."""
    if basics.is_initialized():
        basics._check(basics._load().bluefog_stop_timeline())
