"""The timeline from Python: Horovod's ``start_timeline`` / ``stop_timeline`` (record part of a
run) and Bluefog's ``timeline_start_activity`` / ``timeline_end_activity`` /
``timeline_context`` (put your own activities, e.g. forward and backward passes, next to the
communication).

The same Chrome trace as ``BLUEFOG_TIMELINE`` (each tensor's queue, negotiation and
communication phases; open it in Perfetto or ``chrome://tracing``), one file per rank.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import threading
import time

from bluefog.common import basics

# tensor_name -> (activity_name, start on the steady clock); the C++ side uses the same clock
# (std::chrono::steady_clock and time.monotonic are both CLOCK_MONOTONIC on Linux).
_activities: dict = {}
_lock = threading.Lock()


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


def _lib():
    lib = basics._load()
    lib.bluefog_timeline_activity.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_double,
                                              ctypes.c_double]
    return lib


def _check_name(what: str, label: str, value) -> None:
    if not isinstance(value, str) or not value:
        raise TypeError(f"{what}: {label} must be a non-empty str, got {value!r}")


def timeline_start_activity(tensor_name: str, activity_name: str) -> bool:
    """Starts activity ``activity_name`` on ``tensor_name``'s track of the timeline. Returns
    False (and records nothing) when no timeline is recording or bluefog is not initialized."""
    _check_name("timeline_start_activity", "tensor_name", tensor_name)
    _check_name("timeline_start_activity", "activity_name", activity_name)
    if not basics.is_initialized() or _lib().bluefog_timeline_enabled() != 1:
        return False
    with _lock:
        _activities[tensor_name] = (activity_name, time.monotonic())
    return True


def timeline_end_activity(tensor_name: str) -> bool:
    """Ends the activity started on ``tensor_name`` and records it. Returns False when none was
    started or no timeline is recording."""
    _check_name("timeline_end_activity", "tensor_name", tensor_name)
    end = time.monotonic()
    with _lock:
        started = _activities.pop(tensor_name, None)
    if started is None or not basics.is_initialized():
        return False
    activity, start = started
    return _lib().bluefog_timeline_activity(tensor_name.encode(), activity.encode(), start,
                                            end) == 1


@contextlib.contextmanager
def timeline_context(tensor_name: str, activity_name: str):
    """``with bf.timeline_context("step", "FORWARD"): ...`` records the block as an activity."""
    timeline_start_activity(tensor_name, activity_name)
    try:
        yield
    finally:
        timeline_end_activity(tensor_name)
