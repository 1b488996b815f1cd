"""The flight recorder on every rank: what bf.flight_recorder() shows of collectives, neighbour
and window operations, a request still waiting for the other ranks, and SIGUSR1's dump."""

import os
import signal
import time

import numpy as np
import pytest
import tensorflow as tf

import bluefog.tensorflow as bf
from bluefog.common import library

from conftest import win_sync


def entries(name):
    return [e for e in bf.flight_recorder() if e["name"] == name]


def test_records_collectives_neighbour_and_window_ops(rank, size):
    bf.allreduce(tf.ones([3]), name="fr.sum")
    bf.neighbor_allreduce(tf.ones([2], tf.float64), name="fr.mix")
    (sum_entry,) = entries("fr.sum")
    assert sum_entry["kind"] == "allreduce" and sum_entry["state"] == "done"
    assert sum_entry["bytes"] == 12 and sum_entry["dtype"] == "float32"
    assert sum_entry["process_set"] == 0
    assert sum_entry["queued_s_ago"] >= sum_entry["started_s_ago"] >= sum_entry["ended_s_ago"] >= 0
    (mix,) = entries("fr.mix")
    assert (mix["kind"], mix["state"], mix["bytes"]) == ("neighbor_allreduce", "done", 16)
    assert mix["id"] > sum_entry["id"]
    bf.set_topology()
    try:
        bf.win_create(tf.zeros([4]), "fr.win", zero_init=True)
        bf.win_put(tf.ones([4]), "fr.win")
        bf.win_accumulate(tf.ones([4]), "fr.win")
        win_sync()
        bf.win_get("fr.win")
        kinds = [(e["kind"], e["state"]) for e in entries("fr.win")]
        assert ("win_put", "done") in kinds and ("win_accumulate", "done") in kinds, kinds
        assert ("win_get", "done") in kinds, kinds
        put = [e for e in entries("fr.win") if e["kind"] == "win_put"][-1]
        assert put["bytes"] == 16
    finally:
        win_sync()
        bf.win_free("fr.win")


def test_a_request_waiting_for_other_ranks_shows_queued(rank, size):
    x = tf.constant([float(rank)])
    if rank == 0:
        handle = bf.allreduce_nonblocking(x, average=False, name="fr.late")
        deadline = time.monotonic() + 20  # the op reaches the runtime from another thread
        while not entries("fr.late") and time.monotonic() < deadline:
            time.sleep(0.01)
        (entry,) = entries("fr.late")
        assert entry["state"] == "queued" and entry["started_s_ago"] is None
        bf.barrier()
    else:
        bf.barrier()
        handle = bf.allreduce_nonblocking(x, average=False, name="fr.late")
    np.testing.assert_allclose(bf.synchronize(handle).numpy(), [size * (size - 1) / 2])
    assert entries("fr.late")[-1]["state"] == "done"


def test_failed_request_is_marked_failed(rank, size):
    with pytest.raises(tf.errors.OpError, match="fr.bad"):
        # Ranks disagree on the shape: fails on every rank.
        bf.allreduce(tf.ones([rank + 1]), name="fr.bad")
    assert entries("fr.bad")[-1]["state"] == "failed"


def test_sigusr1_prints_pending_operations_and_python_stacks(rank, size, capfd):
    # SIGUSR1 had no handler before bf.init(): the runtime took it (else the kill would end us).
    assert library.load().bluefog_flight_dump_installed() == 1
    os.kill(os.getpid(), signal.SIGUSR1)
    deadline = time.monotonic() + 20
    err = ""
    while time.monotonic() < deadline and "operations:" not in err:
        time.sleep(0.1)
        err += capfd.readouterr().err
    assert f"bluefog rank {rank} flight recorder (SIGUSR1)" in err, err
    assert "'fr.bad' failed" in err or "last 10 operations" in err, err
    assert "test_sigusr1_prints_pending_operations_and_python_stacks" in err, err  # the stack
