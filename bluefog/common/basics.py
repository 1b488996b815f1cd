"""Process-level state shared by every front end: init/shutdown, rank and size.

Thin ctypes bindings over the C API of ``libbluefog_core``; all the work happens in C++.
"""

from __future__ import annotations

import atexit
import ctypes
import os
import sys
import threading
from typing import List, Optional, Sequence

_LIB_NAME = "libbluefog_core.so"
_lock = threading.Lock()
_lib: Optional[ctypes.CDLL] = None
_atexit_registered = False


def library_dir() -> str:
    """The folder holding the compiled libraries of the installed package.

    Looked up next to this file first, then in every ``bluefog`` package on ``sys.path``, so
    that running from a source checkout uses the libraries that ``make build`` installed.
    """
    here = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "lib")
    candidates = [here] + [os.path.join(p, "bluefog", "lib") for p in sys.path if p]
    for folder in candidates:
        if os.path.isfile(os.path.join(folder, _LIB_NAME)):
            return folder
    raise ImportError(
        f"bluefog's compiled library {_LIB_NAME} was not found (looked in {candidates[:3]} and "
        "the rest of sys.path). Build and install the package first: run `make build` in the "
        "bluefog checkout, or `pip install --no-build-isolation .` in an environment that has "
        "tensorflow-cpu and Open MPI's development files.")


def _load() -> ctypes.CDLL:
    global _lib
    with _lock:
        if _lib is None:
            # RTLD_GLOBAL: Open MPI's plugins look up MPI symbols in the global namespace.
            lib = ctypes.CDLL(os.path.join(library_dir(), _LIB_NAME), mode=ctypes.RTLD_GLOBAL)
            lib.bluefog_last_error.restype = ctypes.c_char_p
            lib.bluefog_op_accepts_dtype.argtypes = [ctypes.c_int, ctypes.c_int]
            lib.bluefog_op_accepts_dtype.restype = ctypes.c_int
            lib.bluefog_add_process_set.argtypes = [ctypes.POINTER(ctypes.c_int), ctypes.c_int]
            lib.bluefog_process_set_ranks.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_int),
                                                      ctypes.c_int]
            lib.bluefog_tuning_get.argtypes = [ctypes.c_char_p, ctypes.POINTER(ctypes.c_longlong)]
            lib.bluefog_tuning_set.argtypes = [ctypes.c_char_p, ctypes.c_longlong,
                                               ctypes.POINTER(ctypes.c_longlong)]
            _lib = lib
        return _lib


class BluefogError(RuntimeError):
    """Raised when the C++ runtime reports a failure outside of a TensorFlow op."""


def _check(code: int) -> None:
    if code != 0:
        raise BluefogError(_load().bluefog_last_error().decode("utf-8", "replace"))


def _tuning(knob: str) -> int:
    """A run-time switch of the core by name, for tests and benchmarks (csrc/c_api.h lists
    them: streaming_stores, shared, shared_calls, inline_threshold, ...)."""
    value = ctypes.c_longlong()
    _check(_load().bluefog_tuning_get(knob.encode(), ctypes.byref(value)))
    return value.value


def _tune(knob: str, value: int) -> int:
    """Sets a run-time switch of the core on this rank from now on; returns the value before."""
    before = ctypes.c_longlong()
    _check(_load().bluefog_tuning_set(knob.encode(), int(value), ctypes.byref(before)))
    return before.value


def init(process_sets=None) -> None:
    """Starts bluefog on this process. Every rank must call it; calling it again is a no-op.

    Starts MPI (unless the application already did) and the background thread that runs every
    collective. ``shutdown()`` runs automatically at interpreter exit. ``process_sets`` (a list
    of ``ProcessSet`` or rank lists, the same on every rank) are registered right away, as
    Horovod's ``init(process_sets=...)`` does.
    """
    global _atexit_registered
    _check(_load().bluefog_init())
    if not _atexit_registered:
        atexit.register(shutdown)
        _atexit_registered = True
    if process_sets:
        from bluefog.common import process_sets as sets  # imports this module

        for process_set in process_sets:
            sets.add_process_set(process_set)


def shutdown() -> None:
    """Stops bluefog on every rank. Collectives still pending fail with a "shut down" error.

    MPI cannot be restarted, so ``init()`` after ``shutdown()`` raises in the same process.
    """
    if _lib is not None:
        _check(_lib.bluefog_shutdown())


def is_initialized() -> bool:
    """Whether ``init()`` has run and the library has not been shut down."""
    return _lib is not None and bool(_lib.bluefog_is_initialized())


def _query(fn_name: str) -> int:
    value = getattr(_load(), fn_name)() if _lib is not None else -1
    if value < 0:
        raise ValueError(
            f"bluefog is not initialized (or was shut down): call bf.init() before "
            f"bf.{fn_name[len('bluefog_'):]}()")
    return value


def size() -> int:
    """Number of processes (ranks) in the job."""
    return _query("bluefog_size")


def rank() -> int:
    """This process's rank, in ``[0, size())``."""
    return _query("bluefog_rank")


def local_size() -> int:
    """Number of ranks on this machine (ranks sharing memory with this one)."""
    return _query("bluefog_local_size")


def local_rank() -> int:
    """This process's rank among the ranks on its machine."""
    return _query("bluefog_local_rank")


def is_homogeneous() -> bool:
    """Whether every machine runs the same number of ranks, in contiguous blocks.

    True when machine ``m`` holds exactly the ranks ``m * local_size() .. (m + 1) *
    local_size() - 1`` (mpirun's default placement, ``--map-by slot``, with equal slots per
    host). Machine-level operations (``machine_rank()``, ``hierarchical_neighbor_allreduce``)
    need it. Agreed by all ranks at ``init()``, so it is the same on every rank.
    """
    return bool(_query("bluefog_is_homogeneous"))


def mpi_threads_supported() -> bool:
    """Whether MPI granted MPI_THREAD_MULTIPLE, so other threads may also call MPI directly."""
    return bool(_query("bluefog_mpi_threads_supported"))


def op_accepts_dtype(op_type: int, dtype: int) -> bool:
    """Whether the C++ core accepts a request of ``op_type`` with ``dtype``.

    Both are the core's enum values (``OpType``: allreduce 0, allgather 1, broadcast 2,
    neighbor_allreduce 3, neighbor_allgather 4, neighbor_allgather gradient 5, alltoall 6,
    reducescatter 7; ``DataType``: uint8 0, int8, uint16, int16, int32, int64, float16,
    bfloat16, float32, float64, bool 10). Needs no ``init()``.
    """
    return _load().bluefog_op_accepts_dtype(op_type, dtype) == 1


# Process sets, for bluefog.common.process_sets (which holds the Python objects).


def add_process_set_ranks(ranks: Sequence[int]) -> int:
    """Registers a process set on every rank (collective); returns its id."""
    array = (ctypes.c_int * len(ranks))(*ranks)
    set_id = _load().bluefog_add_process_set(array, len(ranks))
    if set_id < 0:
        raise BluefogError(_load().bluefog_last_error().decode("utf-8", "replace"))
    return set_id


def remove_process_set_id(set_id: int) -> None:
    """Removes a registered process set on every rank (collective)."""
    _check(_load().bluefog_remove_process_set(set_id))


def process_set_rank(set_id: int) -> int:
    """This rank's index in the set, -1 when not in it (or not initialized)."""
    return _load().bluefog_process_set_rank(set_id)


def process_set_size(set_id: int) -> int:
    """The set's size, -1 when this rank is not in it (or not initialized)."""
    return _load().bluefog_process_set_size(set_id)


def process_set_ranks(set_id: int) -> List[int]:
    """The set's job-wide ranks; empty when there is no such set (or not initialized)."""
    lib = _load()
    n = lib.bluefog_process_set_ranks(set_id, None, 0)
    if n <= 0:
        return []
    out = (ctypes.c_int * n)()
    lib.bluefog_process_set_ranks(set_id, out, n)
    return list(out)
