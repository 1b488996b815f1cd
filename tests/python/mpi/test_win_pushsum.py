"""Windows under concurrency: mutual exclusion through bf.win_mutex, and asynchronous push-sum
averaging with associated weights (bf.turn_on_win_ops_with_associated_p)."""

import time

import networkx as nx
import numpy as np
import pytest
import tensorflow as tf

import bluefog.tensorflow as bf
from bluefog.common import topology_util as tu

from conftest import needs_ranks
from conftest import win_sync as sync

# Push-sum rounds per rank before the final collection. Measured worst error after K rounds
# (np 4, 2 shared cores, the sleeps below, 3 runs): exponential K=40 4.5e-6, K=60 1e-8;
# directed ring K=60 5.7e-4, K=100 1e-6, K=150 1.1e-6. The directed ring mixes slowly while
# the fast ranks, whose ratio stops changing once they are done, wait for the slow ones.
PUSH_SUM_ROUNDS = {"exponential": 60, "directed_ring": 250}


pytestmark = pytest.mark.usefixtures("clean_windows")


def into_zero_graph(size):
    """Ranks 1 and 2 send to rank 0; nothing else."""
    g = nx.DiGraph()
    g.add_nodes_from(range(size))
    for r in range(size):
        g.add_edge(r, r, weight=1.0)
    g.add_edge(1, 0, weight=0.25)
    g.add_edge(2, 0, weight=0.25)
    g[0][0]["weight"] = 0.5
    return g


@needs_ranks(3)
def test_mutex_excludes_writers_and_reader(rank, size):
    """Ranks 1 and 2 each write k then add k into their buffer at rank 0 under rank 0's mutex
    (2k when done, k odd in between); rank 0 reads under its own mutex and must never see k, nor
    a mix of elements from two writes."""
    bf.set_topology(into_zero_graph(size))
    n = 1 << 20
    bf.win_create(tf.zeros([n], tf.float32), "m", zero_init=True)
    rounds = 25
    final = 2.0 * (2 * rounds + 1)
    sync()
    try:
        mutex_roles(rank, n, rounds, final)
    finally:
        sync()


def mutex_roles(rank, n, rounds, final):
    if rank in (1, 2):
        for k in range(1, rounds + 1):
            v = tf.fill([n], float(2 * k + 1))  # odd
            with bf.win_mutex("m", ranks=[0]):
                bf.win_put(v, "m")
                bf.win_accumulate(v, "m")
            time.sleep(0.001 * rank)
    elif rank == 0:
        seen = {1: set(), 2: set()}
        deadline = time.time() + 120
        while time.time() < deadline:
            with bf.win_mutex("m", for_self=True):
                got = {s: bf.win_update("m", self_weight=0.0, neighbor_weights={s: 1.0},
                                        clone=True).numpy() for s in (1, 2)}
            for s, b in got.items():
                assert np.all(b == b[0]), f"buffer of rank {s}: a torn read, values {set(b[:4])}"
                assert b[0] % 4 == 2 or b[0] == 0, f"rank {s}'s write seen half done: {b[0]}"
                seen[s].add(float(b[0]))
            if all(final in s for s in seen.values()):
                break
        assert all(final in s for s in seen.values()), f"the last writes never arrived: {seen}"


@pytest.mark.parametrize("require_mutex", [False, True])
def test_big_tensor_reads_are_whole(require_mutex, rank, size):
    """Every in-neighbour puts a 1M-element constant tensor repeatedly while this rank reads:
    each read buffer holds one put, never a mix (a window's writes and updates exclude each
    other)."""
    n = 1 << 20
    bf.win_create(tf.zeros([n], tf.float32), "big", zero_init=True)
    sync()
    ins = bf.in_neighbor_ranks()
    for k in range(1, 11):
        h = bf.win_put_nonblocking(tf.fill([n], float(k + 100 * rank)), "big",
                                   require_mutex=require_mutex)
        for s in ins:
            b = bf.win_update("big", self_weight=0.0, neighbor_weights={s: 1.0}, clone=True,
                              require_mutex=require_mutex).numpy()
            assert np.all(b == b[0]), f"rank {s}'s buffer is torn: {np.unique(b)[:5]}"
            assert b[0] == 0 or (b[0] - 100 * s) in range(1, 11), b[0]
        bf.win_wait(h)
    sync()
    for s in ins:
        b = bf.win_update("big", self_weight=0.0, neighbor_weights={s: 1.0}, clone=True).numpy()
        np.testing.assert_array_equal(b, np.full([n], 10.0 + 100 * s, np.float32))


@pytest.mark.parametrize("run", ["eager", "function"])
@pytest.mark.parametrize("graph", ["exponential", "directed_ring"])
def test_push_sum_converges_to_mean(graph, run, rank, size):
    if graph == "directed_ring":
        bf.set_topology(tu.RingGraph(size, connect_style=2))
    x0 = np.arange(5, dtype=np.float64) * (rank + 1) + 3.0 * rank
    mean = np.mean([np.arange(5) * (r + 1) + 3.0 * r for r in range(size)], axis=0)
    bf.turn_on_win_ops_with_associated_p()
    bf.win_create(tf.Variable(x0), "ps", zero_init=True)
    var = bf.window_variable("ps")
    outs = bf.out_neighbor_ranks()
    w = 1.0 / (len(outs) + 1)

    def step():
        # Keeps x * w (the window's variable) and sends x * w to each out-neighbour.
        bf.win_accumulate(var.read_value(), "ps", self_weight=w,
                          dst_weights={r: w for r in outs})
        return bf.win_update_then_collect("ps")

    if run == "function":
        step = tf.function(step)
        step.get_concrete_function()  # traced on every rank before any rank starts
    sync()
    for _ in range(PUSH_SUM_ROUNDS[graph]):
        step()
        time.sleep(0.002 * rank)
    sync()  # every accumulate has landed
    x = bf.win_update_then_collect("ps").numpy()  # collect what is still in the buffers
    p = bf.win_associated_p("ps")
    # Mass is conserved exactly (up to rounding), and x / p is the mean.
    total = bf.allreduce(tf.constant(np.append(x, p)), op=bf.Sum, name=f"ps.total.{graph}.{run}")
    np.testing.assert_allclose(total.numpy(), np.append(mean * size, size), rtol=1e-12)
    np.testing.assert_allclose(x / p, mean, atol=1e-5, rtol=0)
    np.testing.assert_array_equal(var.numpy(), x)
    bf.turn_off_win_ops_with_associated_p()
    assert not bf.win_ops_with_associated_p()
