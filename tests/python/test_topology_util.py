"""Single-process tests for bluefog.common.topology_util (no MPI, no TensorFlow)."""

from __future__ import annotations

import importlib.util
import itertools
import math
import pathlib
import sys

import networkx as nx
import numpy as np
import pytest


def _load_module():
    # Load the file directly so that importing ``bluefog`` (which may pull in
    # TensorFlow or native extensions) is not required.
    path = pathlib.Path(__file__).resolve().parents[2] / "bluefog/common/topology_util.py"
    spec = importlib.util.spec_from_file_location("_bf_topology_util", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


tu = _load_module()

SIZES = range(1, 10)

GENERATORS = {
    "exp2": lambda n: tu.ExponentialGraph(n),
    "exp3": lambda n: tu.ExponentialGraph(n, 3),
    "exp_two": lambda n: tu.ExponentialTwoGraph(n),
    "sym_exp4": lambda n: tu.SymmetricExponentialGraph(n),
    "sym_exp2": lambda n: tu.SymmetricExponentialGraph(n, 2),
    "mesh": lambda n: tu.MeshGrid2DGraph(n),
    "mesh_row": lambda n: tu.MeshGrid2DGraph(n, (1, n)),
    "star": lambda n: tu.StarGraph(n),
    "star_last": lambda n: tu.StarGraph(n, n - 1),
    "ring0": lambda n: tu.RingGraph(n, 0),
    "ring1": lambda n: tu.RingGraph(n, 1),
    "ring2": lambda n: tu.RingGraph(n, 2),
    "full": lambda n: tu.FullyConnectedGraph(n),
}


def successors(graph: nx.DiGraph, r: int) -> set[int]:
    return set(graph.successors(r)) - {r}


def take(gen, n: int) -> list:
    return list(itertools.islice(gen, n))


# ---- Static generators ----
def test_exponential_graph_size4_matrix():
    t = 1.0 / 3.0
    expected = np.array([[t, t, t, 0], [0, t, t, t], [t, 0, t, t], [t, t, 0, t]])
    for graph in (tu.ExponentialGraph(4), tu.ExponentialTwoGraph(4)):
        np.testing.assert_allclose(nx.to_numpy_array(graph, nodelist=range(4)), expected)


@pytest.mark.parametrize("name", sorted(GENERATORS))
@pytest.mark.parametrize("size", SIZES)
def test_generators_are_column_stochastic_with_self_loops(name, size):
    graph = GENERATORS[name](size)
    assert isinstance(graph, nx.DiGraph)
    assert set(graph.nodes) == set(range(size))
    for r in range(size):
        assert graph.has_edge(r, r)
    for _, _, w in graph.edges(data="weight"):
        assert w is not None and 0.0 < w <= 1.0
    matrix = nx.to_numpy_array(graph, nodelist=range(size))
    np.testing.assert_allclose(matrix.sum(axis=0), np.ones(size), atol=1e-12)


@pytest.mark.parametrize("base", [2, 3])
@pytest.mark.parametrize("size", SIZES)
def test_exponential_graph_neighbors(size, base):
    graph = tu.ExponentialGraph(size, base)
    powers = [base**k for k in range(size) if base**k < size]
    for r in range(size):
        assert successors(graph, r) == {(r + p) % size for p in powers}
        assert set(graph.predecessors(r)) - {r} == {(r - p) % size for p in powers}
        weight = 1.0 / (1 + len(powers))
        for u in graph.predecessors(r):
            assert graph[u][r]["weight"] == pytest.approx(weight)


@pytest.mark.parametrize("size", SIZES)
def test_exponential_two_is_exponential_base2(size):
    expected = tu.ExponentialGraph(size, 2)
    assert tu.IsTopologyEquivalent(tu.ExponentialTwoGraph(size), expected)


@pytest.mark.parametrize("base", [2, 3, 4])
@pytest.mark.parametrize("size", SIZES)
def test_symmetric_exponential_neighbors(size, base):
    graph = tu.SymmetricExponentialGraph(size, base)
    powers = [base**k for k in range(size) if base**k < size]
    for r in range(size):
        expected = {(r + p) % size for p in powers} | {(r - p) % size for p in powers}
        assert successors(graph, r) == expected
        assert set(graph.predecessors(r)) - {r} == expected


def test_symmetric_exponential_size16_base4():
    graph = tu.SymmetricExponentialGraph(16)
    assert successors(graph, 0) == {1, 4, 15, 12}
    assert graph[1][0]["weight"] == pytest.approx(0.2)


MESH = [(1, (1, 1)), (4, (2, 2)), (6, (2, 3)), (7, (1, 7)), (9, (3, 3)), (12, (3, 4))]


@pytest.mark.parametrize(("size", "shape"), [*MESH, (6, (3, 2)), (8, (4, 2))])
def test_mesh_shape_and_neighbors(size, shape):
    graph = tu.MeshGrid2DGraph(size, shape)
    nrow, ncol = shape
    for r in range(size):
        i, j = divmod(r, ncol)
        expected = set()
        for di, dj in ((1, 0), (-1, 0), (0, 1), (0, -1)):
            if 0 <= i + di < nrow and 0 <= j + dj < ncol:
                expected.add((i + di) * ncol + j + dj)
        assert successors(graph, r) == expected


@pytest.mark.parametrize(("size", "shape"), MESH)
def test_mesh_default_shape(size, shape):
    assert tu.IsTopologyEquivalent(tu.MeshGrid2DGraph(size), tu.MeshGrid2DGraph(size, shape))


def test_mesh_metropolis_hastings_weights():
    graph = tu.MeshGrid2DGraph(9)  # 3x3: corners deg 2, edges deg 3, centre deg 4
    matrix = nx.to_numpy_array(graph, nodelist=range(9))
    np.testing.assert_allclose(matrix, matrix.T)
    np.testing.assert_allclose(matrix.sum(axis=1), np.ones(9))
    assert graph[0][1]["weight"] == pytest.approx(1 / 4)
    assert graph[1][4]["weight"] == pytest.approx(1 / 5)
    assert graph[0][0]["weight"] == pytest.approx(1 / 2)
    assert graph[4][4]["weight"] == pytest.approx(1 / 5)


@pytest.mark.parametrize("center", [0, 2, 4])
def test_star_graph(center):
    graph = tu.StarGraph(5, center)
    assert successors(graph, center) == set(range(5)) - {center}
    for r in set(range(5)) - {center}:
        assert successors(graph, r) == {center}
        assert graph[center][r]["weight"] == pytest.approx(0.2)
        assert graph[r][center]["weight"] == pytest.approx(0.2)
        assert graph[r][r]["weight"] == pytest.approx(0.8)
    assert graph[center][center]["weight"] == pytest.approx(0.2)


@pytest.mark.parametrize("size", SIZES)
def test_ring_graph(size):
    for style, offsets in ((0, (-1, 1)), (1, (-1,)), (2, (1,))):
        graph = tu.RingGraph(size, style)
        for r in range(size):
            assert successors(graph, r) == {(r + d) % size for d in offsets} - {r}
        expected_edges = size * (1 + len({d % size for d in offsets} - {0}))
        assert graph.number_of_edges() == expected_edges


def test_ring_degenerate_sizes():
    for style in (0, 1, 2):
        assert set(tu.RingGraph(1, style).edges) == {(0, 0)}
        g2 = tu.RingGraph(2, style)
        assert set(g2.edges) == {(0, 0), (0, 1), (1, 0), (1, 1)}
        assert g2[0][1]["weight"] == pytest.approx(0.5)
    assert tu.RingGraph(5, 0)[0][1]["weight"] == pytest.approx(1 / 3)
    assert tu.RingGraph(5, 1)[1][0]["weight"] == pytest.approx(1 / 2)


@pytest.mark.parametrize("size", SIZES)
def test_fully_connected(size):
    graph = tu.FullyConnectedGraph(size)
    assert graph.number_of_edges() == size * size
    full = np.full((size, size), 1.0 / size)
    np.testing.assert_allclose(nx.to_numpy_array(graph), full)


# ---- Inspection helpers ----
REGULAR = ["exp2", "exp3", "sym_exp4", "sym_exp2", "ring0", "ring1", "ring2", "full"]


@pytest.mark.parametrize("name", REGULAR)
@pytest.mark.parametrize("size", SIZES)
def test_regular_graphs(name, size):
    assert tu.IsRegularGraph(GENERATORS[name](size))


def test_irregular_graphs():
    assert not tu.IsRegularGraph(tu.StarGraph(3))
    assert not tu.IsRegularGraph(tu.MeshGrid2DGraph(9))
    assert not tu.IsRegularGraph(tu.MeshGrid2DGraph(3, (1, 3)))
    assert tu.IsRegularGraph(tu.MeshGrid2DGraph(4))  # 2x2 grid is a 4-cycle
    assert tu.IsRegularGraph(tu.StarGraph(2))
    graph = nx.DiGraph([(0, 1), (1, 2), (2, 0), (0, 2)])
    assert not tu.IsRegularGraph(graph)


def test_topology_equivalence():
    assert tu.IsTopologyEquivalent(tu.ExponentialGraph(8), tu.ExponentialGraph(8))
    assert not tu.IsTopologyEquivalent(tu.ExponentialGraph(8), tu.RingGraph(8))
    assert not tu.IsTopologyEquivalent(tu.ExponentialGraph(8), tu.ExponentialGraph(9))
    assert not tu.IsTopologyEquivalent(tu.ExponentialGraph(4), None)
    assert not tu.IsTopologyEquivalent(None, tu.ExponentialGraph(4))
    assert not tu.IsTopologyEquivalent(None, None)
    # Different constructions of the same weighted graph.
    assert tu.IsTopologyEquivalent(tu.RingGraph(2, 0), tu.FullyConnectedGraph(2))
    assert tu.IsTopologyEquivalent(tu.MeshGrid2DGraph(2), tu.RingGraph(2, 0))
    assert tu.IsTopologyEquivalent(tu.RingGraph(2, 1), tu.StarGraph(2, 1))
    # Same edges, different weights.
    g1 = tu.RingGraph(5)
    g2 = tu.RingGraph(5)
    g2[0][1]["weight"] += 1e-12
    assert tu.IsTopologyEquivalent(g1, g2)
    g2[0][1]["weight"] += 1e-3
    assert not tu.IsTopologyEquivalent(g1, g2)
    # Star graphs with different centres have the same shape but other edges.
    assert not tu.IsTopologyEquivalent(tu.StarGraph(4, 0), tu.StarGraph(4, 1))


def test_recv_send_weights():
    third, quarter, half = pytest.approx(1 / 3), pytest.approx(0.25), pytest.approx(0.5)
    graph = tu.ExponentialGraph(4)
    assert tu.GetRecvWeights(graph, 0) == (third, {2: third, 3: third})
    assert tu.GetSendWeights(graph, 0) == (third, {1: third, 2: third})
    graph = tu.StarGraph(4)
    three_quarters = pytest.approx(0.75)
    assert tu.GetRecvWeights(graph, 0) == (quarter, {1: quarter, 2: quarter, 3: quarter})
    assert tu.GetSendWeights(graph, 0) == (quarter, {1: quarter, 2: quarter, 3: quarter})
    assert tu.GetRecvWeights(graph, 3) == (three_quarters, {0: quarter})
    assert tu.GetSendWeights(graph, 3) == (three_quarters, {0: quarter})
    graph = tu.RingGraph(2)
    assert tu.GetRecvWeights(graph, 0) == (half, {1: half})
    # A graph without self loops reports a zero self weight.
    assert tu.GetRecvWeights(nx.DiGraph([(0, 1), (1, 0)]), 1) == (0.0, {0: 1.0})


@pytest.mark.parametrize("name", sorted(GENERATORS))
def test_recv_weights_sum_to_one(name):
    graph = GENERATORS[name](7)
    for r in range(7):
        self_w, recv = tu.GetRecvWeights(graph, r)
        assert self_w + sum(recv.values()) == pytest.approx(1.0)


@pytest.mark.parametrize("name", sorted(GENERATORS))
@pytest.mark.parametrize("size", SIZES)
def test_generators_are_doubly_stochastic(name, size):
    """Every rank's out-weights sum to one as well as its in-weights (Bluefog's weights), so
    averaging with them keeps the sum of the values."""
    matrix = nx.to_numpy_array(GENERATORS[name](size), nodelist=range(size))
    np.testing.assert_allclose(matrix.sum(axis=1), np.ones(size), atol=1e-12)


@pytest.mark.parametrize("name", sorted(GENERATORS))
@pytest.mark.parametrize("size", [2, 3, 4, 5, 8])
def test_average_consensus_reaches_the_exact_mean(name, size):
    """What repeated neighbor_allreduce with the graph's receive weights computes: every
    rank's value converges to the mean of the starting values (not a weighted mean)."""
    graph = GENERATORS[name](size)
    weights = [tu.GetRecvWeights(graph, r) for r in range(size)]
    x = np.random.default_rng(size).normal(size=size)
    mean = x.mean()
    for _ in range(2000):
        x = np.array([self_w * x[r] + sum(w * x[u] for u, w in recv.items())
                      for r, (self_w, recv) in enumerate(weights)])
    np.testing.assert_allclose(x, np.full(size, mean), rtol=0, atol=1e-12)


# ---- Dynamic schedules ----
STEPS = 24


def check_global_matching(schedules, steps=STEPS, exactly_one=True):
    """Every send u -> v at step t is matched by v listing u as receive."""
    world = len(schedules)
    for t in range(steps):
        items = [next(s) for s in schedules]
        sends = {(u, v) for u, (send, _) in enumerate(items) for v in send}
        recvs = {(u, v) for v, (_, recv) in enumerate(items) for u in recv}
        assert sends == recvs, f"step {t}"
        assert sum(len(s) for s, _ in items) == len(sends)
        assert sum(len(r) for _, r in items) == len(recvs)
        for r, (send, recv) in enumerate(items):
            assert all(0 <= x < world and x != r for x in send + recv)
            if exactly_one:
                assert len(send) == len(recv) == (1 if world > 1 else 0)


@pytest.mark.parametrize("name", [*REGULAR, "mesh", "star", "star_last"])
@pytest.mark.parametrize("size", [1, 2, 5, 8, 9])
def test_dynamic_one_peer_matching(name, size):
    graph = GENERATORS[name](size)
    schedules = [tu.GetDynamicOnePeerSendRecvRanks(graph, r) for r in range(size)]
    check_global_matching(schedules, exactly_one=False)


@pytest.mark.parametrize("size", [2, 5, 8, 9])
def test_dynamic_one_peer_exponential_closed_form(size):
    graph = tu.ExponentialGraph(size)
    powers = [2**k for k in range(size) if 2**k < size]
    for r in range(size):
        gen = tu.GetDynamicOnePeerSendRecvRanks(graph, r)
        for t in range(STEPS):
            d = powers[t % len(powers)]
            assert next(gen) == ([(r + d) % size], [(r - d) % size])


def test_dynamic_one_peer_star():
    graph = tu.StarGraph(4)
    center = tu.GetDynamicOnePeerSendRecvRanks(graph, 0)
    assert [send for send, _ in take(center, 4)] == [[1], [2], [3], [1]]
    assert all(recv == [1, 2, 3] for _, recv in take(center, 9))
    leaf = tu.GetDynamicOnePeerSendRecvRanks(graph, 2)
    assert take(leaf, 4) == [([0], []), ([0], [0]), ([0], []), ([0], [])]


EXP2_SIZES = [(1, 1), (4, 1), (8, 2), (12, 4), (16, 4), (6, 6), (10, 2)]


@pytest.mark.parametrize(("world", "local"), EXP2_SIZES)
def test_exp2_machine_schedule(world, local):
    n = world // local
    gens = [tu.GetExp2DynamicSendRecvMachineRanks(world, local, r, r % local) for r in range(world)]
    check_global_matching(gens[::local])  # one rank per machine, indexed by machine
    k_count = max(1, (n - 1).bit_length())
    for r, gen in enumerate(gens):
        start = STEPS if r % local == 0 else 0  # machine representatives already advanced
        for t, step in enumerate(take(gen, STEPS), start=start):
            m, d = r // local, 2 ** (t % k_count)
            assert step == (([(m + d) % n], [(m - d) % n]) if n > 1 else ([], []))


IO_SIZES = [(1, 1), (2, 1), (2, 2), (5, 1), (8, 4), (12, 4), (12, 3), (6, 6), (18, 3)]
INNER_OUTER = [
    tu.GetInnerOuterRingDynamicSendRecvRanks,
    tu.GetInnerOuterExpo2DynamicSendRecvRanks,
]


@pytest.mark.parametrize("func", INNER_OUTER)
@pytest.mark.parametrize(("world", "local"), IO_SIZES)
def test_inner_outer_matching(func, world, local):
    check_global_matching([func(world, local, r) for r in range(world)])


def test_inner_outer_ring_closed_form():
    gen = tu.GetInnerOuterRingDynamicSendRecvRanks(8, 4, 5)  # machine 1, local 1
    assert take(gen, 4) == [([6], [4]), ([1], [1]), ([6], [4]), ([1], [1])]
    gen = tu.GetInnerOuterRingDynamicSendRecvRanks(12, 4, 5)  # 3 machines
    assert take(gen, 2) == [([6], [4]), ([9], [1])]


def test_inner_outer_expo2_closed_form():
    # 4 machines x 8 local ranks; rank 10 = machine 1, local 2.
    gen = tu.GetInnerOuterExpo2DynamicSendRecvRanks(32, 8, 10)
    assert take(gen, 8) == [
        ([11], [9]),  # inner, d=1
        ([18], [2]),  # outer, d=1
        ([12], [8]),  # inner, d=2
        ([26], [26]),  # outer, d=2
        ([14], [14]),  # inner, d=4
        ([18], [2]),  # outer, d=1
        ([11], [9]),  # inner, d=1
        ([26], [26]),  # outer, d=2
    ]


def test_inner_outer_single_phase():
    # One rank per machine: only outer steps; one machine: only inner steps.
    gen = tu.GetInnerOuterExpo2DynamicSendRecvRanks(8, 1, 0)
    assert take(gen, 4) == [([1], [7]), ([2], [6]), ([4], [4]), ([1], [7])]
    gen = tu.GetInnerOuterRingDynamicSendRecvRanks(4, 4, 3)
    assert take(gen, 2) == [([0], [2]), ([0], [2])]


# ---- Argument validation ----
BAD_CALLS = [
    (lambda: tu.ExponentialGraph(0), "size"),
    (lambda: tu.ExponentialGraph(2.5), "size"),
    (lambda: tu.ExponentialGraph(True), "size"),
    (lambda: tu.ExponentialGraph(4, 1), "base"),
    (lambda: tu.ExponentialTwoGraph(0), "size"),
    (lambda: tu.SymmetricExponentialGraph(0), "size"),
    (lambda: tu.SymmetricExponentialGraph(4, 0), "base"),
    (lambda: tu.MeshGrid2DGraph(0), "size"),
    (lambda: tu.MeshGrid2DGraph(6, (2, 2)), "shape"),
    (lambda: tu.MeshGrid2DGraph(6, (6,)), "shape"),
    (lambda: tu.MeshGrid2DGraph(6, (0, 6)), "shape"),
    (lambda: tu.StarGraph(0), "size"),
    (lambda: tu.StarGraph(4, 4), "center_rank"),
    (lambda: tu.StarGraph(4, -1), "center_rank"),
    (lambda: tu.RingGraph(0), "size"),
    (lambda: tu.RingGraph(4, 3), "connect_style"),
    (lambda: tu.FullyConnectedGraph(0), "size"),
    (lambda: tu.IsRegularGraph(None), "topo"),
    (lambda: tu.IsTopologyEquivalent(tu.RingGraph(3), "ring"), "topo2"),
    (lambda: tu.GetRecvWeights(tu.RingGraph(3), 3), "rank"),
    (lambda: tu.GetRecvWeights(nx.Graph(), 0), "topo"),
    (lambda: tu.GetSendWeights(tu.RingGraph(3), -1), "rank"),
    (lambda: tu.GetSendWeights(nx.DiGraph([(1, 2)]), 1), "topo"),
    (lambda: tu.GetDynamicOnePeerSendRecvRanks(tu.RingGraph(3), 5), "self_rank"),
    (lambda: tu.GetDynamicOnePeerSendRecvRanks([[1]], 0), "topo"),
    (lambda: tu.GetExp2DynamicSendRecvMachineRanks(6, 4, 0, 0), "local_size"),
    (lambda: tu.GetExp2DynamicSendRecvMachineRanks(0, 1, 0, 0), "world_size"),
    (lambda: tu.GetExp2DynamicSendRecvMachineRanks(8, 0, 0, 0), "local_size"),
    (lambda: tu.GetExp2DynamicSendRecvMachineRanks(8, 4, 8, 0), "self_rank"),
    (lambda: tu.GetExp2DynamicSendRecvMachineRanks(8, 4, 5, 2), "local_rank"),
    (lambda: tu.GetInnerOuterRingDynamicSendRecvRanks(6, 4, 0), "local_size"),
    (lambda: tu.GetInnerOuterRingDynamicSendRecvRanks(8, 4, -1), "self_rank"),
    (lambda: tu.GetInnerOuterExpo2DynamicSendRecvRanks(8, 3, 0), "local_size"),
    (lambda: tu.GetInnerOuterExpo2DynamicSendRecvRanks(8, 4, 8), "self_rank"),
]


@pytest.mark.parametrize(("call", "arg"), BAD_CALLS, ids=lambda x: x if isinstance(x, str) else "")
def test_argument_errors(call, arg):
    with pytest.raises(ValueError, match=arg):
        call()


def test_numpy_integers_accepted():
    expected = tu.ExponentialGraph(6)
    assert tu.IsTopologyEquivalent(tu.ExponentialGraph(np.int64(6)), expected)
    i4, i2, i1 = (np.int32(x) for x in (4, 2, 1))
    assert next(tu.GetInnerOuterRingDynamicSendRecvRanks(i4, i2, i1)) == ([0], [0])


@pytest.mark.parametrize("size,local", [(8, 4), (8, 2), (16, 4), (12, 3), (24, 2), (6, 6), (5, 1)])
def test_hierarchical_exponential_graph(size, local):
    graph = tu.HierarchicalExponentialGraph(size, local)
    w = nx.to_numpy_array(graph, nodelist=range(size))
    np.testing.assert_allclose(w.sum(axis=0), 1.0)  # receive weights
    np.testing.assert_allclose(w.sum(axis=1), 1.0)  # doubly stochastic
    assert w.min() >= 0
    n = size // local
    machine_edges = math.ceil(math.log2(n)) if n > 1 else 0
    for m in range(n):
        cut = [(u, v) for u, v in graph.edges if u // local == m and v // local != m]
        assert len(cut) == machine_edges  # one edge per exponential offset
    for r in range(size):  # complete within the machine
        mates = {r // local * local + i for i in range(local)}
        assert mates <= set(graph.successors(r))
    # Connected and aperiodic: repeated averaging reaches the mean.
    assert np.allclose(np.linalg.matrix_power(w, 400), 1.0 / size)


def test_hierarchical_exponential_graph_edge_cases():
    assert tu.IsTopologyEquivalent(tu.HierarchicalExponentialGraph(8, 1), tu.ExponentialGraph(8))
    assert tu.IsTopologyEquivalent(tu.HierarchicalExponentialGraph(4, 4),
                                   tu.FullyConnectedGraph(4))
    with pytest.raises(ValueError, match="local_size must divide size"):
        tu.HierarchicalExponentialGraph(6, 4)
