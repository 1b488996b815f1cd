"""Closed forms shared by the topology tests (test_topology_ops.py,
test_neighbor_gradients.py): each rank's input is a function of its rank (``rank_values``), so
every rank computes the whole network's expected result itself. ``W[u][v]`` is the weight rank
``v`` gives to what it receives from ``u`` (``networkx.to_numpy_array`` orientation)."""

import networkx as nx
import numpy as np
import tensorflow as tf

import bluefog.tensorflow as bf
from bluefog.common import topology_util as tu

from conftest import rank_values

SHAPE = (3, 2)


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


def gather_input(r):
    """Rank r's tensor: r + 1 rows of width 2, rows holding 10 * r + row index."""
    return np.stack([np.full(2, 10.0 * r + i) for i in range(r + 1)]).astype(np.float32)
