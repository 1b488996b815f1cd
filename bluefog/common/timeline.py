"""The timeline from Python: Horovod's ``start_timeline`` / ``stop_timeline`` (record part of a
run) and Bluefog's ``timeline_start_activity`` / ``timeline_end_activity`` /
``timeline_context`` (put your own activities, e.g. forward and backward passes, next to the
communication).

The same Chrome trace as ``BLUEFOG_TIMELINE`` (each tensor's queue, negotiation and
communication phases; open it in Perfetto or ``chrome://tracing``), one file per rank, complete
JSON at every moment; ``merge_timelines`` (which ``bfrun`` runs when the job ends) makes the
ranks' files one.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
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


def _read_events(path: str) -> list:
    """The events of one rank's timeline file. The writer puts one event per line and keeps the
    file complete JSON; a file cut mid-write (a full disk) is read line by line, dropping the
    event that was cut."""
    with open(path, encoding="utf-8", errors="replace") as f:
        text = f.read()
    try:
        events = json.loads(text)
        if isinstance(events, list):
            return events
    except ValueError:
        pass
    events = []
    for line in text.splitlines():
        line = line.strip().rstrip(",")
        if line.startswith("{"):
            try:
                events.append(json.loads(line))
            except ValueError:
                continue
    return events


def merge_timelines(file_path: str, size: int, keep_parts: bool = False) -> list:
    """Merges the ranks' timeline files (``rank_path(file_path, r)`` for r < ``size``, as
    ``--timeline-filename`` / ``BLUEFOG_TIMELINE`` / ``start_timeline`` name them) into one
    Chrome trace at ``file_path``: every rank's events, ``pid`` = rank, complete JSON even when
    a rank was killed while recording (its events up to the kill). ``bfrun`` calls it when the
    job ends; call it yourself after a job started another way (on the host that can read every
    rank's file). The ranks' files other than rank 0's are removed unless ``keep_parts``.
    Returns the ranks whose file was not found (e.g. written on another host), which are left
    out. Raises FileNotFoundError when no rank's file exists.
    """
    if not isinstance(size, int) or size < 1:
        raise ValueError(f"merge_timelines: size must be a positive int, got {size!r}")
    file_path = os.fspath(file_path)
    meta, events, missing, merged = [], [], [], []
    for r in range(size):
        part = rank_path(file_path, r)
        if not os.path.exists(part):
            missing.append(r)
            continue
        for e in _read_events(part):
            (meta if isinstance(e, dict) and e.get("ph") == "M" else events).append(e)
        merged.append(part)
    if not merged:
        raise FileNotFoundError(
            f"merge_timelines: no timeline file of any rank: {rank_path(file_path, 0)!r}"
            f"{' ... ' + repr(rank_path(file_path, size - 1)) if size > 1 else ''}")
    events.sort(key=lambda e: e.get("ts", 0) if isinstance(e, dict) else 0)
    tmp = f"{file_path}.merging.{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write("[\n")
        f.write(",\n".join(json.dumps(e) for e in meta + events))
        f.write("\n]\n")
    os.replace(tmp, file_path)
    if not keep_parts:
        for part in merged:
            if part != file_path:
                os.remove(part)
    return missing
