"""Where the main thread's Python code is, for the hang doctor's answers: the core calls
``_main_frame`` (through ctypes, from its own thread, only while answering another rank's
question) and puts "train.py:88 in step" in the answer.

The innermost frame of the main thread outside bluefog, TensorFlow, Keras and other installed
packages and the standard library is the user's line that is waiting or computing."""

from __future__ import annotations

import ctypes
import os
import sys
import sysconfig
import threading

_SKIP = tuple(os.path.normcase(os.path.realpath(p)) + os.sep for p in {
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))),  # bluefog/
    sysconfig.get_paths()["stdlib"], sysconfig.get_paths()["purelib"],
    sysconfig.get_paths()["platlib"]} if p)
# Code these run from no file of theirs (TensorFlow's generated op wrappers say "<string>").
_SKIP_MODULES = {"bluefog", "tensorflow", "keras", "tf_keras", "numpy", "absl"}
_PROVIDER_TYPE = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_int)


def main_frame() -> str:
    """The main thread's innermost user frame as "file.py:LINE in FUNCTION" ('' when none)."""
    frame = sys._current_frames().get(threading.main_thread().ident)
    innermost = None
    while frame is not None:
        path = frame.f_code.co_filename
        if innermost is None:
            innermost = frame
        real = os.path.normcase(os.path.realpath(path)) if os.path.isabs(path) else path
        module = str(frame.f_globals.get("__name__", ""))
        if not real.startswith(_SKIP) and module.split(".")[0] not in _SKIP_MODULES:
            return f"{os.path.basename(path)}:{frame.f_lineno} in {frame.f_code.co_name}"
        frame = frame.f_back
    return ""


def _provide(buf, size) -> int:
    try:
        data = main_frame().encode("utf-8", "replace")[:max(0, size - 1)]
        ctypes.memmove(buf, data, len(data))
        return len(data)
    except Exception:  # noqa: BLE001 - never raise into the core's thread
        return 0


_callback = _PROVIDER_TYPE(_provide)  # kept alive for the life of the process


def install(lib) -> None:
    """Hands the core the frame provider (once, when the library is loaded)."""
    lib.bluefog_set_frame_provider.argtypes = [_PROVIDER_TYPE]
    lib.bluefog_set_frame_provider(_callback)
