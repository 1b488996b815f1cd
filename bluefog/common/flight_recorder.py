"""``bf.flight_recorder()``: this rank's last operations, as the runtime recorded them.

The runtime keeps the last ``BLUEFOG_FLIGHT_RECORDER_SIZE`` operations (256 by default; 0
turns it off) of every kind: collectives and neighbour ops of every process set, window puts,
accumulates, gets and mutexes. A stall warning and an error that ends the job list what is
pending from it; ``kill -USR1 <pid>`` prints it on the rank's stderr with every Python thread's
stack, also while the rank is stuck inside an operation.
"""

from __future__ import annotations

import ctypes
import json
from typing import Any, Dict, List, Tuple

from bluefog.common import library


def flight_recorder() -> List[Dict[str, Any]]:
    """This rank's recorded operations, oldest first. Each is a dict: ``id`` (1, 2, ... in
    order of submission), ``kind`` (``"allreduce"``, ``"neighbor_allreduce"``, ``"win_put"``,
    ``"win_mutex_acquire"``, ...), ``name``, ``process_set``, ``bytes``, ``dtype``, ``state``
    (``"queued"``: waiting for the other ranks; ``"running"``: agreed and exchanging, or a
    window operation under way; ``"done"``; ``"failed"``), and ``queued_s_ago``,
    ``started_s_ago``, ``ended_s_ago`` (seconds before this call; None when not reached).
    Works before ``init`` (an empty list) and after ``shutdown`` (what was recorded)."""
    return json.loads(library.load().bluefog_flight_recorder().decode("utf-8", "replace"))


def op_totals() -> Tuple[int, int, float]:
    """Since this process started: the operations it began (every kind the recorder records,
    also while it is off), the bytes of their tensors, and the seconds during which at least
    one recorded operation was queued, waiting for the other ranks:
    ``(operations, bytes, waiting_seconds)``."""
    ops, nbytes, waited = ctypes.c_longlong(0), ctypes.c_longlong(0), ctypes.c_double(0)
    library.load().bluefog_op_totals(ctypes.byref(ops), ctypes.byref(nbytes),
                                     ctypes.byref(waited))
    return int(ops.value), int(nbytes.value), float(waited.value)


def last_stall() -> Tuple[str, float]:
    """This rank's last stall warning (``BLUEFOG_STALL_CHECK_TIME``: the waiting tensors and
    the ranks that have not submitted them) and how many seconds ago it was given;
    ``("", 0.0)`` before any."""
    ago = ctypes.c_double(0)
    text = library.load().bluefog_last_stall(ctypes.byref(ago))
    return text.decode("utf-8", "replace"), float(ago.value)
