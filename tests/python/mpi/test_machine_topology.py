"""Machine-level topology API, hierarchical_neighbor_allreduce and dynamic one-peer schedules.

The suite runs on one host, so the real job has one machine. The three exchanges of
hierarchical_neighbor_allreduce are also checked with the job cut into pretend machines of
`local` ranks (`hierarchical_exchange` takes the layout as an argument), against the closed
form: every rank of machine m gets sum_k W[k][m] * mean_k.
"""

import keras
import networkx as nx
import numpy as np
import pytest
import tensorflow as tf

import bluefog.tensorflow as bf
from bluefog.common import topology_util as tu
from bluefog.tensorflow import neighbor_ops

from conftest import rank_values


@pytest.fixture(autouse=True)
def default_topologies():
    bf.set_topology()
    bf.set_machine_topology()
    yield
    bf.set_topology()
    bf.set_machine_topology()


def test_machine_layout_on_one_host(rank, size):
    assert bf.is_homogeneous()
    assert bf.machine_size() == size // bf.local_size() == 1
    assert bf.machine_rank() == 0
    assert bf.in_neighbor_machine_ranks() == [] and bf.out_neighbor_machine_ranks() == []
    assert not bf.is_machine_topo_weighted()
    # One machine: the default rank topology is the plain exponential graph.
    assert tu.IsTopologyEquivalent(bf.load_topology(), tu.ExponentialGraph(size))
    assert not bf.is_topo_weighted()


def test_set_machine_topology_errors(rank):
    with pytest.raises(ValueError, match=rf"rank {rank}: set_machine_topology: .*machines 0\.\.0"):
        bf.set_machine_topology(tu.RingGraph(2))
    with pytest.raises(TypeError, match=rf"rank {rank}: set_machine_topology: .*DiGraph"):
        bf.set_machine_topology(nx.Graph())
    assert bf.set_machine_topology(tu.ExponentialGraph(1), is_weighted=True)
    assert bf.is_machine_topo_weighted()


def test_hierarchical_argument_errors(rank):
    x = tf.constant([1.0, 2.0])
    with pytest.raises(ValueError, match=rf"rank {rank}: .*'hx1'.*given together"):
        bf.hierarchical_neighbor_allreduce(x, src_machine_weights={}, name="hx1")
    with pytest.raises(ValueError, match=r"machine 1, which is not another machine in \[0, 1\)"):
        bf.hierarchical_neighbor_allreduce(x, self_weight=0.5, src_machine_weights={1: 0.5},
                                           dst_machine_weights=[1], name="hx2")
    with pytest.raises(ValueError, match=r"'hx3'.*dst_machine_weights other than 1\.0"):
        bf.hierarchical_neighbor_allreduce(x, self_weight=0.5, src_machine_weights={},
                                           dst_machine_weights={0: 0.5}, name="hx3")
    with pytest.raises(ValueError, match="one argument; give only src_machine_weights"):
        with pytest.warns(DeprecationWarning):
            bf.hierarchical_neighbor_allreduce(x, src_machine_weights={},
                                               neighbor_machine_weights={}, name="hx4")


def test_hierarchical_old_argument_names_still_work(rank, size):
    """The former names give the same result as Bluefog's, with a DeprecationWarning."""
    x = tf.constant([1.0, 2.0]) * (rank + 1)
    new = bf.hierarchical_neighbor_allreduce(x, self_weight=1.0, src_machine_weights={},
                                             dst_machine_weights={}, name="hnew")
    with pytest.warns(DeprecationWarning, match="send_neighbor_machines is deprecated; call it "
                                                "dst_machine_weights"):
        old = bf.hierarchical_neighbor_allreduce(x, self_weight=1.0, neighbor_machine_weights={},
                                                 send_neighbor_machines=[], name="hold")
    np.testing.assert_allclose(old.numpy(), new.numpy())
    want = np.array([1.0, 2.0]) * (size + 1) / 2.0  # one machine: the mean over every rank
    np.testing.assert_allclose(new.numpy(), want)


def machine_closed_form(values, local, w):
    """Row r: sum_k W[k][m(r)] * mean of machine k, for `values` [rank] -> array."""
    n = len(values) // local
    means = np.stack([np.mean(values[k * local:(k + 1) * local], axis=0) for k in range(n)])
    return [np.tensordot(w[:, r // local], means, axes=1) for r in range(len(values))]


def pretend_locals(size):
    return [d for d in range(1, size + 1) if size % d == 0]


@pytest.mark.parametrize("run", ["eager", "function"])
@pytest.mark.parametrize("shape", [(7,), (3, 5), (1,)])
def test_hierarchical_exchange_pretend_machines(run, shape, rank, size):
    for local in pretend_locals(size):
        n = size // local
        graph = tu.ExponentialGraph(n)
        w = nx.to_numpy_array(graph, nodelist=range(n))
        m = rank // local
        self_w, recv = tu.GetRecvWeights(graph, m)
        _, send = tu.GetSendWeights(graph, m)
        values = [rank_values(shape, r) for r in range(size)]
        name = f"hier.pretend.{run}.{len(shape)}.{shape[0]}.{local}"

        def op(t, local=local, recv=recv, send=send, self_w=self_w, name=name):
            return neighbor_ops.hierarchical_exchange(
                t, name, local, rank % local, sorted(send), sorted(recv), self_w,
                [recv[k] for k in sorted(recv)])

        if run == "function":
            op = tf.function(op)
        got = op(tf.constant(values[rank])).numpy()
        expected = machine_closed_form(values, local, w)[rank]
        np.testing.assert_allclose(got, expected, rtol=1e-12, err_msg=f"local {local}")


def test_hierarchical_exchange_float32_odd_count_and_local_only(rank, size):
    for local in pretend_locals(size):
        values = [rank_values((11,), r).astype(np.float32) for r in range(size)]
        got = neighbor_ops.hierarchical_exchange(
            tf.constant(values[rank]), f"hier.local_only.{local}", local, rank % local, [], [],
            1.0, []).numpy()
        expected = machine_closed_form(values, local, np.eye(size // local))[rank]
        assert got.dtype == np.float32
        np.testing.assert_allclose(got, expected, rtol=1e-6)


def test_hierarchical_gradient_pretend_machines(rank, size):
    """The op is linear, y = A x over ranks: d sum_r c_r . y_r / d x_r = sum_j A[r][j] c_j."""
    for local in pretend_locals(size):
        n = size // local
        graph = tu.RingGraph(n)
        w = nx.to_numpy_array(graph, nodelist=range(n))
        m = rank // local
        self_w, recv = tu.GetRecvWeights(graph, m)
        _, send = tu.GetSendWeights(graph, m)
        x = tf.Variable(rank_values((6,), rank))
        c = [rank_values((6,), r, offset=2) for r in range(size)]
        with tf.GradientTape() as tape:
            y = neighbor_ops.hierarchical_exchange(
                x, f"hier.grad.{local}", local, rank % local, sorted(send), sorted(recv), self_w,
                [recv[k] for k in sorted(recv)])
            loss = tf.reduce_sum(y * c[rank])
        got = tape.gradient(loss, x).numpy()
        # Rank r's weight in rank j's result: W[m(r)][m(j)] / local.
        expected = sum(w[rank // local, j // local] / local * c[j] for j in range(size))
        np.testing.assert_allclose(got, expected, rtol=1e-12, err_msg=f"local {local}")


def test_hierarchical_one_machine_gradient_is_mean(rank, size):
    x = tf.Variable(rank_values((4,), rank))
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(bf.hierarchical_neighbor_allreduce(x, name="hier.grad.real")
                             * (rank + 1.0))
    np.testing.assert_allclose(tape.gradient(loss, x).numpy(), np.full(4, (size + 1) / 2.0))


# ------------------------------------------------------------------------------------------
# Dynamic one-peer schedules in the decentralized optimizers
# ------------------------------------------------------------------------------------------

def one_peer_matrix(size, step):
    """Mixing matrix of step `step` of the one-peer exponential graph (W[u][v]: v's weight of u)."""
    w = np.zeros((size, size))
    gens = [tu.GetDynamicOnePeerSendRecvRanks(tu.ExponentialGraph(size), r) for r in range(size)]
    for r, gen in enumerate(gens):
        for _ in range(step):
            next(gen)
        _, recv = next(gen)
        for u in recv + [r]:
            w[u, r] = 1.0 / (len(recv) + 1)
    return w


@pytest.mark.parametrize("run", ["eager", "function"])
def test_one_peer_exponential_schedule_averages_exactly(run, rank, size):
    """Ying et al. (2021): with size a power of two, log2(size) steps of the one-peer exponential
    graph give every rank the exact mean; other sizes follow the schedule's mixing matrices."""
    x_all = [rank_values((5,), r) * (r + 1) for r in range(size)]
    var = tf.Variable(x_all[rank])
    schedule = tu.GetDynamicOnePeerSendRecvRanks(tu.ExponentialGraph(size), rank)
    opt = bf.DistributedAdaptThenCombineOptimizer(keras.optimizers.SGD(0.0), schedule=schedule,
                                                  name=f"onepeer.{run}")
    assert opt.schedule is schedule

    def step():
        opt.apply([tf.zeros_like(var)], [var])

    if run == "function":
        step = tf.function(step)
    power_of_two = size & (size - 1) == 0
    steps = max(1, (size - 1).bit_length()) if power_of_two else 4
    mean = np.mean(x_all, axis=0)
    simulated = np.stack(x_all)
    for k in range(steps):
        step()
        simulated = np.tensordot(one_peer_matrix(size, k).T, simulated, axes=1)
        np.testing.assert_allclose(var.numpy(), simulated[rank], rtol=1e-12, err_msg=f"step {k}")
        if power_of_two and size > 1 and k < steps - 1:
            assert not np.allclose(var.numpy(), mean), f"exact already after {k + 1} steps"
    if power_of_two:
        np.testing.assert_allclose(var.numpy(), mean, rtol=1e-12)


@pytest.mark.parametrize("run", ["eager", "function"])
def test_schedule_advances_only_when_communicating(run, rank, size):
    calls = []

    def schedule():
        gen = tu.GetDynamicOnePeerSendRecvRanks(tu.ExponentialGraph(size), rank)
        while True:
            calls.append(1)
            yield next(gen)

    var = tf.Variable(rank_values((3,), rank))
    opt = bf.DistributedAdaptWithCombineOptimizer(keras.optimizers.SGD(0.0), schedule=schedule(),
                                                  num_steps_per_communication=3,
                                                  name=f"onepeer.every3.{run}")

    def step():
        opt.apply([tf.zeros_like(var)], [var])

    if run == "function":
        step = tf.function(step)
    for _ in range(7):
        step()
    assert len(calls) == 2  # steps 3 and 6


def test_machine_schedule_with_hierarchical(rank, size):
    """One machine: the machine-level exp-2 schedule yields no machines, so each step is the
    mean within the machine, which is the global mean."""
    x_all = [rank_values((4,), r) for r in range(size)]
    var = tf.Variable(x_all[rank])
    schedule = tu.GetExp2DynamicSendRecvMachineRanks(size, bf.local_size(), rank, bf.local_rank())
    opt = bf.DistributedAdaptThenCombineOptimizer(
        keras.optimizers.SGD(0.0), communication_type="hierarchical_neighbor_allreduce",
        schedule=schedule, name="machine.schedule")
    tf.function(lambda: opt.apply([tf.zeros_like(var)], [var]))()
    np.testing.assert_allclose(var.numpy(), np.mean(x_all, axis=0), rtol=1e-12)


def test_schedule_errors(rank, size):
    sgd = keras.optimizers.SGD(0.1)
    with pytest.raises(ValueError, match="schedule must be an iterator"):
        bf.DistributedAdaptThenCombineOptimizer(sgd, schedule=[([], [])])
    with pytest.raises(ValueError, match="a schedule needs communication_type"):
        bf.DistributedAdaptThenCombineOptimizer(sgd, communication_type="allreduce",
                                                schedule=iter([]))
    var = tf.Variable([1.0])
    opt = bf.DistributedAdaptThenCombineOptimizer(sgd, schedule=iter([([rank], [])]),
                                                  name="bad.schedule")
    with pytest.raises(ValueError, match=rf"rank {rank}: .*send list holds {rank}, which is not "
                                         rf"another rank in \[0, {size}\)"):
        opt.apply([tf.constant([0.0])], [var])
    with pytest.raises(ValueError, match=rf"rank {rank}: .*schedule is exhausted"):
        opt.apply([tf.constant([0.0])], [var])
