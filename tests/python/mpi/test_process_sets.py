"""Process sets: collectives over a subset of the ranks, registered on every rank.

Even and odd ranks each get a set. Every expected value is computed in closed form from the
set's ranks; a set's collectives must not wait for ranks outside it (checked by making those
ranks wait on a global collective that the set's ranks join only afterwards: a set that waited
would hang, and mpirun's timeout would fail the run).
"""

import os

import numpy as np
import pytest
import tensorflow as tf

import bluefog.tensorflow as bf
from bluefog.common.basics import BluefogError

from conftest import needs_ranks


@pytest.fixture(scope="module")
def sets():
    even = bf.add_process_set([r for r in range(bf.size()) if r % 2 == 0])
    odd = bf.add_process_set(bf.ProcessSet([r for r in range(bf.size()) if r % 2 == 1]))
    yield even, odd
    bf.remove_process_set(even)
    bf.remove_process_set(odd)


def _mine(sets):
    return sets[bf.rank() % 2]


@needs_ranks(2)
def test_broadcast_variables_over_a_set(sets, rank, size):
    """Horovod's broadcast_variables(process_set=..., inplace=...): the set's ranks take its
    root's values; the other set does the same on its own at the same time."""
    ps = _mine(sets)
    root = ps.ranks[-1]
    v = [tf.Variable([float(rank), 1.0]), tf.Variable(float(rank) * 2)]
    bf.broadcast_variables(v, root, process_set=ps, inplace=True)
    np.testing.assert_allclose(v[0].numpy(), [root, 1.0])
    assert float(v[1].numpy()) == 2.0 * root
    outside = sets[1 - rank % 2].ranks[0]
    with pytest.raises(ValueError, match=f"root_rank {outside} is not in"):
        bf.broadcast_variables(v, outside, process_set=ps)


@needs_ranks(2)
def test_layout(sets, rank, size):
    even, odd = sets
    assert even.process_set_id != odd.process_set_id
    ps = _mine(sets)
    assert ps.included() and ps.rank() == ps.ranks.index(rank) and ps.size() == len(ps.ranks)
    other = sets[1 - rank % 2]
    assert other.included() is False and other.rank() == -1
    assert bf.global_process_set.size() == size and bf.global_process_set.rank() == rank


def _set_ops(ps, rank):
    n = len(ps.ranks)
    total = sum(r + 1 for r in ps.ranks)
    out = bf.allreduce(tf.fill([3], float(rank + 1)), average=True, name="ps.avg", process_set=ps)
    np.testing.assert_allclose(out.numpy(), [total / n] * 3)
    g = bf.allgather(tf.fill([rank + 1, 1], rank), name="ps.gather", process_set=ps)
    np.testing.assert_array_equal(g.numpy()[:, 0],
                                  np.concatenate([[r] * (r + 1) for r in ps.ranks]))
    b = bf.broadcast(tf.constant([rank]), root_rank=ps.ranks[-1], name="ps.bcast", process_set=ps)
    assert b.numpy().tolist() == [ps.ranks[-1]]
    out, received = bf.alltoall(tf.fill([n, 1], rank), splits=[1] * n, name="ps.a2a",
                                process_set=ps)
    assert out.numpy()[:, 0].tolist() == ps.ranks and received.numpy().tolist() == [1] * n
    out = bf.alltoall(tf.fill([n, 1], rank), name="ps.a2a.even", process_set=ps)
    assert out.numpy()[:, 0].tolist() == ps.ranks
    rs = bf.reducescatter(tf.ones([n, 2]) * (rank + 1), op=bf.Sum, name="ps.rs", process_set=ps)
    np.testing.assert_allclose(rs.numpy(), [[total] * 2])


@needs_ranks(2)
def test_collectives_in_a_set_do_not_wait_for_the_others(sets, rank, size):
    ps = _mine(sets)
    if rank % 2 == 0:
        _set_ops(ps, rank)
    bf.allreduce(tf.constant([1.0]), name="ps.gate")  # odd ranks wait here for the even ones
    if rank % 2 == 1:
        _set_ops(ps, rank)


@needs_ranks(2)
@pytest.mark.parametrize("mode", ["function", "graph"])
def test_set_collectives_in_graphs(sets, rank, mode):
    ps = _mine(sets)

    def fn():
        return bf.allreduce(tf.constant([float(rank)]), average=False, name=f"ps.{mode}",
                            process_set=ps)

    if mode == "function":
        value = tf.function(fn)().numpy()
    else:
        graph = tf.Graph()
        with graph.as_default():
            out = fn()
        with tf.compat.v1.Session(graph=graph) as sess:
            value = sess.run(out)
    np.testing.assert_allclose(value, [sum(ps.ranks)])


@needs_ranks(2)
def test_large_allreduce_over_a_set(sets, rank):
    """Over the ring threshold: a set whose ranks share a host reads its peers' buffers
    directly (the odd set has one rank at 2 and 3 ranks: nothing to exchange)."""
    ps = _mine(sets)
    n = (1 << 20) // 4 + 3 * 257
    x = tf.range(n, dtype=tf.float32) % 11.0 + float(rank)
    got = bf.allreduce(x, average=True, name="ps.large", process_set=ps).numpy()
    want = np.arange(n, dtype=np.float32) % 11.0 + float(np.mean(ps.ranks))
    np.testing.assert_allclose(got, want, rtol=1e-6)
    doubled = tf.function(lambda t: bf.allreduce(t * 2.0, average=False, name="ps.large.temp",
                                                 process_set=ps))(x).numpy()
    np.testing.assert_allclose(doubled, 2.0 * want * len(ps.ranks), rtol=1e-6)


@needs_ranks(2)
def test_gradients_and_tape_average_over_the_set(sets, rank):
    ps = _mine(sets)
    w = tf.Variable([1.0, 1.0])
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(w * float(rank + 1))
    tape = bf.DistributedGradientTape(tape, process_set=ps)
    (g,) = tape.gradient(loss, [w])
    mean = sum(r + 1 for r in ps.ranks) / len(ps.ranks)
    np.testing.assert_allclose(g.numpy(), [mean] * 2)
    x = tf.Variable([2.0])
    with tf.GradientTape() as tape:
        y = bf.allreduce(x, average=False, name="ps.grad", process_set=ps)
    np.testing.assert_allclose(tape.gradient(y, x).numpy(), [len(ps.ranks)])


@needs_ranks(2)
def test_mistakes(sets, rank, size):
    other = sets[1 - rank % 2]
    with pytest.raises(ValueError, match="is not in"):
        bf.allreduce(tf.ones([1]), name="ps.outside", process_set=other)
    # Registering different sets fails on every rank.
    with pytest.raises(BluefogError, match="ranks disagree on the process set's ranks"):
        bf.add_process_set([rank])
    with pytest.raises(ValueError, match="must be a non-empty list"):
        bf.add_process_set([size])
    with pytest.raises(ValueError, match="registered already"):
        bf.add_process_set(sets[0])
    with pytest.raises(ValueError, match="global process set cannot be removed"):
        bf.remove_process_set(bf.global_process_set)
    unregistered = bf.ProcessSet([0])
    with pytest.raises(ValueError, match="not registered"):
        bf.allreduce(tf.ones([1]), name="ps.unregistered", process_set=unregistered)
    out = bf.allreduce(tf.constant([1.0]), average=False, name="ps.after.mistakes")
    np.testing.assert_allclose(out.numpy(), [size])


def test_removed_set_refuses_collectives(rank, size):
    ps = bf.add_process_set(list(range(size)))
    out = bf.allreduce(tf.constant([1.0]), average=False, name="ps.tmp", process_set=ps)
    np.testing.assert_allclose(out.numpy(), [size])
    assert bf.remove_process_set(ps) is True
    assert bf.remove_process_set(ps) is False
    with pytest.raises(ValueError, match="not registered"):
        bf.allreduce(tf.ones([1]), name="ps.removed", process_set=ps)


def test_tape_after_its_set_was_removed_says_so(rank, size):
    ps = bf.add_process_set(list(range(size)))
    set_id = ps.process_set_id
    x = tf.Variable([2.0])
    with tf.GradientTape() as tape:
        y = bf.allreduce(x, average=False, name="ps.tape.removed", process_set=ps)
    assert bf.remove_process_set(ps) is True
    with pytest.raises(KeyError) as raised:  # a lookup by id: KeyError, and a ValueError
        tape.gradient(y, x)
    assert isinstance(raised.value, ValueError)
    text = str(raised.value)
    assert text.startswith(f"rank {rank}: bluefog: process set {set_id} is not registered"), text
    assert "remove_process_set" in text and "add_process_set" in text, text


@pytest.mark.parametrize("bad", [[0.7], [0, "1"], "01", [True], [0, 1.0], 0])
def test_ranks_must_be_integers(bad, rank, size):
    """A float or a string would be truncated or parsed into some other rank: only Python and
    numpy integers are ranks."""
    with pytest.raises(TypeError, match=f"rank {rank}: .*ranks must be .*integers"):
        bf.ProcessSet(bad)
    with pytest.raises(TypeError, match="integers"):
        bf.add_process_set(bad)
    ps = bf.add_process_set(np.arange(size, dtype=np.int64)[::-1])
    assert ps.ranks == list(range(size)) and all(type(r) is int for r in ps.ranks)
    bf.remove_process_set(ps)


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def test_add_collective_remove_cycles_do_not_grow_the_process(rank, size):
    """A set registered again with the same ranks takes its old id back: the id is an attribute
    of the TensorFlow ops, and TensorFlow keeps an eager kernel per attribute value for good,
    about 35 KB each (fresh ids grew the process by that much per cycle)."""
    def cycle(t):
        ps = bf.add_process_set(list(range(size)))
        out = bf.allreduce(tf.constant([1.0]), average=False, name="ps.cycle", process_set=ps)
        assert float(out.numpy()[0]) == size
        set_id = ps.process_set_id
        assert bf.remove_process_set(ps) is True
        return set_id

    first = {cycle(t) for t in range(20)}
    before = _rss_bytes()
    cycles = 300
    ids = {cycle(t) for t in range(cycles)}
    growth = _rss_bytes() - before
    assert len(first) == 1 and ids == first, (first, ids)
    assert growth < cycles * 8 * 1024, f"grew {growth / cycles:.0f} bytes per cycle"
