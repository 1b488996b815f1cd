"""Virtual topologies and the neighbour collectives, checked against numpy on every rank.

Every rank's input is a closed-form function of its rank (``rank_values``), so each rank can
compute the whole network's expected result by itself: with ``W[u][v]`` the weight rank ``v``
gives to what it receives from ``u`` (``networkx.to_numpy_array`` orientation), rank ``v`` must
get ``sum_u W[u][v] * x_u``, i.e. row ``v`` of ``W^T X``.
"""

import networkx as nx
import numpy as np
import pytest
import tensorflow as tf

import bluefog.tensorflow as bf
from bluefog.common import topology_util as tu
from bluefog.tensorflow import op_library

from conftest import needs_ranks, rank_values

SHAPE = (3, 2)


@pytest.fixture(autouse=True)
def default_topology():
    """Every test starts and ends with the default topology (other test files rely on it)."""
    bf.set_topology()
    yield
    bf.set_topology()


def all_values(size, shape=SHAPE, dtype=np.float64):
    return np.stack([rank_values(shape, r, dtype) for r in range(size)])


def weight_matrix(graph: nx.DiGraph, weighted: bool) -> np.ndarray:
    """W[u][v]: the factor rank v applies to rank u's tensor (self loop on the diagonal)."""
    n = graph.number_of_nodes()
    if weighted:
        return nx.to_numpy_array(graph, nodelist=range(n))
    w = np.zeros((n, n))
    for v in range(n):
        sources = [u for u in graph.predecessors(v) if u != v] + [v]
        for u in sources:
            w[u, v] = 1.0 / len(sources)
    return w


def expected_mix(w: np.ndarray, values: np.ndarray, rank: int) -> np.ndarray:
    return np.tensordot(w[:, rank], values, axes=1)


def slem(w: np.ndarray) -> float:
    """Second-largest eigenvalue modulus."""
    mods = np.sort(np.abs(np.linalg.eigvals(w)))[::-1]
    return float(mods[1]) if len(mods) > 1 else 0.0


def gather_rows(vector, name):
    v = tf.reshape(tf.constant(np.asarray(vector, dtype=np.float64)), [1, -1])
    return bf.allgather(v, name=name).numpy()


# ------------------------------------------------------------------------------------------
# The default topology
# ------------------------------------------------------------------------------------------

def test_default_topology_is_exponential(rank, size):
    graph = bf.load_topology()
    assert tu.IsTopologyEquivalent(graph, tu.ExponentialGraph(size))
    assert not bf.is_topo_weighted()
    powers = [2 ** k for k in range(size.bit_length()) if 2 ** k < size]
    assert bf.in_neighbor_ranks() == sorted({(rank - p) % size for p in powers} - {rank})
    assert bf.out_neighbor_ranks() == sorted({(rank + p) % size for p in powers} - {rank})


@needs_ranks(4)
def test_default_topology_weights_four_ranks_closed_form(size):
    if size != 4:
        pytest.skip("closed form written for 4 ranks")
    third = 1.0 / 3
    expected = np.array([[third, third, third, 0], [0, third, third, third],
                         [third, 0, third, third], [third, third, 0, third]])
    np.testing.assert_allclose(nx.to_numpy_array(bf.load_topology(), nodelist=range(4)),
                               expected)
    np.testing.assert_allclose(weight_matrix(bf.load_topology(), weighted=False), expected)


def test_default_neighbor_allreduce_matches_closed_form(rank, size):
    x = rank_values(SHAPE, rank)
    got = bf.neighbor_allreduce(tf.constant(x), name="topo.default").numpy()
    w = weight_matrix(tu.ExponentialGraph(size), weighted=False)
    np.testing.assert_allclose(got, expected_mix(w, all_values(size), rank), rtol=1e-12)


def test_set_topology_reports_changes(size):
    assert bf.set_topology() is False  # already the default
    full = tu.FullyConnectedGraph(size)
    assert bf.set_topology(full) is not tu.IsTopologyEquivalent(full, tu.ExponentialGraph(size))
    assert bf.set_topology(tu.FullyConnectedGraph(size)) is False
    assert bf.set_topology(tu.FullyConnectedGraph(size), is_weighted=True) is True
    assert bf.is_topo_weighted()
    assert bf.set_topology() is True
    assert not bf.is_topo_weighted()


def test_set_topology_rejects_bad_graphs(size):
    with pytest.raises(TypeError):
        bf.set_topology("ring")
    with pytest.raises(ValueError):
        bf.set_topology(tu.RingGraph(size + 1))
    assert tu.IsTopologyEquivalent(bf.load_topology(), tu.ExponentialGraph(size))


# ------------------------------------------------------------------------------------------
# Static topologies: every generator, weighted or not, eager / tf.function / v1 graph
# ------------------------------------------------------------------------------------------

GENERATORS = {
    "ring": lambda n: tu.RingGraph(n),
    "ring_left": lambda n: tu.RingGraph(n, connect_style=1),
    "star": lambda n: tu.StarGraph(n),
    "star_last": lambda n: tu.StarGraph(n, center_rank=n - 1),
    "mesh": lambda n: tu.MeshGrid2DGraph(n),
    "fully_connected": lambda n: tu.FullyConnectedGraph(n),
    "symmetric_exponential": lambda n: tu.SymmetricExponentialGraph(n),
    "exponential_base3": lambda n: tu.ExponentialGraph(n, base=3),
}


def run_v1_graph(build):
    with tf.Graph().as_default():
        out = build()
        with tf.compat.v1.Session() as sess:
            return sess.run(out)


@pytest.mark.parametrize("weighted", [False, True], ids=["uniform", "weighted"])
@pytest.mark.parametrize("generator", sorted(GENERATORS))
def test_static_topology_neighbor_allreduce(generator, weighted, rank, size):
    graph = GENERATORS[generator](size)
    bf.set_topology(graph, is_weighted=weighted)
    assert bf.is_topo_weighted() is weighted
    assert bf.in_neighbor_ranks() == sorted(u for u in graph.predecessors(rank) if u != rank)
    assert bf.out_neighbor_ranks() == sorted(v for v in graph.successors(rank) if v != rank)

    w = weight_matrix(graph, weighted)
    expected = expected_mix(w, all_values(size), rank)
    x = rank_values(SHAPE, rank)
    name = f"topo.{generator}.{weighted}"

    eager = bf.neighbor_allreduce(tf.constant(x), name=name + ".eager").numpy()
    np.testing.assert_allclose(eager, expected, rtol=1e-12, err_msg="eager")

    fn = tf.function(lambda t: bf.neighbor_allreduce(t, name=name + ".fn"))
    np.testing.assert_allclose(fn(tf.constant(x)).numpy(), expected, rtol=1e-12,
                               err_msg="tf.function")

    graph_result = run_v1_graph(
        lambda: bf.neighbor_allreduce(tf.constant(x), name=name + ".v1"))
    np.testing.assert_allclose(graph_result, expected, rtol=1e-12, err_msg="v1 graph")

    # float32, and a variable as input.
    v = tf.Variable(x.astype(np.float32))
    got32 = bf.neighbor_allreduce(v, name=name + ".f32").numpy()
    assert got32.dtype == np.float32
    np.testing.assert_allclose(got32, expected, rtol=1e-5)


@pytest.mark.parametrize("generator", sorted(GENERATORS))
def test_average_consensus_reaches_the_exact_mean(generator, rank, size):
    """Repeated neighbor_allreduce with a generator's weights converges to the mean of the
    ranks' starting values, not to a weighted mean (the weights are doubly stochastic)."""
    bf.set_topology(GENERATORS[generator](size), is_weighted=True)
    x = tf.constant(rank_values(SHAPE, rank))
    for k in range(150):
        x = bf.neighbor_allreduce(x, name=f"topo.consensus.{generator}.{k % 2}")
    np.testing.assert_allclose(x.numpy(), all_values(size).mean(axis=0), rtol=0, atol=1e-9)


def test_explicit_self_weight_with_topology_neighbors(rank, size):
    """self_weight alone overrides only the self weight; the topology gives the rest."""
    x = rank_values(SHAPE, rank)
    got = bf.neighbor_allreduce(tf.constant(x), self_weight=0.5, name="topo.selfw").numpy()
    w = weight_matrix(tu.ExponentialGraph(size), weighted=False)
    np.fill_diagonal(w, 0.5)
    np.testing.assert_allclose(got, expected_mix(w, all_values(size), rank), rtol=1e-12)


# ------------------------------------------------------------------------------------------
# Dynamic topologies
# ------------------------------------------------------------------------------------------

def one_peer_schedules(graph, size, steps):
    """[step][rank] -> (send_ranks, recv_ranks), for every rank."""
    gens = [tu.GetDynamicOnePeerSendRecvRanks(graph, r) for r in range(size)]
    return [[next(g) for g in gens] for _ in range(steps)]


@pytest.mark.parametrize("topo_name", ["exponential", "ring"])
def test_dynamic_one_peer_schedule(topo_name, rank, size):
    graph = tu.ExponentialGraph(size) if topo_name == "exponential" else tu.RingGraph(size)
    steps = 5
    schedules = one_peer_schedules(graph, size, steps)
    x_all = all_values(size)
    x = tf.constant(x_all[rank])
    step_fn = tf.function(
        lambda t, self_w, src, dst, k: bf.neighbor_allreduce(
            t, self_weight=self_w, src_weights=dict(src), dst_weights=list(dst),
            name=f"topo.dyn.{topo_name}.fn.{k}"))
    for k in range(steps):
        # The network-wide mixing matrix of this step, from every rank's schedule.
        w = np.zeros((size, size))
        for r in range(size):
            send, recv = schedules[k][r]
            assert all(r in schedules[k][s][1] for s in send), "schedule not consistent"
            for u in recv + [r]:
                w[u, r] = 1.0 / (len(recv) + 1)
        send, recv = schedules[k][rank]
        self_w = 1.0 / (len(recv) + 1)
        src = {u: self_w for u in recv}
        got = bf.neighbor_allreduce(x, self_weight=self_w, src_weights=src, dst_weights=send,
                                    name=f"topo.dyn.{topo_name}.{k}")
        expected = expected_mix(w, x_all, rank)
        np.testing.assert_allclose(got.numpy(), expected, rtol=1e-12, err_msg=f"step {k}")
        # The same step inside a tf.function (weights are fixed at trace time: one trace/step).
        got_fn = step_fn(x, self_w, tuple(sorted(src.items())), tuple(send), k)
        np.testing.assert_allclose(got_fn.numpy(), expected, rtol=1e-12,
                                   err_msg=f"tf.function step {k}")
        x_all = np.stack([expected_mix(w, x_all, r) for r in range(size)])
        x = got


@needs_ranks(2)
def test_dynamic_dst_weights_scale_what_is_sent(rank, size):
    """A dst_weights dict scales the sent tensor; the receiver applies its src weights too."""
    right, left = (rank + 1) % size, (rank - 1) % size
    x_all = all_values(size)
    got = bf.neighbor_allreduce(tf.constant(x_all[rank]), self_weight=0.25,
                                src_weights={left: 0.5}, dst_weights={right: 0.1 * (rank + 1)},
                                name="topo.dyn.scaled").numpy()
    expected = 0.25 * x_all[rank] + 0.5 * 0.1 * (left + 1) * x_all[left]
    np.testing.assert_allclose(got, expected, rtol=1e-12)


@needs_ranks(2)
def test_topology_mismatch_fails_everywhere_then_recovers(rank, size):
    x = tf.constant(rank_values(SHAPE, rank))
    # Everyone sends to its right neighbour, but nobody expects to receive anything.
    with pytest.raises(tf.errors.FailedPreconditionError):
        bf.neighbor_allreduce(x, self_weight=1.0, src_weights={},
                              dst_weights=[(rank + 1) % size], name="topo.mismatch")
    # The same name works again once the lists mirror each other.
    left, right = (rank - 1) % size, (rank + 1) % size
    got = bf.neighbor_allreduce(x, self_weight=0.5, src_weights={left: 0.5},
                                dst_weights=[right], name="topo.mismatch").numpy()
    x_all = all_values(size)
    np.testing.assert_allclose(got, 0.5 * x_all[rank] + 0.5 * x_all[left], rtol=1e-12)
    # And so does the default topology.
    got = bf.neighbor_allreduce(x, name="topo.after_mismatch").numpy()
    w = weight_matrix(tu.ExponentialGraph(size), weighted=False)
    np.testing.assert_allclose(got, expected_mix(w, x_all, rank), rtol=1e-12)


def test_dynamic_argument_errors(rank, size):
    x = tf.constant([1.0])
    with pytest.raises(ValueError, match="dst_weights needs src_weights"):
        bf.neighbor_allreduce(x, dst_weights=[], name="topo.err1")
    with pytest.raises(ValueError, match="self_weight"):
        bf.neighbor_allreduce(x, src_weights={}, dst_weights=[], name="topo.err2")
    with pytest.raises(ValueError):
        bf.neighbor_allreduce(x, self_weight=1.0, src_weights={rank: 1.0}, dst_weights=[],
                              name="topo.err3")
    with pytest.raises(TypeError):
        bf.neighbor_allreduce(tf.constant([1, 2]), name="topo.err4")


# ------------------------------------------------------------------------------------------
# neighbor_allgather
# ------------------------------------------------------------------------------------------

def gather_input(r):
    """Rank r's tensor: r + 1 rows of width 2, rows holding 10 * r + row index."""
    return np.stack([np.full(2, 10.0 * r + i) for i in range(r + 1)]).astype(np.float32)


@pytest.mark.parametrize("generator", ["default", "ring", "star", "fully_connected"])
def test_neighbor_allgather_different_first_dims(generator, rank, size):
    if generator != "default":
        bf.set_topology(GENERATORS[generator](size))
    sources = bf.in_neighbor_ranks()
    expected = (np.concatenate([gather_input(u) for u in sources]) if sources
                else np.zeros((0, 2), np.float32))
    got = bf.neighbor_allgather(tf.constant(gather_input(rank)),
                                name=f"topo.gather.{generator}").numpy()
    np.testing.assert_array_equal(got, expected)
    fn = tf.function(lambda t: bf.neighbor_allgather(t, name=f"topo.gather.{generator}.fn"))
    np.testing.assert_array_equal(fn(tf.constant(gather_input(rank))).numpy(), expected)


@needs_ranks(2)
def test_neighbor_allgather_explicit_ranks(rank, size):
    """Rank r receives from r - 1 and r + 1 (a set), sends to the same two."""
    peers = sorted({(rank - 1) % size, (rank + 1) % size})
    got = bf.neighbor_allgather(tf.constant(gather_input(rank)), src_ranks=peers,
                                dst_ranks=peers, name="topo.gather.explicit").numpy()
    np.testing.assert_array_equal(got, np.concatenate([gather_input(u) for u in peers]))


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


# ------------------------------------------------------------------------------------------
# hierarchical_neighbor_allreduce
# ------------------------------------------------------------------------------------------

def test_hierarchical_single_machine_is_global_mean(rank, size):
    if bf.local_size() != size:
        pytest.skip("needs all ranks on one machine")
    x_all = all_values(size)
    got = bf.hierarchical_neighbor_allreduce(tf.constant(x_all[rank]),
                                             name="topo.hier").numpy()
    np.testing.assert_allclose(got, x_all.mean(axis=0), rtol=1e-12)
    fn = tf.function(lambda t: bf.hierarchical_neighbor_allreduce(t, name="topo.hier.fn"))
    np.testing.assert_allclose(fn(tf.constant(x_all[rank])).numpy(), x_all.mean(axis=0),
                               rtol=1e-12)


# ------------------------------------------------------------------------------------------
# Consensus: repeated neighbour averaging converges to the mean at rate slem(W)
# ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("topo_name", ["exponential", "ring", "symmetric_exponential"])
def test_consensus_rate(topo_name, rank, size):
    graph = {"exponential": tu.ExponentialGraph(size), "ring": tu.RingGraph(size),
             "symmetric_exponential": tu.SymmetricExponentialGraph(size)}[topo_name]
    bf.set_topology(graph, is_weighted=True)
    w = weight_matrix(graph, weighted=True)
    # These graphs are circulant: W is normal and doubly stochastic, so the distance to the
    # mean (Frobenius norm over all ranks) shrinks by at least slem(W) per step, with C = 1.
    np.testing.assert_allclose(w.sum(axis=0), 1.0)
    np.testing.assert_allclose(w.sum(axis=1), 1.0)
    rate = slem(w)
    rng = np.random.default_rng(1234)  # the same seed on every rank: every rank knows all x_r
    x_all = rng.standard_normal((size, 64))
    mean = x_all.mean(axis=0)
    err0 = np.linalg.norm(x_all - mean)
    x = tf.constant(x_all[rank])
    mix = tf.function(lambda t: bf.neighbor_allreduce(t, name=f"topo.consensus.{topo_name}"))
    steps = 12
    for _ in range(steps):
        x = mix(x)
    rows = gather_rows(x.numpy(), name=f"topo.consensus.{topo_name}.gather")
    err = np.linalg.norm(rows - mean)
    assert err <= 1.0001 * rate ** steps * err0 + 1e-9, (err, rate, err0)
    np.testing.assert_allclose(rows.mean(axis=0), mean, atol=1e-9)  # the mean is preserved
    if size >= 4:
        assert err < 0.5 * err0  # and it really did contract


def test_neighbor_allgather_accepts_enable_topo_check(rank):
    x = tf.constant(rank_values(SHAPE, rank))
    a = bf.neighbor_allgather(x, name="nag.topo.on", enable_topo_check=True)
    b = bf.neighbor_allgather(x, name="nag.topo.off", enable_topo_check=False)
    np.testing.assert_array_equal(a.numpy(), b.numpy())
    with pytest.raises(TypeError, match=rf"rank {rank}: bluefog neighbor_allgather.*"
                                        "enable_topo_check must be a bool"):
        bf.neighbor_allgather(x, name="nag.topo.bad", enable_topo_check="yes")


@needs_ranks(2)
@pytest.mark.timeout(120)
def test_set_topology_checks_every_rank_set_the_same(rank, size):
    bf.set_topology(tu.RingGraph(size))
    graph = tu.RingGraph(size) if rank else nx.empty_graph(size, create_using=nx.DiGraph)
    with pytest.raises(ValueError, match=rf"rank {rank}: set_topology: the ranks set different "
                                         r"topologies .*ranks \[0\]"):
        bf.set_topology(graph)
    assert tu.IsTopologyEquivalent(bf.load_topology(), tu.RingGraph(size))  # unchanged
    with pytest.raises(ValueError, match=rf"rank {rank}: set_topology: .*weightings"):
        bf.set_topology(tu.RingGraph(size), is_weighted=bool(rank))
    bad = nx.Graph() if rank == 0 else tu.RingGraph(size)
    error = TypeError if rank == 0 else ValueError
    with pytest.raises(error, match=rf"rank {rank}: set_topology"):
        bf.set_topology(bad)


def test_src_weights_without_dst_weights_use_the_topology(rank, size):
    """Bluefog's static weighting (its exact-diffusion example): self_weight and src_weights
    without dst_weights mix over the topology's neighbours with those weights."""
    x = tf.constant(rank_values(SHAPE, rank))
    x_all = all_values(size)
    in_ranks = bf.in_neighbor_ranks()
    src = {r: 0.5 / (i + 2) for i, r in enumerate(in_ranks[1:])}  # the first one left out: 0
    got = bf.neighbor_allreduce(x, self_weight=0.25, src_weights=src, name="topo.static.w")
    expected = 0.25 * x_all[rank] + sum(w * x_all[r] for r, w in src.items())
    np.testing.assert_allclose(got.numpy(), expected, rtol=1e-12)
    if size > 2 and len(in_ranks) < size - 1:
        outsider = sorted(set(range(size)) - set(in_ranks) - {rank})[0]
        with pytest.raises(ValueError, match=r"not in-neighbours in the topology.*"
                                             r"dst_weights=bf.out_neighbor_ranks\(\)"):
            bf.neighbor_allreduce(x, self_weight=0.5, src_weights={outsider: 0.5},
                                  name="topo.static.bad")
