"""One-sided windows (bf.win_*) on every rank, checked against a numpy model of the buffers.

Rank ``r``'s value is ``value(r)`` (distinct per rank). A receive buffer is read back with
``win_update(clone=True)`` and weights selecting that buffer alone. ``sync()`` (an allreduce)
separates phases: a finished ``win_put`` is in the target's buffer, so after ``sync()`` every
rank sees every other rank's writes. With one rank a window has no neighbours.
"""

import warnings

import networkx as nx
import numpy as np
import pytest
import tensorflow as tf

import bluefog.tensorflow as bf
from bluefog.common import topology_util as tu

from conftest import needs_ranks
from conftest import win_sync as sync
from window_model import SHAPE, buffer, buffers, raises, value

pytestmark = pytest.mark.usefixtures("clean_windows")


def pair_weight(src, dst):
    """A per-edge weight, exact in float32."""
    return 0.5 + 0.25 * dst + 0.125 * src


# ---- Each operation against the model -----------------------------------------------------

@pytest.mark.parametrize("zero_init", [False, True])
@pytest.mark.parametrize("as_variable", [False, True])
def test_create(zero_init, as_variable, rank, size):
    x = value(rank)
    t = tf.Variable(x) if as_variable else tf.constant(x)
    assert bf.win_create(t, "w", zero_init=zero_init) is True
    assert bf.window_names() == ["w"]
    var = bf.window_variable("w")
    assert (var is t) == as_variable
    np.testing.assert_array_equal(var.numpy(), x)
    assert sorted(bf.get_win_version("w")) == bf.in_neighbor_ranks()
    assert set(bf.get_win_version("w").values()) <= {0}
    for s, b in buffers("w").items():
        np.testing.assert_array_equal(b, np.zeros_like(x) if zero_init else x, err_msg=f"{s}")
    assert bf.win_associated_p("w") == 1.0
    # The published value is the initial tensor.
    bf.win_get("w")
    for s, b in buffers("w").items():
        np.testing.assert_array_equal(b, value(s))


def test_put_default_and_per_call_weights(rank, size):
    bf.win_create(tf.constant(value(rank)), "w", zero_init=True)
    assert bf.win_put(tf.constant(value(rank)), "w") is True
    sync()
    assert bf.get_win_version("w") == {s: 1 for s in bf.in_neighbor_ranks()}
    for s, b in buffers("w").items():
        np.testing.assert_array_equal(b, value(s))
    sync()
    # Per-call weights to the first out-neighbour only; the others keep their buffer.
    outs = bf.out_neighbor_ranks()
    dst = {outs[0]: pair_weight(rank, outs[0])} if outs else {}
    assert bf.win_put(tf.constant(2 * value(rank)), "w", dst_weights=dst) is True
    sync()
    for s, b in buffers("w").items():
        first = min(r for r in bf.load_topology().successors(s) if r != s) == rank
        want = 2 * value(s) * pair_weight(s, rank) if first else value(s)
        np.testing.assert_array_equal(b, want, err_msg=f"buffer of {s}")


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_put_self_weight_publishes_scaled(dtype, rank, size):
    """The variable and the published value are both tensor * self_weight, rounded once in the
    tensor's dtype (1/3 is not exact in any float format)."""
    bf.win_create(tf.constant(value(rank, dtype)), "w")
    bf.win_put(tf.constant(value(rank, dtype)), "w", self_weight=1 / 3)
    np.testing.assert_array_equal(bf.window_variable("w").numpy(),
                                  value(rank, dtype) * dtype(1 / 3))
    sync()
    bf.win_get("w")
    for s, b in buffers("w").items():
        np.testing.assert_array_equal(b, value(s, dtype) * dtype(1 / 3))


def test_accumulate(rank, size):
    bf.win_create(tf.constant(value(rank)), "w")
    dst = {d: pair_weight(rank, d) for d in bf.out_neighbor_ranks()}
    bf.win_accumulate(tf.constant(value(rank)), "w", dst_weights=dst)
    bf.win_accumulate(tf.constant(value(rank)), "w", dst_weights=dst)
    sync()
    assert bf.get_win_version("w") == {s: 2 for s in bf.in_neighbor_ranks()}
    for s, b in buffers("w").items():
        np.testing.assert_array_equal(b, value(rank) + 2 * pair_weight(s, rank) * value(s))
    assert set(bf.get_win_version("w").values()) <= {0}


def test_get_with_src_weights(rank, size):
    bf.win_create(tf.constant(value(rank)), "w", zero_init=True)
    src = {s: pair_weight(s, rank) for s in bf.in_neighbor_ranks()}
    assert bf.win_get("w", src_weights=src) is True
    assert bf.get_win_version("w") == {s: 1 for s in bf.in_neighbor_ranks()}
    for s, b in buffers("w").items():
        np.testing.assert_array_equal(b, pair_weight(s, rank) * value(s))


def weighted_graph(size):
    """ExponentialGraph with distinct weights (each rank's in-weights and self-weight sum to 1)."""
    g = tu.ExponentialGraph(size)
    for v in range(size):
        srcs = [u for u in g.predecessors(v) if u != v]
        for u in srcs:
            g[u][v]["weight"] = 0.125 * (1 + (u % 2))
        g[v][v]["weight"] = 1.0 - sum(g[u][v]["weight"] for u in srcs)
    return g


@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("run", ["eager", "function"])
def test_update_default_weights(weighted, run, rank, size):
    if weighted:
        bf.set_topology(weighted_graph(size), is_weighted=True)
    var = tf.Variable(value(rank))
    bf.win_create(var, "w", zero_init=True)

    def step():
        bf.win_put(tf.constant(value(rank)), "w")
        return 0

    (tf.function(step) if run == "function" else step)()
    sync()

    def update():
        return bf.win_update("w")

    out = (tf.function(update) if run == "function" else update)().numpy()
    graph = bf.load_topology()

    def model(r):
        ins = sorted(u for u in graph.predecessors(r) if u != r)
        if weighted:
            sw, nw = tu.GetRecvWeights(graph, r)
        else:
            sw = 1.0 / (len(ins) + 1)
            nw = {s: sw for s in ins}
        return sw * value(r, np.float64) + sum(nw[s] * value(s, np.float64) for s in ins)

    np.testing.assert_allclose(out, model(rank), rtol=1e-6)
    np.testing.assert_array_equal(var.numpy(), out)  # the variable, updated in place
    assert set(bf.get_win_version("w").values()) <= {0}
    sync()
    bf.win_get("w")  # what the neighbours publish now is their update
    for s, b in buffers("w").items():
        np.testing.assert_allclose(b, model(s), rtol=1e-6, err_msg=f"published by {s}")


def test_putting_the_tensor_of_a_tensor_window_after_update_warns_once(rank, size):
    """Bluefog's idiom (win_put(x); win_update(name) in a loop) on a window made from a
    tf.Tensor: x cannot change, so the loop would never mix; the second put says so, once."""
    x = tf.constant(value(rank))
    bf.win_create(x, "w")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        bf.win_put(x, "w")  # the first value: right
        sync()
        y = bf.win_update("w")
    with pytest.warns(UserWarning, match=rf"rank {rank}: bluefog win_put of window 'w': this is "
                      r"the tf.Tensor the window was made from.*tf.Variable"):
        bf.win_put(x, "w")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        bf.win_put(x, "w")  # once per window
        bf.win_put(y, "w")  # the returned value: the right thing to put
    var = tf.Variable(value(rank))
    bf.win_create(var, "v")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for _ in range(2):  # a variable's window: updated in place, nothing to warn about
            bf.win_put(var, "v")
            sync()
            bf.win_update("v")
    sync()


def test_update_explicit_weights_reset_clone(rank, size):
    var = tf.Variable(value(rank))
    bf.win_create(var, "w", zero_init=True)
    bf.win_put(tf.constant(value(rank)), "w")
    sync()
    ins = bf.in_neighbor_ranks()
    nw = {s: pair_weight(s, rank) for s in ins}
    want = 0.25 * value(rank) + sum(nw[s] * value(s) for s in ins)
    out = bf.win_update("w", self_weight=0.25, neighbor_weights=nw, clone=True)
    np.testing.assert_allclose(out.numpy(), want, rtol=1e-6)
    np.testing.assert_array_equal(var.numpy(), value(rank))  # clone: untouched
    for s, b in buffers("w").items():
        np.testing.assert_array_equal(b, value(s))  # no reset
    out = bf.win_update("w", self_weight=0.25, neighbor_weights=nw, reset=True)
    np.testing.assert_allclose(out.numpy(), want, rtol=1e-6)
    np.testing.assert_array_equal(var.numpy(), out.numpy())
    for s, b in buffers("w").items():
        np.testing.assert_array_equal(b, np.zeros(SHAPE), err_msg=f"buffer of {s} after reset")


@pytest.mark.parametrize("dtype", [tf.float16, tf.bfloat16, tf.float32, tf.float64])
def test_update_then_collect(dtype, rank, size):
    var = tf.Variable(tf.constant(value(rank), dtype))  # small integers: exact in every dtype
    bf.win_create(var, "w", zero_init=True)
    bf.win_accumulate(tf.constant(value(rank), dtype), "w")
    bf.win_accumulate(tf.constant(value(rank), dtype), "w")
    sync()
    out = bf.win_update_then_collect("w")
    assert out.dtype == dtype
    want = value(rank) + sum(2 * value(s) for s in bf.in_neighbor_ranks())
    np.testing.assert_array_equal(out.numpy().astype(np.float32), want)
    np.testing.assert_array_equal(var.numpy().astype(np.float32), want)
    for s, b in buffers("w").items():
        np.testing.assert_array_equal(b.astype(np.float32), np.zeros(SHAPE), err_msg=f"{s}")


def test_single_rank_ops_are_noops(rank, size):
    if size != 1:
        pytest.skip("one rank only")
    bf.win_create(tf.constant(value(0)), "w")
    assert bf.get_win_version("w") == {}
    assert bf.win_put(tf.constant(value(0)), "w") is True
    assert bf.win_accumulate(tf.constant(value(0)), "w", self_weight=0.5) is True
    np.testing.assert_array_equal(bf.window_variable("w").numpy(), 0.5 * value(0))
    assert bf.win_get("w") is True
    np.testing.assert_array_equal(bf.win_update("w").numpy(), 0.5 * value(0))
    np.testing.assert_array_equal(bf.win_update_then_collect("w").numpy(), 0.5 * value(0))


# ---- Versions and nonblocking handles ---------------------------------------------------

def test_versions(rank, size):
    bf.win_create(tf.constant(value(rank)), "w")
    ins = bf.in_neighbor_ranks()
    for k in range(1, 4):
        bf.win_put(tf.constant(value(rank)), "w")
        sync()
        assert bf.get_win_version("w") == {s: k for s in ins}
        sync()
    if ins:  # reading one buffer resets only its version
        bf.win_update("w", self_weight=1.0, neighbor_weights={ins[0]: 0.0})
        assert bf.get_win_version("w") == {s: 0 if s == ins[0] else 3 for s in ins}
    bf.win_update("w")
    assert bf.get_win_version("w") == {s: 0 for s in ins}

    @tf.function
    def versions():
        return bf.get_win_version("w")

    assert {s: int(v) for s, v in versions().items()} == {s: 0 for s in ins}


def test_nonblocking_poll_wait(rank, size):
    bf.win_create(tf.constant(value(rank)), "w", zero_init=True)
    for h in [bf.win_put_nonblocking(tf.constant(value(rank)), "w"),
              bf.win_accumulate_nonblocking(tf.constant(value(rank)), "w"),
              bf.win_get_nonblocking("w")]:
        assert bf.win_poll(h) in (True, False)
        assert bf.win_wait(h) is True
        with pytest.raises(tf.errors.InvalidArgumentError, match="waited for already"):
            bf.win_wait(h)
        with pytest.raises(tf.errors.InvalidArgumentError, match="waited for already"):
            bf.win_poll(h)


# ---- Errors: clear, on the calling rank, naming the rank, the op and the window ----------

def test_errors_unknown_window(rank, size):
    x = tf.constant(value(rank))
    for op, call in [("win_put", lambda: bf.win_put(x, "nope")),
                     ("win_accumulate", lambda: bf.win_accumulate(x, "nope")),
                     ("win_get", lambda: bf.win_get("nope")),
                     ("win_update", lambda: bf.win_update("nope")),
                     ("win_mutex", lambda: bf.win_mutex("nope").__enter__()),
                     ("get_win_version", lambda: bf.get_win_version("nope")),
                     ("win_free", lambda: bf.win_free("nope"))]:
        with raises(ValueError, op, "nope", match="no window"):
            call()


def test_errors_tensor_and_create(rank, size):
    bf.win_create(tf.constant(value(rank)), "w")
    with raises(ValueError, "win_put", "w", match=r"shape \[5\]"):
        bf.win_put(tf.zeros([5]), "w")
    with raises(ValueError, "win_accumulate", "w", match="float64"):
        bf.win_accumulate(tf.constant(value(rank, np.float64)), "w")
    with raises(ValueError, "win_create", "w", match="exists already"):
        bf.win_create(tf.constant(value(rank)), "w")
    with raises(TypeError, "win_create", "i", match="int32"):
        bf.win_create(tf.constant([1, 2, 3]), "i")
    assert bf.window_names() == ["w"]

    # A shape that only the kernel sees (unknown while tracing) is refused there.
    @tf.function(input_signature=[tf.TensorSpec([None, None], tf.float32)])
    def put(t):
        return bf.win_put(t, "w")

    with pytest.raises(tf.errors.InvalidArgumentError, match=r"rank \d+: bluefog win_put of "
                       r"window 'w': the tensor is float32 of shape \[2, 4\]"):
        put(tf.zeros([2, 4]))
    # The window still works.
    assert bf.win_put(tf.constant(value(rank)), "w") is True


@needs_ranks(2)
def test_error_create_mismatch(rank, size):
    """Ranks that disagree on the shape or dtype all get an error; no window is made."""
    for t, what in [(tf.zeros([2 + rank]), "shape"),
                    (tf.zeros([2], tf.float16 if rank else tf.float32), "dtype")]:
        with raises(tf.errors.FailedPreconditionError, "win_create", "w",
                    match=f"ranks disagree on the {what}"):
            bf.win_create(t, "w")
        assert bf.window_names() == []
    assert bf.win_create(tf.zeros([2]), "w") is True


def test_errors_neighbours_and_weights(rank, size):
    bf.win_create(tf.constant(value(rank)), "w")
    x = tf.constant(value(rank))
    with raises(ValueError, "win_put", "w", match=f"rank {rank}, which is not an out-neighbor"):
        bf.win_put(x, "w", dst_weights={rank: 1.0})
    with raises(ValueError, "win_accumulate", "w", match=f"rank {size}, which is not an out"):
        bf.win_accumulate(x, "w", dst_weights={size: 1.0})
    with raises(ValueError, "win_get", "w", match=f"rank {rank}, which is not an in-neighbor"):
        bf.win_get("w", src_weights={rank: 1.0})
    with raises(ValueError, "win_update", "w", match=f"rank {rank}, which is not an in-neighbor"):
        bf.win_update("w", self_weight=0.5, neighbor_weights={rank: 0.5})
    with raises(ValueError, "win_update", "w", match="given together"):
        bf.win_update("w", self_weight=0.5)
    with raises(ValueError, "win_update", "w", match="given together"):
        bf.win_update("w", neighbor_weights={})
    with raises(ValueError, "win_mutex", "w", match="ranks must be ints in"):
        bf.win_mutex("w", ranks=[size]).__enter__()
    if size >= 4:  # ExponentialGraph(4): rank r sends to r+1 and r+2, not r+3
        other = (rank + 3) % size
        with raises(ValueError, "win_put", "w", match=f"rank {other}, which is not an out"):
            bf.win_put(x, "w", dst_weights={other: 1.0})
        with raises(ValueError, "win_get", "w", match=f"rank {(rank + 1) % size}, which"):
            bf.win_get("w", src_weights={(rank + 1) % size: 1.0})


@needs_ranks(2)
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_errors_weights_that_are_not_finite(bad, rank, size):
    """A NaN or infinite weight would spread into the neighbours' buffers: refused by the Python
    layer and, for weights that come as tensors, by the core."""
    bf.win_create(tf.constant(value(rank)), "w")
    x = tf.constant(value(rank))
    out = bf.out_neighbor_ranks()[0]
    with raises(ValueError, "win_put", "w", match="finite"):
        bf.win_put(x, "w", dst_weights={out: bad})
    with raises(ValueError, "win_accumulate", "w", match="finite"):
        bf.win_accumulate(x, "w", self_weight=bad)
    with raises(ValueError, "win_update", "w", match="finite"):
        bf.win_update("w", self_weight=bad, neighbor_weights={})
    from bluefog.tensorflow.op_library import ops
    for ranks, weights, self_weight in (([out], [bad], 1.0), ([out], [1.0], bad)):
        with raises(tf.errors.InvalidArgumentError, "win_put", "w", match="finite"):
            ops.bluefog_win_put(x, "w", tf.constant(ranks, tf.int32),
                                tf.constant(weights, tf.float64),
                                tf.constant(self_weight, tf.float64), accumulate=False,
                                require_mutex=False, with_p=False)
    # Nothing was sent: the buffers still hold what win_create put there (this rank's tensor).
    sync()
    for src in bf.in_neighbor_ranks():
        np.testing.assert_array_equal(buffer("w", src), value(rank))


@needs_ranks(2)
def test_error_free_with_pending_op(rank, size):
    """Rank 1's require_mutex put waits for rank 0's mutex, so win_free fails on every rank."""
    bf.set_topology(tu.RingGraph(size))
    bf.win_create(tf.constant(value(rank)), "w")
    h = None
    if rank == 0:
        with bf.win_mutex("w", for_self=True):
            sync()
            with pytest.raises(tf.errors.FailedPreconditionError,
                               match="rank 1 has 1 window") as info:
                bf.win_free("w")
    else:
        sync()
        if rank == 1:
            h = bf.win_put_nonblocking(tf.constant(value(1)), "w", dst_weights={0: 1.0},
                                       require_mutex=True)
        with pytest.raises(tf.errors.FailedPreconditionError,
                           match="rank 1 has 1 window") as info:
            bf.win_free("w")
    if h is not None:
        assert bf.win_wait(h) is True
    assert "bluefog win_free of window 'w'" in str(info.value)
    assert bf.window_names() == ["w"]
    bf.win_free("w")
    assert bf.window_names() == []


def test_unified_model_reported_where_windows_work(rank, size):
    """Windows need MPI_THREAD_MULTIPLE (their thread calls MPI); where they work, a finished
    put is visible to the next update without further synchronisation."""
    assert bf.unified_mpi_window_model_supported() is (
        bf.mpi_threads_supported() and bf.backend() == "mpi")


@needs_ranks(2)
def test_topology_change_refused_while_windows_exist(rank, size):
    """A window keeps the neighbours it was created with, so changing the topology while one
    exists is refused with what to do; the same topology again is fine, and after win_free the
    change goes through."""
    bf.win_create(tf.constant(value(rank)), "w_topo")
    lonely = nx.DiGraph()
    lonely.add_nodes_from(range(size))  # no edges: differs from the default
    with pytest.raises(ValueError, match=r"rank \d+: set_topology: windows 'w_topo' exist.*"
                                         r"bf.win_free"):
        bf.set_topology(lonely)
    assert bf.set_topology(bf.load_topology()) is False  # unchanged: allowed
    sync()
    assert bf.win_free("w_topo")
    assert bf.set_topology(lonely) is True
    assert bf.in_neighbor_ranks() == []
