"""Finding and binding the compiled core: ``libbluefog_core``'s folder and its ctypes handle,
with the argument and result types of the C API functions that need them declared once."""

from __future__ import annotations

import ctypes
import os
import sys
import threading
from typing import Optional

_LIB_NAME = "libbluefog_core.so"
_lock = threading.Lock()
_lib: Optional[ctypes.CDLL] = None


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


def load() -> ctypes.CDLL:
    """The loaded core library (loaded on first use)."""
    global _lib
    with _lock:
        if _lib is None:
            # RTLD_GLOBAL: Open MPI's plugins look up MPI symbols in the global namespace.
            lib = ctypes.CDLL(os.path.join(library_dir(), _LIB_NAME), mode=ctypes.RTLD_GLOBAL)
            lib.bluefog_last_error.restype = ctypes.c_char_p
            lib.bluefog_backend.restype = ctypes.c_char_p
            lib.bluefog_flight_recorder.restype = ctypes.c_char_p
            lib.bluefog_diagnose.restype = ctypes.c_char_p
            lib.bluefog_straggler_report.restype = ctypes.c_char_p
            lib.bluefog_op_totals.argtypes = [ctypes.POINTER(ctypes.c_longlong)] * 2 + [
                ctypes.POINTER(ctypes.c_double)]
            lib.bluefog_last_stall.argtypes = [ctypes.POINTER(ctypes.c_double)]
            lib.bluefog_last_stall.restype = ctypes.c_char_p
            lib.bluefog_op_accepts_dtype.argtypes = [ctypes.c_int, ctypes.c_int]
            lib.bluefog_op_accepts_dtype.restype = ctypes.c_int
            lib.bluefog_add_process_set.argtypes = [ctypes.POINTER(ctypes.c_int), ctypes.c_int]
            lib.bluefog_process_set_ranks.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_int),
                                                      ctypes.c_int]
            lib.bluefog_init_with.argtypes = [ctypes.POINTER(ctypes.c_char_p),
                                              ctypes.POINTER(ctypes.c_char_p), ctypes.c_int]
            lib.bluefog_tuning_get.argtypes = [ctypes.c_char_p, ctypes.POINTER(ctypes.c_longlong)]
            lib.bluefog_tuning_set.argtypes = [ctypes.c_char_p, ctypes.c_longlong,
                                               ctypes.POINTER(ctypes.c_longlong)]
            from bluefog.common import python_frames

            python_frames.install(lib)
            _lib = lib
        return _lib


def loaded() -> Optional[ctypes.CDLL]:
    """The core library if something loaded it already, else None (without loading it)."""
    return _lib
