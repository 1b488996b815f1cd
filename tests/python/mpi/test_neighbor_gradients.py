"""Gradients of the neighbour collectives (neighbor_allreduce, neighbor_allgather), eager and
in tf.function, checked against closed forms on every rank (topology_cases.py)."""

import numpy as np
import pytest
import tensorflow as tf

import bluefog.tensorflow as bf
from bluefog.common import topology_util as tu
from bluefog.tensorflow import op_library

from conftest import needs_ranks, rank_values
from topology_cases import (
    GENERATORS,
    SHAPE,
    expected_mix,
    gather_input,
    weight_matrix,
)


@pytest.fixture(autouse=True)
def default_topology():
    """Every test starts and ends with the default topology (other test files rely on it)."""
    bf.set_topology()
    yield
    bf.set_topology()


# ------------------------------------------------------------------------------------------
# Gradient
# ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("mode", ["eager", "function"])
@pytest.mark.parametrize("topo_name", ["default", "star_weighted", "mesh_weighted"])
def test_neighbor_allreduce_gradient(topo_name, mode, rank, size):
    """loss_v = c_v . y_v on every rank v: d(sum_v loss_v)/dx_u = sum_v W[u][v] c_v.

    Each rank's tape holds only its own loss; the registered gradient sends each rank's
    upstream gradient back along the transposed edges, so the local gradient is the global one.
    """
    graph = {"default": tu.ExponentialGraph(size), "star_weighted": tu.StarGraph(size),
             "mesh_weighted": tu.MeshGrid2DGraph(size)}[topo_name]
    weighted = topo_name != "default"
    bf.set_topology(graph, is_weighted=weighted)
    w = weight_matrix(graph, weighted)
    coef = np.stack([rank_values(SHAPE, r, offset=1) for r in range(size)])  # c_v
    x = tf.Variable(rank_values(SHAPE, rank))

    def grad():
        with tf.GradientTape() as tape:
            y = bf.neighbor_allreduce(x, name=f"topo.grad.{topo_name}.{mode}")
            loss = tf.reduce_sum(tf.constant(coef[rank]) * y)
        return tape.gradient(loss, x)

    if mode == "function":
        grad = tf.function(grad)
    expected = expected_mix(w.T, coef, rank)  # sum_v W[rank][v] c_v
    np.testing.assert_allclose(grad().numpy(), expected, rtol=1e-12)


@needs_ranks(2)
def test_neighbor_allreduce_gradient_dynamic_weights(rank, size):
    """Dynamic call: x_u sent to u + 1 scaled by d_u, received with weight s; self weight a."""
    right, left = (rank + 1) % size, (rank - 1) % size
    a, s = 0.3, 0.7
    d = [0.5 + 0.1 * r for r in range(size)]
    x = tf.Variable(rank_values(SHAPE, rank))
    coef = [rank_values(SHAPE, r, offset=2) for r in range(size)]
    with tf.GradientTape() as tape:
        y = bf.neighbor_allreduce(x, self_weight=a, src_weights={left: s},
                                  dst_weights={right: d[rank]}, name="topo.grad.dynamic")
        loss = tf.reduce_sum(tf.constant(coef[rank]) * y)
    g = tape.gradient(loss, x).numpy()
    # y_v = a x_v + s d_{v-1} x_{v-1}  =>  dL/dx_u = a c_u + s d_u c_{u+1}
    np.testing.assert_allclose(g, a * coef[rank] + s * d[rank] * coef[right], rtol=1e-12)


def gather_coef(v, sources):
    """Rank v's loss coefficients for its gathered rows: distinct integers, exact in float64."""
    rows = sum(u + 1 for u in sources)
    return (1000.0 * (v + 1) + np.arange(rows * 2, dtype=np.float64).reshape(rows, 2))


def expected_gather_grad(u, in_lists):
    """d(sum_v loss_v)/dx_u: the rows of c_v that multiplied x_u, summed over u's receivers v."""
    g = np.zeros((u + 1, 2))
    for v, sources in enumerate(in_lists):
        if u in sources:
            start = sum(k + 1 for k in sources if k < u)
            g += gather_coef(v, sources)[start:start + u + 1]
    return g


@pytest.mark.parametrize("mode", ["eager", "function"])
@pytest.mark.parametrize("generator", ["default", "ring", "star", "mesh", "fully_connected"])
def test_neighbor_allgather_gradient(generator, mode, rank, size):
    """loss_v = sum(c_v * y_v) with y_v = concat of the in-neighbours' x_u (u + 1 rows each):
    each x_u gets back the rows of c_v it met, summed over the ranks v that gathered it."""
    graph = tu.ExponentialGraph(size) if generator == "default" else GENERATORS[generator](size)
    bf.set_topology(graph)
    in_lists = [sorted(u for u in graph.predecessors(v) if u != v) for v in range(size)]
    x = tf.Variable(gather_input(rank).astype(np.float64))
    coef = tf.constant(gather_coef(rank, in_lists[rank]))

    def grad():
        with tf.GradientTape() as tape:
            y = bf.neighbor_allgather(x, name=f"topo.gather.grad.{generator}.{mode}")
            loss = tf.reduce_sum(coef * y)
        return tape.gradient(loss, x)

    if mode == "function":
        grad = tf.function(grad)
    for _ in range(2):  # the second call is announced through the response cache
        np.testing.assert_array_equal(grad().numpy(), expected_gather_grad(rank, in_lists))


@needs_ranks(2)
@pytest.mark.parametrize("dtype", [tf.float16, tf.bfloat16, tf.float32])
def test_neighbor_allgather_gradient_explicit_ranks(dtype, rank, size):
    """A one-way ring (r gathers from r - 1 and r - 2) given per call; every float dtype."""
    sources = sorted({(rank - 1) % size, (rank - 2) % size} - {rank})
    dests = sorted({(rank + 1) % size, (rank + 2) % size} - {rank})
    in_lists = [sorted({(v - 1) % size, (v - 2) % size} - {v}) for v in range(size)]
    x = tf.Variable(tf.constant(gather_input(rank) / 8, dtype))
    coef = tf.constant(gather_coef(rank, sources) / 1024, dtype)
    with tf.GradientTape() as tape:
        y = bf.neighbor_allgather(x, src_ranks=sources, dst_ranks=dests,
                                  name=f"topo.gather.grad.explicit.{dtype.name}")
        loss = tf.reduce_sum(tf.cast(coef * y, tf.float32))
    g = tape.gradient(loss, x)
    assert g.dtype == dtype and g.shape == x.shape
    # float16 and bfloat16 round the coefficients (11 and 8 significant bits).
    np.testing.assert_allclose(tf.cast(g, tf.float64).numpy(),
                               expected_gather_grad(rank, in_lists) / 1024,
                               rtol=1e-6 if dtype == tf.float32 else 1e-2)


@needs_ranks(2)
def test_neighbor_allgather_gradient_wrong_rows_fails_on_every_rank(rank, size):
    """The gradient op checks, on every rank, that each upstream gradient holds one block per
    source sized like that source's tensor; a wrong one fails everywhere instead of hanging."""
    peers = sorted({(rank - 1) % size, (rank + 1) % size})
    rows = sum(u + 1 for u in peers) + (1 if rank == 0 else 0)
    grad = tf.zeros([rows, 2], tf.float64)
    with pytest.raises(tf.errors.FailedPreconditionError,
                       match=r"rank 0's upstream gradient has \d+ rows"):
        op_library.ops.bluefog_neighbor_allgather_grad(
            grad, tensor_name="topo.gather.grad.badrows", send_ranks=peers, recv_ranks=peers,
            first_dim=rank + 1)
    after = bf.allreduce(tf.constant(1.0), average=False, name="topo.gather.grad.after")
    assert after.numpy() == size
