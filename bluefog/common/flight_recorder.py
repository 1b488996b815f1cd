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


def diagnose() -> str:
    """What every rank of the job is doing now, as one text: asks each rank over the hang
    doctor's connection of its own (so it answers while its Python thread sleeps, computes or
    waits inside another operation) and waits up to a few seconds for the answers. Each line
    names a rank with its host and pid and its oldest pending operation (``"rank 2 (node-a, pid
    4711): it is in broadcast 'w' since 41.0 s"``), or its last finished one when it is in
    none, and the window mutexes it holds; a rank that does not answer is named as such
    (stopped, dead or frozen). The same consultation runs by itself when an operation waits
    past ``BLUEFOG_STALL_CHECK_TIME`` and prints its diagnosis on the waiting ranks. Returns a
    sentence saying why when it cannot ask (not initialized, one rank,
    ``BLUEFOG_HANG_DOCTOR=0``)."""
    return library.load().bluefog_diagnose().decode("utf-8", "replace")


def straggler_report() -> Dict[str, Any]:
    """Who the other ranks waited for over the last minute. A collective or neighbour op waits
    from its submission until every rank has submitted it: the rank that comes last hardly
    waits, the others wait for it. Every rank adds up its own requests' waits and sends the sum
    with each negotiation round, so every rank knows every rank's. Returns a dict:
    ``window_seconds`` (covered, at most 60), ``ops`` (requests agreed), ``contested_seconds``
    (seconds in which the ranks' mean waits differed by more than 1 ms) and ``contested_ops``
    (the requests agreed in them), ``ranks`` (one dict per rank: ``rank``, ``ops``,
    ``mean_wait_seconds``; ``mean_lag_seconds``, the longest mean wait of any rank less its
    own, how far behind the first rank its requests come on average; ``last_ops``, the
    requests of the contested seconds in which it waited least), and ``straggler``: the rank
    whose ``last_ops`` are at least 75% of ``contested_ops`` over at least 3 contested seconds,
    else None. Rank 0 logs the straggler every ``BLUEFOG_STRAGGLER_REPORT`` seconds (60 by
    default). Before ``init``: an empty report."""
    text = library.load().bluefog_straggler_report().decode("utf-8", "replace")
    report = json.loads(text)
    return report if report else {"window_seconds": 0.0, "ops": 0, "contested_seconds": 0,
                                  "contested_ops": 0, "straggler": None, "ranks": []}


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
    """This rank's last stall report (``BLUEFOG_STALL_CHECK_TIME``: the hang doctor's
    diagnosis, or with the doctor off the waiting tensors and the ranks that have not submitted
    them) and how many seconds ago it was given; ``("", 0.0)`` before any."""
    ago = ctypes.c_double(0)
    text = library.load().bluefog_last_stall(ctypes.byref(ago))
    return text.decode("utf-8", "replace"), float(ago.value)
