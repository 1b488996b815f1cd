"""Window mutexes: win_mutex blocks, require_mutex operations and how a refusal leaves the
mutexes (never released for the holder, never kept by a refused request), plus a nonblocking
operation waiting for a held mutex. Values and buffers as in test_windows.py."""

import re
import time

import numpy as np
import pytest
import tensorflow as tf

import bluefog.tensorflow as bf
from bluefog.common import topology_util as tu

from conftest import needs_ranks
from conftest import win_sync as sync
from window_model import SHAPE, buffer, buffers, raises, value

pytestmark = pytest.mark.usefixtures("clean_windows")


@needs_ranks(2)
def test_nonblocking_stays_pending_while_target_locked(rank, size):
    """Rank 0 holds its own mutex; rank 1's require_mutex put into rank 0 waits for it."""
    bf.set_topology(tu.RingGraph(size))
    bf.win_create(tf.constant(value(rank)), "w", zero_init=True)
    if rank == 0:
        with bf.win_mutex("w", for_self=True):
            sync()
            sync()
    else:
        sync()
        h = None
        if rank == 1:
            h = bf.win_put_nonblocking(tf.constant(value(1)), "w", dst_weights={0: 1.0},
                                       require_mutex=True)
            for _ in range(20):
                time.sleep(0.01)
                assert bf.win_poll(h) is False
            g = bf.win_get_nonblocking("w", src_weights={0: 2.0}, require_mutex=True)
            time.sleep(0.1)
            assert bf.win_poll(g) is False
        sync()
        if h is not None:
            assert bf.win_wait(h) is True
            assert bf.win_wait(g) is True
            np.testing.assert_array_equal(buffer("w", 0), 2 * value(0))
    sync()
    if rank == 0:
        np.testing.assert_array_equal(buffer("w", 1), value(1))


def test_error_mutex_asked_again_by_its_holder(rank, size):
    """require_mutex inside win_mutex on the same rank fails instead of waiting for itself."""
    bf.win_create(tf.constant(value(rank)), "w")
    with bf.win_mutex("w", for_self=True):
        with raises(tf.errors.InvalidArgumentError, "win_mutex", "w",
                    match=rf"rank {rank} holds the mutex of window 'w' on \[{rank}\] already"):
            bf.win_update("w", require_mutex=True)
    # Released: taking it again works.
    bf.win_update("w", require_mutex=True)


def error_of(call):
    """The exception `call()` raised (None if none): a rank records it and asserts after the
    test's last sync, so a failing check cannot leave the other ranks in a collective."""
    try:
        call()
    except Exception as e:  # noqa: BLE001 - any failure is the test's finding
        return e
    return None


def assert_names(error, op, name, pattern):
    """`error` is a window error naming this rank, `op` and window `name`, matching `pattern`."""
    assert error is not None, f"{op} did not fail"
    msg = str(error)
    for part in (f"rank {bf.rank()}", op, repr(name)):
        assert part in msg, f"{part!r} not in {msg!r}"
    assert re.search(pattern, msg), f"{pattern!r} not in {msg!r}"


@needs_ranks(2)
def test_refused_require_mutex_keeps_the_callers_win_mutex(rank, size):
    """Rank 0 holds rank 1's mutex (win_mutex); its require_mutex put to rank 1 (and rank 2)
    is refused before it locks anything, and win_mutex still holds rank 1's mutex: rank 2's
    require_mutex put into rank 1 waits until rank 0 leaves the block, which releases it."""
    bf.set_topology(tu.FullyConnectedGraph(size))
    bf.win_create(tf.constant(value(rank)), "w", zero_init=True)
    targets = {r: 1.0 for r in range(1, min(size, 3))}
    put_error = exit_error = h = None
    got_in = False
    if rank == 0:
        def block():
            nonlocal put_error
            with bf.win_mutex("w", ranks=[1]):
                sync()
                put_error = error_of(lambda: bf.win_put(tf.constant(value(0)), "w",
                                                        dst_weights=targets, require_mutex=True))
                sync()  # A: the refused put is over
                sync()  # B: rank 2's put was tried
        exit_error = error_of(block)
    else:
        sync()
        sync()  # A
        if rank == 2:
            h = bf.win_put_nonblocking(tf.constant(value(rank)), "w", dst_weights={1: 1.0},
                                       require_mutex=True)
            for _ in range(20):
                time.sleep(0.01)
                got_in = got_in or bf.win_poll(h)
        sync()  # B
    sync()  # rank 0 left the block
    if h is not None:
        assert bf.win_wait(h) is True
    sync()
    if rank == 0:
        assert_names(put_error, "win_put", "w", r"rank 0 holds the mutex of window 'w' on \[1\] "
                                                r"already \(in a bf.win_mutex block\).*nothing "
                                                r"was locked")
        assert exit_error is None, f"leaving win_mutex failed: {exit_error}"
    assert not got_in, "rank 2 got rank 1's mutex while rank 0's win_mutex held it"
    if rank == 1:
        got = buffers("w")
        np.testing.assert_array_equal(got[0], np.zeros(SHAPE, np.float32))
        if size > 2:
            np.testing.assert_array_equal(got[2], value(2))
    # Every mutex is free again.
    with bf.win_mutex("w", ranks=[r for r in range(size) if r != rank]):
        pass


@needs_ranks(3)
def test_win_mutex_refused_part_way_releases_what_it_took(rank, size):
    """Rank 0's require_mutex put holds rank 1's mutex while it waits for rank 2's (held by
    rank 2). Rank 0's win_mutex on ranks [0, 1] gets its own mutex, then rank 1 refuses (rank 0
    holds it already): the error says so, and rank 0's own mutex is released again, so rank 2's
    require_mutex put into rank 0 finishes and win_free succeeds."""
    bf.set_topology(tu.FullyConnectedGraph(size))
    bf.win_create(tf.constant(value(rank)), "w", zero_init=True)
    put = mutex_error = None
    put_done = True
    if rank == 2:
        with bf.win_mutex("w", for_self=True):
            sync()  # A: rank 2 holds its mutex
            sync()  # B: rank 0's put holds rank 1's and waits for rank 2's
            sync()  # C: rank 0's win_mutex was refused
    else:
        sync()  # A
        if rank == 0:
            put = bf.win_put_nonblocking(tf.constant(value(0)), "w",
                                         dst_weights={1: 1.0, 2: 1.0}, require_mutex=True)
            time.sleep(0.1)
            assert bf.win_poll(put) is False
        sync()  # B
        if rank == 0:
            def take():
                with bf.win_mutex("w", ranks=[0, 1]):
                    pass
            mutex_error = error_of(take)
        sync()  # C
    if put is not None:
        assert bf.win_wait(put) is True
    sync()
    if rank == 2:  # waits for rank 0's own mutex: bounded, so a lock left held fails here
        h = bf.win_put_nonblocking(tf.constant(value(2)), "w", dst_weights={0: 1.0},
                                   require_mutex=True)
        deadline = time.time() + 10
        while not bf.win_poll(h) and time.time() < deadline:
            time.sleep(0.01)
        put_done = bool(bf.win_poll(h))
    sync()
    got = buffer("w", 2) if rank == 0 else None
    free_error = error_of(lambda: bf.win_free("w"))  # on every rank, before any assertion
    assert put_done, "rank 0's mutex stayed locked after its win_mutex failed"
    assert free_error is None, f"win_free failed: {free_error}"
    if rank == 2:
        assert bf.win_wait(h) is True
    if rank == 0:
        assert_names(mutex_error, "win_mutex", "w",
                     r"rank 1 refused: rank 0 asks for the mutex of window 'w', which it holds "
                     r"already.*\(the mutexes it had taken, on \[0\], were released\)")
        np.testing.assert_array_equal(got, value(2))
