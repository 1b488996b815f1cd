"""broadcast_object and allgather_object: Python objects of different sizes on every rank."""

import numpy as np
import pytest
import tensorflow as tf

import bluefog.tensorflow as bf

from conftest import needs_ranks


def rank_object(r):
    """An object whose pickle size grows with the rank."""
    return {"rank": r, "name": "x" * (100 * r), "shape": (r, 2), "array": np.arange(r)}


def same(a, b):
    return (a.keys() == b.keys() and all(
        np.array_equal(a[k], b[k]) if isinstance(a[k], np.ndarray) else a[k] == b[k]
        for k in a))


def test_broadcast_object_from_every_root(rank, size):
    for root in range(size):
        got = bf.broadcast_object(rank_object(rank), root_rank=root, name=f"obj.bcast.{root}")
        assert same(got, rank_object(root))


def test_broadcast_object_unnamed_and_none(rank):
    assert bf.broadcast_object(None if rank == 0 else "ignored") is None
    assert bf.broadcast_object("resume at epoch 7" if rank == 0 else None) == "resume at epoch 7"


def test_allgather_object(rank, size):
    got = bf.allgather_object(rank_object(rank), name="obj.gather")
    assert len(got) == size
    for r, obj in enumerate(got):
        assert same(obj, rank_object(r))
    assert bf.allgather_object(b"", name="obj.gather.empty") == [b""] * size


@needs_ranks(2)
def test_an_unpicklable_object_fails_on_every_rank(rank, size):
    bad = (lambda: 0) if rank == size - 1 else "fine"
    with pytest.raises(TypeError, match=rf"rank\(s\) \[{size - 1}\] cannot be pickled"):
        bf.allgather_object(bad, name="obj.bad.gather")
    with pytest.raises(TypeError, match=r"rank\(s\) \[0\] cannot be pickled"):
        bf.broadcast_object((lambda: 0) if rank == 0 else None, root_rank=0, name="obj.bad.bcast")
    assert bf.allgather_object(rank, name="obj.after") == list(range(size))


def test_objects_are_eager_only(rank):
    @tf.function
    def inside():
        return bf.broadcast_object(1, name="obj.fn")

    with pytest.raises(RuntimeError, match="eager mode only"):
        inside()
    with pytest.raises(ValueError, match="root_rank"):
        bf.broadcast_object(1, root_rank=bf.size(), name="obj.badroot")


def test_objects_in_a_v1_graph_through_the_session(rank, size):
    graph = tf.Graph()
    with graph.as_default(), tf.compat.v1.Session(graph=graph) as sess:
        # The default session.
        got = bf.broadcast_object({"epoch": 7} if rank == 0 else None, root_rank=0,
                                  name="obj.graph.bcast")
        assert got == {"epoch": 7}
        assert bf.allgather_object(f"r{rank}", name="obj.graph.gather") == [
            f"r{r}" for r in range(size)]
    # No default session: an explicit one, or a clear error.
    graph = tf.Graph()
    with graph.as_default():
        with pytest.raises(RuntimeError, match="session"):
            bf.broadcast_object(1, name="obj.graph.nosession")
        with tf.compat.v1.Session(graph=graph) as sess:
            assert bf.allgather_object(rank, name="obj.graph.explicit", session=sess) == list(
                range(size))
