"""Non-blocking collectives: each op's handle gives exactly what its blocking op gives, with
computation running while the handles are in flight; and the handle errors."""

import gc
import warnings

import numpy as np
import pytest
import tensorflow as tf

import bluefog.tensorflow as bf

from conftest import needs_ranks, rank_values

SHAPE = (4, 3)


@pytest.fixture(autouse=True)
def default_topology():
    bf.set_topology()
    yield
    bf.set_topology()


def _x(rank, offset=0):
    return tf.constant(rank_values(SHAPE, rank, offset=offset))


def _overlap():
    """Some local computation done while handles are in flight."""
    m = tf.random.stateless_uniform((64, 64), seed=(1, 2), dtype=tf.float64)
    for _ in range(5):
        m = tf.linalg.matmul(m, m) / 64.0
    return float(tf.reduce_sum(m))


CASES = {
    "allreduce": (lambda x, n: bf.allreduce_nonblocking(x, name=n),
                  lambda x, n: bf.allreduce(x, name=n)),
    "allreduce_sum": (lambda x, n: bf.allreduce_nonblocking(x, average=False, name=n),
                      lambda x, n: bf.allreduce(x, average=False, name=n)),
    "allgather": (lambda x, n: bf.allgather_nonblocking(x, name=n),
                  lambda x, n: bf.allgather(x, name=n)),
    "broadcast": (lambda x, n: bf.broadcast_nonblocking(x, bf.size() - 1, name=n),
                  lambda x, n: bf.broadcast(x, bf.size() - 1, name=n)),
    "neighbor_allreduce": (lambda x, n: bf.neighbor_allreduce_nonblocking(x, name=n),
                           lambda x, n: bf.neighbor_allreduce(x, name=n)),
    "neighbor_allgather": (lambda x, n: bf.neighbor_allgather_nonblocking(x, name=n),
                           lambda x, n: bf.neighbor_allgather(x, name=n)),
    "hierarchical_neighbor_allreduce": (
        lambda x, n: bf.hierarchical_neighbor_allreduce_nonblocking(x, name=n),
        lambda x, n: bf.hierarchical_neighbor_allreduce(x, name=n)),
}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("case", sorted(CASES))
def test_nonblocking_matches_blocking(case, rank):
    start, blocking = CASES[case]
    handles = [start(_x(rank, i), f"nb.{case}.{i}") for i in range(3)]
    _overlap()
    assert all(isinstance(h, bf.Handle) for h in handles)
    got = [bf.synchronize(h) if i % 2 else bf.wait(h) for i, h in enumerate(handles)]
    for i, out in enumerate(got):
        want = blocking(_x(rank, i), f"b.{case}.{i}")
        np.testing.assert_array_equal(out.numpy(), want.numpy())


@pytest.mark.timeout(120)
def test_unnamed_handles_in_flight_together(rank, size):
    handles = [bf.allreduce_nonblocking(_x(rank, i), average=False) for i in range(4)]
    while not all(bf.poll(h) for h in handles):
        _overlap()
    for i, h in enumerate(handles):
        want = sum(rank_values(SHAPE, r, offset=i) for r in range(size))
        np.testing.assert_array_equal(bf.synchronize(h).numpy(), want)


@pytest.mark.timeout(120)
def test_wait_twice_and_bad_handles(rank):
    h = bf.allreduce_nonblocking(_x(rank), name="nb.twice")
    bf.wait(h)
    with pytest.raises(ValueError, match=rf"rank {rank}: .*synchronize: handle {h.id} .*"
                                         "synchronized already"):
        bf.wait(h)
    with pytest.raises(ValueError, match="poll: handle 999999 is not in flight"):
        bf.poll(999999)
    with pytest.raises(TypeError, match=f"rank {rank}: bluefog synchronize: expected a handle"):
        bf.synchronize("h")


@needs_ranks(2)
@pytest.mark.timeout(120)
def test_mismatched_shapes_fail_on_every_rank(rank):
    x = tf.ones((rank + 1, 2), tf.float64)
    h = bf.allreduce_nonblocking(x, name="nb.mismatch")
    with pytest.raises(tf.errors.OpError) as info:
        bf.synchronize(h)
    text = str(info.value)
    assert f"rank {rank}: bluefog allreduce_nonblocking of tensor 'nb.mismatch'" in text
    assert f"(handle {h.id})" in text
    assert "shape" in text.lower()


@pytest.mark.timeout(120)
def test_int_ids_outlive_their_handle_objects(rank, size):
    """Bluefog's programs may keep only int(handle): each op is kept until synchronized by its
    id (dropping the Handle object forgets nothing), and no id names another op."""
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        ids = [int(bf.allreduce_nonblocking(_x(rank, i), average=False, name=f"nb.id.{i}"))
               for i in range(3)]
        gc.collect()
        more = [int(bf.allreduce_nonblocking(_x(rank, i), average=False, name=f"nb.id.{i + 3}"))
                for i in range(3, 5)]
        gc.collect()
    assert not [w for w in seen if issubclass(w.category, RuntimeWarning)], \
        [str(w.message) for w in seen]
    assert len(set(ids + more)) == 5
    for i, hid in reversed(list(enumerate(ids + more))):
        while not bf.poll(hid):
            _overlap()
        want = sum(rank_values(SHAPE, r, offset=i) for r in range(size))
        np.testing.assert_array_equal(bf.synchronize(hid).numpy(), want)
    with pytest.raises(ValueError, match=f"handle {ids[0]} is not in flight"):
        bf.synchronize(ids[0])


@pytest.mark.timeout(120)
def test_unsynchronized_handle_is_reported_at_exit(rank):
    from bluefog.tensorflow import nonblocking

    h = bf.allreduce_nonblocking(_x(rank), name="nb.dropped")
    while not bf.poll(h):
        pass
    hid = int(h)
    del h
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        nonblocking._report_open()  # what runs at interpreter exit
    assert any(issubclass(w.category, RuntimeWarning) and "nb.dropped" in str(w.message)
               and "still open at exit" in str(w.message)
               for w in seen), [str(w.message) for w in seen]
    with pytest.raises(ValueError, match=f"handle {hid} is not in flight"):
        bf.synchronize(hid)


@pytest.mark.timeout(60)
def test_refused_inside_tf_function(rank):
    @tf.function
    def f(x):
        return bf.allreduce_nonblocking(x, name="nb.graph")

    with pytest.raises(RuntimeError, match=rf"rank {rank}: bluefog allreduce_nonblocking .*"
                                           "eagerly only"):
        f(_x(rank))


@pytest.mark.timeout(120)
def test_more_handles_than_any_pool_in_reverse_order_on_one_rank(rank, size):
    """200 named handles, issued in reverse order on rank 0: each finishes whatever the order
    (no pool of waiters may hold them all while the matching ones queue behind)."""
    n = 200
    order = range(n - 1, -1, -1) if rank == 0 else range(n)
    handles = {i: bf.allreduce_nonblocking(tf.constant([float(rank + i)]), average=False,
                                           name=f"nb.many.{i}") for i in order}
    for i in range(n):
        expected = sum(r + i for r in range(size))
        np.testing.assert_allclose(bf.synchronize(handles[i]).numpy(), [expected])


@pytest.mark.timeout(120)
def test_blocking_call_on_a_name_in_flight_fails_on_every_rank(rank, size):
    """A blocking collective named as a handle not yet synchronized fails at once on every rank,
    whether or not the handle's collective already finished on that rank (here rank 0 waits
    for it to finish first, the others do not); the next collective then runs."""
    handle = bf.allreduce_nonblocking(tf.constant([1.0]), average=False, name="nb.shared")
    if rank == 0:
        while not bf.poll(handle):
            pass
    with pytest.raises(ValueError, match=r"nb.shared.*not yet synchronized"):
        bf.allreduce(tf.constant([2.0]), name="nb.shared")
    with pytest.raises(ValueError, match=r"nb.shared.*not yet synchronized"):
        bf.allreduce_nonblocking(tf.constant([2.0]), name="nb.shared")
    np.testing.assert_allclose(bf.synchronize(handle).numpy(), [float(size)])
    np.testing.assert_allclose(bf.allreduce(tf.constant([3.0]), average=False,
                                            name="nb.shared").numpy(), [3.0 * size])
