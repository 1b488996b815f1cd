"""The live job page's training side: every rank reports at step boundaries, rank 0 serves.

``job_page_step()`` is called once per training step on every rank (``JobPageCallback`` does
it for ``fit``). Every ``every_n_steps`` steps all ranks allgather one small float64 row each
(``job_page_state.FIELDS``: steps, mean step time, the bytes and operations of
``flight_recorder.op_totals``, the time spent waiting for the others, the elastic round, this
rank's stalled operations); rank 0 records it and, when asked, writes it as TensorBoard
scalars. The server (``bluefog.common.job_page``) runs in daemon threads on rank 0 only.
"""

from __future__ import annotations

import numbers
import os
import socket
import threading
import time
import warnings
from typing import List, Optional

import numpy as np
import tensorflow as tf
from tensorflow.core.framework import summary_pb2

from bluefog.common import basics, elastic_rounds, flight_recorder, topology
from bluefog.common.job_page import VARIABLE, JobPage, parse_address, rank_stalls, stall_seconds
from bluefog.common.job_page_state import FIELDS, JobState
from bluefog.tensorflow import mpi_ops

HOST_BYTES = 64
DEFAULT_EVERY = 10

_lock = threading.Lock()
_page: List[Optional[JobPage]] = [None]
_run = {"on": None, "every": DEFAULT_EVERY, "steps": 0, "since": 0, "t0": None,
        "hosts": None, "writer": None, "log_dir": None, "address": None, "secret_file": None,
        "serve_again": False}


def _after_reinit() -> None:
    # A new job in this process (an elastic reset): rank 0 may be another process now, so the
    # page is served again at the next step (kept when this process is still rank 0), the
    # hosts are gathered again and the clock restarts.
    _run.update(hosts=None, t0=None, serve_again=bool(_run["on"]))


basics.register_reinit_hook(_after_reinit)


def _check_every(every_n_steps) -> int:
    if isinstance(every_n_steps, bool) or not isinstance(every_n_steps, numbers.Integral) \
            or every_n_steps < 1:
        raise ValueError(f"bluefog job page: every_n_steps must be an int >= 1, got "
                         f"{every_n_steps!r}")
    return int(every_n_steps)


def serve_job_page(address=None, secret_file: Optional[str] = None,
                   every_n_steps: int = DEFAULT_EVERY) -> Optional[str]:
    """Turns the live job page on; every rank must call it (after ``init``), with the same
    ``every_n_steps``. Rank 0 listens and returns the page's URL (and prints it with the path
    of the secret's file); the other ranks return None. Called again with the same address (or
    none) it keeps the page and its history.

    Args:
        address: a port (``8265``, on 127.0.0.1), ``"HOST:PORT"`` or ``"[::1]:PORT"``; port 0
            picks a free one. None: ``BLUEFOG_JOB_PAGE``; neither set: nothing is served, but
            the ranks still report (for ``JobPageCallback(log_dir=...)``).
        secret_file: where the page's secret is read, or written (mode 0600) when the file
            does not exist. Default: ``$XDG_RUNTIME_DIR/bluefog/job-page-PORT.secret`` (or
            ``~/.cache/bluefog/...``). The user is ``bluefog``; browsers use HTTP Digest.
        every_n_steps: how often the ranks report (one allgather of a few numbers).

    Raises ValueError for a malformed address (on every rank) and OSError naming the rank and
    the port when rank 0 cannot listen there.
    """
    every = _check_every(every_n_steps)
    value = os.environ.get(VARIABLE, "") if address is None else str(address)
    where = VARIABLE if address is None else "address"
    parsed = parse_address(value, where) if value.strip() else None
    rank = basics.rank()
    with _lock:
        _run.update(on=True, every=every, address=address, secret_file=secret_file,
                    serve_again=False)
        if rank != 0 and _page[0] is not None:
            _page[0].close()  # no longer rank 0 (an elastic reset)
            _page[0] = None
        if parsed is None or rank != 0:
            return job_page_url()
        if _page[0] is not None:
            if (_page[0].port == parsed[1] or parsed[1] == 0) and _page[0].host == parsed[0]:
                return _page[0].url
            _page[0].close()
            _page[0] = None
        page = JobPage(parsed[0], parsed[1], rank, secret_file,
                       topology=lambda: topology.load_topology() if basics.is_initialized()
                       else None)
        _page[0] = page
    print(f"bluefog job page: {page.url} (user bluefog, secret in {page.secret_file})",
          flush=True)
    return page.url


def stop_job_page() -> None:
    """Stops rank 0's server (if any) and the reports; every rank must call it."""
    with _lock:
        if _page[0] is not None:
            _page[0].close()
            _page[0] = None
        _run.update(on=False, hosts=None, writer=None, log_dir=None, t0=None)


def job_page_url() -> Optional[str]:
    """The page's URL on rank 0 while it is served; None elsewhere."""
    page = _page[0]
    return None if page is None else page.url


def _gather(rows: np.ndarray, name: str) -> np.ndarray:
    return mpi_ops.allgather(tf.constant(rows), name=name).numpy()


def _hosts() -> List[str]:
    raw = socket.gethostname().encode("utf-8", "replace")[:HOST_BYTES]
    row = np.zeros((1, HOST_BYTES), dtype=np.uint8)
    row[0, :len(raw)] = np.frombuffer(raw, dtype=np.uint8)
    gathered = _gather(row, "bluefog.job_page.hosts")
    return [bytes(r).rstrip(b"\0").decode("utf-8", "replace") for r in gathered]


def _elastic_round() -> int:
    return elastic_rounds.current_round() if elastic_rounds.active() else -1


def _row(steps: int, step_seconds: float, interval: float, stall_s: float) -> np.ndarray:
    ops, nbytes, waited = flight_recorder.op_totals()
    pending = rank_stalls(stall_s)
    stalled = sum(1 for p in pending if p["stalled"])
    oldest = max((p["pending_seconds"] for p in pending), default=0.0)
    values = {"steps": steps, "step_seconds": step_seconds, "bytes": nbytes,
              "operations": ops, "waiting_seconds": waited, "interval_seconds": interval,
              "elastic_round": _elastic_round(), "stalled": stalled,
              "oldest_pending_seconds": oldest}
    return np.array([[values[k] for k in FIELDS]], dtype=np.float64)


def _scalar(tag: str, value: float, step: int) -> None:
    # tf.summary.scalar's record (the "scalars" plugin's metadata), without the tensorboard
    # package that tf.summary.scalar needs.
    metadata = summary_pb2.SummaryMetadata()
    metadata.plugin_data.plugin_name = "scalars"
    tf.summary.write(tag, tf.constant(float(value), tf.float32), step=step, metadata=metadata)


def _write_scalars(step: int) -> None:
    latest = _page[0].state.latest() if _page[0] is not None else None
    if latest is None or _run["writer"] is None:
        return
    try:
        with _run["writer"].as_default():
            for r, p in latest.items():
                for key in ("step_seconds", "bytes_per_second", "waiting_share",
                            "compute_seconds"):
                    _scalar(f"bluefog/{key}/rank{r}", p[key], step)
            straggler = _page[0].state.straggler
            _scalar("bluefog/straggler", -1 if straggler is None else straggler, step)
        _run["writer"].flush()
    except Exception as e:  # training goes on without the scalars
        warnings.warn(f"bluefog job page: rank 0 stops writing TensorBoard scalars to "
                      f"{_run['log_dir']}: {e}", stacklevel=2)
        _run["writer"] = None


def _report(now: float) -> None:
    if _run["hosts"] is None or len(_run["hosts"]) != basics.size():
        _run["hosts"] = _hosts()
        if _page[0] is not None and basics.rank() == 0:
            _page[0].state.set_ranks(_run["hosts"], _elastic_round())
    interval = now - _run["t0"]
    steps = _run["since"]
    stall_s = _page[0].stall_seconds if _page[0] is not None else float("inf")
    row = _row(_run["steps"], interval / max(steps, 1), interval, stall_s)
    rows = _gather(row, "bluefog.job_page.report")
    if _page[0] is not None and basics.rank() == 0:
        _page[0].state.record(rows.tolist())
        _write_scalars(_run["steps"])


def job_page_step() -> None:
    """Marks the end of one training step; every rank calls it once per step, in a custom
    loop (``JobPageCallback`` does it in ``fit``). A no-op until ``serve_job_page`` ran (or
    ``BLUEFOG_JOB_PAGE`` is set, which turns the page on at the first call). Every
    ``every_n_steps`` calls it runs one small allgather: all ranks must call it equally
    often."""
    if _run["on"] is None:
        if os.environ.get(VARIABLE, "").strip():
            serve_job_page()
        else:
            _run["on"] = False
    if not _run["on"]:
        return
    if _run["serve_again"]:
        serve_job_page(_run["address"], _run["secret_file"], _run["every"])
    now = time.perf_counter()
    if _run["t0"] is None:  # the first call starts the clock
        _run["t0"], _run["since"] = now, 0
        return
    _run["steps"] += 1
    _run["since"] += 1
    if _run["since"] >= _run["every"]:
        _report(now)
        _run["t0"], _run["since"] = time.perf_counter(), 0


def log_to_tensorboard(log_dir: Optional[str]) -> None:
    """Rank 0 writes each report's per-rank scalars under ``log_dir`` (None: stops)."""
    if basics.rank() != 0 or log_dir == _run["log_dir"]:
        return
    _run["log_dir"] = log_dir
    _run["writer"] = None if log_dir is None else tf.summary.create_file_writer(log_dir)
    if log_dir is not None and _page[0] is None:
        # No page served: rank 0 still keeps the state the scalars are computed from.
        _page[0] = _StateOnly()


class _StateOnly:
    """Rank 0's state without a server (TensorBoard only)."""

    def __init__(self):
        self.state = JobState()
        self.stall_seconds = stall_seconds()
        self.url = None
        self.port = self.host = None

    def close(self) -> None:
        pass
