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

from conftest import needs_ranks, rank_values
from topology_cases import (
    GENERATORS,
    SHAPE,
    all_values,
    expected_mix,
    gather_input,
    gather_rows,
    run_v1_graph,
    slem,
    weight_matrix,
)


@pytest.fixture(autouse=True)
def default_topology():
    """Every test starts and ends with the default topology (other test files rely on it)."""
    bf.set_topology()
    yield
    bf.set_topology()


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
