"""Bluefog's optimizer API on the Keras wrappers: CommunicationType, the model argument, and the
per-step knobs (honoured by the next step, eager and traced; refused when malformed or when the
optimizer would not read them, never ignored)."""

import numpy as np
import pytest
import tensorflow as tf

import bluefog.tensorflow as bf
from bluefog.common import topology_util
from bluefog.tensorflow import wrapping

from conftest import gather_rows, needs_ranks

keras = wrapping.import_keras()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("kind", [bf.CommunicationType.allreduce, "allreduce"])
def test_communication_type_enum_and_model_argument(kind, rank, size):
    model = keras.Sequential([keras.layers.Input((1,)), keras.layers.Dense(1)])
    opt = bf.DistributedAdaptWithCombineOptimizer(keras.optimizers.SGD(0.0), model, kind)
    assert opt.communication_type == "allreduce"
    v = tf.Variable([float(rank)])
    opt.apply([tf.zeros([1])], [v])
    np.testing.assert_allclose(v.numpy(), [(size - 1) / 2.0])


def test_communication_type_value_strings():
    opt = bf.DistributedAdaptThenCombineOptimizer(keras.optimizers.SGD(0.1),
                                                  communication_type="neighbor.allreduce")
    assert opt.communication_type == "neighbor_allreduce"
    assert bf.CommunicationType.hierarchical_neighbor_allreduce.value == \
        "hierarchical.neighbor.allreduce"


def _one_peer_steps(size, steps):
    """Every rank's (send, recv) of each step of the one-peer exponential schedule."""
    topo = bf.load_topology()
    gens = [topology_util.GetDynamicOnePeerSendRecvRanks(topo, r) for r in range(size)]
    return [[next(g) for g in gens] for _ in range(steps)]


def _by_hand(mode, size, schedule, lr):
    """The ranks' parameters after the schedule, computed with numpy: x_r starts at r, the
    gradient of rank r is x_r - 2 r, and each step mixes uniformly over self and recv."""
    x = np.arange(size, dtype=np.float64)
    for step in schedule:
        local = x - lr * (x - 2.0 * np.arange(size))
        base = local if mode == "atc" else x
        mixed = np.array([(base[r] + sum(base[j] for j in step[r][1])) / (len(step[r][1]) + 1)
                          for r in range(size)])
        x = mixed if mode == "atc" else mixed + (local - x)
    return x


def _set_one_peer(opt, send, recv):
    opt.dst_weights = send
    opt.src_weights = {r: 1.0 / (len(recv) + 1) for r in recv}
    opt.self_weight = 1.0 / (len(recv) + 1)
    opt.enable_topo_check = False


@pytest.mark.timeout(180)
@pytest.mark.parametrize("traced", [False, True], ids=["eager", "tf_function"])
@pytest.mark.parametrize("mode", ["atc", "awc"])
def test_knobs_dynamic_topology_match_by_hand(mode, traced, rank, size):
    wrapper = (bf.DistributedAdaptThenCombineOptimizer if mode == "atc"
               else bf.DistributedAdaptWithCombineOptimizer)
    lr, steps = 0.25, 6
    opt = wrapper(keras.optimizers.SGD(lr), name=f"knobs.{mode}.{traced}")
    v = tf.Variable([float(rank)], dtype=tf.float64)

    def step():
        opt.apply([v - 2.0 * rank], [v])

    run = tf.function(step) if traced else step
    schedule = _one_peer_steps(size, steps)
    for per_rank in schedule:
        _set_one_peer(opt, *per_rank[rank])
        run()
    np.testing.assert_allclose(v.numpy(), [_by_hand(mode, size, schedule, lr)[rank]],
                               rtol=1e-12)
    # Back to None: the next step uses the topology again (the traced step too).
    for knob in ("dst_weights", "src_weights", "self_weight"):
        setattr(opt, knob, None)
    before = bf.allgather(tf.reshape(tf.identity(v), [1, 1])).numpy().ravel()
    run()
    w = 1.0 / (len(bf.in_neighbor_ranks()) + 1)
    local = before - lr * (before - 2.0 * np.arange(size))
    base = local if mode == "atc" else before
    mixed = w * (base[rank] + sum(base[j] for j in bf.in_neighbor_ranks()))
    expect = mixed if mode == "atc" else mixed + local[rank] - before[rank]
    np.testing.assert_allclose(v.numpy(), [expect], rtol=1e-12)


@pytest.mark.timeout(180)
def test_knobs_in_model_fit_match_by_hand(rank, size):
    lr, steps = 0.25, 4
    model = keras.Sequential([keras.layers.Input((1,)),
                              keras.layers.Dense(1, use_bias=False, kernel_initializer="zeros")])
    opt = bf.DistributedAdaptThenCombineOptimizer(keras.optimizers.SGD(lr), name="knobs.fit")
    model.compile(optimizer=opt, loss="mse")
    model.layers[0].kernel.assign([[float(rank)]])
    schedule = _one_peer_steps(size, steps)

    class Knobs(keras.callbacks.Callback):
        def on_train_batch_begin(self, batch, logs=None):
            _set_one_peer(opt, *schedule[batch][rank])

    # Loss (x - 2 rank)^2 / 2 per sample with input 1 and target 2 rank: gradient x - 2 rank
    # after the 1/2 scaling (mse: mean of (x - y)^2, gradient 2 (x - y); half the lr below).
    data = np.ones((steps, 1), np.float32)
    model.optimizer.learning_rate.assign(lr / 2.0)
    model.fit(data, 2.0 * rank * data, batch_size=1, epochs=1, shuffle=False, verbose=0,
              callbacks=[Knobs()])
    np.testing.assert_allclose(model.layers[0].kernel.numpy().ravel(),
                               [_by_hand("atc", size, schedule, lr)[rank]], rtol=1e-5)


@pytest.mark.parametrize("knob,value,message", [
    ("src_machine_weights", {0: 1.0}, "would be ignored"),
    ("dst_machine_weights", [0], "would be ignored"),
    ("self_weight", True, "must be a number"),
    ("src_weights", [1], "must be a dict"),
    ("dst_weights", {99: 1.0}, "not another rank"),
    ("enable_topo_check", 0, "must be a bool"),
    ("force_barrier", None, "must be a bool")])
def test_knobs_refused_when_malformed_or_unused(knob, value, message, rank):
    opt = bf.DistributedAdaptThenCombineOptimizer(keras.optimizers.SGD(0.1))
    assert getattr(opt, knob) == {"enable_topo_check": True, "force_barrier": False}.get(knob)
    with pytest.raises(ValueError, match=rf"rank {rank}: bluefog "
                                         rf"DistributedAdaptThenCombineOptimizer: .*{message}"):
        setattr(opt, knob, value)


def test_weight_knobs_refused_without_neighbour_weights(rank):
    opt = bf.DistributedAllreduceOptimizer(keras.optimizers.SGD(0.1))
    with pytest.raises(ValueError, match="takes no neighbour weights"):
        opt.self_weight = 0.5
    opt.force_barrier = True  # a barrier before each communication: honoured everywhere
    sched = bf.DistributedAdaptThenCombineOptimizer(
        keras.optimizers.SGD(0.1), schedule=topology_util.GetDynamicOnePeerSendRecvRanks(
            bf.load_topology(), bf.rank()))
    with pytest.raises(ValueError, match="schedule= iterator"):
        sched.src_weights = {}


@needs_ranks(2)
@pytest.mark.timeout(120)
@pytest.mark.parametrize("traced", [False, True], ids=["eager", "tf_function"])
def test_knobs_incomplete_combination_fails_the_step(traced, rank):
    opt = bf.DistributedAdaptThenCombineOptimizer(keras.optimizers.SGD(0.1),
                                                  name=f"knobs.partial.{traced}")
    v = tf.Variable([1.0])

    def step():
        opt.apply([tf.zeros([1])], [v])

    run = tf.function(step) if traced else step
    opt.src_weights = {(rank + 1) % bf.size(): 0.5}
    with pytest.raises((ValueError, tf.errors.OpError),
                       match=rf"rank {rank}: bluefog DistributedAdaptThenCombineOptimizer: "
                             "opt.src_weights is set without opt.self_weight"):
        run()
    opt.src_weights = None
    run()  # usable again


def test_knobs_assigned_while_tracing_refused(rank):
    opt = bf.DistributedAdaptThenCombineOptimizer(keras.optimizers.SGD(0.1))

    @tf.function
    def f():
        opt.self_weight = 0.5
        return tf.constant(0)

    with pytest.raises(ValueError, match="while a tf.function is being traced"):
        f()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("traced", [False, True], ids=["eager", "tf_function"])
def test_force_barrier_and_self_weight_alone(traced, rank, size):
    opt = bf.DistributedAdaptThenCombineOptimizer(keras.optimizers.SGD(0.0),
                                                  name=f"knobs.barrier.{traced}")
    v = tf.Variable([float(rank)], dtype=tf.float64)

    def step():
        opt.apply([tf.zeros([1], tf.float64)], [v])

    run = tf.function(step) if traced else step
    opt.force_barrier = True
    opt.self_weight = 0.5  # alone: the topology's neighbours and weights, this self weight
    before = gather_rows(v.numpy()).ravel()
    run()
    _, recv = topology_util.GetRecvWeights(bf.load_topology(), rank)
    expect = 0.5 * before[rank] + sum(w * before[j] for j, w in recv.items())
    np.testing.assert_allclose(v.numpy(), [expect], rtol=1e-12)


def test_neighbor_allreduce_optimizer_warns_about_its_meaning():
    with pytest.warns(UserWarning, match="adapt-then-combine here"):
        bf.DistributedNeighborAllreduceOptimizer(keras.optimizers.SGD(0.1))


@pytest.mark.timeout(120)
def test_allreduce_optimizers_by_bluefog_names(rank, size):
    v = tf.Variable([float(rank)])
    opt = bf.DistributedAllreduceOptimizer(keras.optimizers.SGD(0.0), None)
    opt.apply([tf.zeros([1])], [v])
    np.testing.assert_allclose(v.numpy(), [(size - 1) / 2.0])  # the mean model
    w = tf.Variable([0.0])
    grad = bf.DistributedGradientAllreduceOptimizer(keras.optimizers.SGD(1.0))
    grad.apply([tf.constant([float(rank)])], [w])
    np.testing.assert_allclose(w.numpy(), [-(size - 1) / 2.0])  # stepped on the mean gradient


@pytest.mark.timeout(120)
def test_broadcast_parameters_and_window_names(rank, size):
    a, b = tf.Variable([float(rank)]), tf.Variable([2.0 * rank + 1])
    root = size - 1
    bf.broadcast_parameters({"b": b, "a": a}, root_rank=root)
    np.testing.assert_allclose([a.numpy()[0], b.numpy()[0]], [root, 2.0 * root + 1])
    c = tf.Variable([float(rank)])
    bf.broadcast_parameters([("c", c)], root_rank=root)
    np.testing.assert_allclose(c.numpy(), [root])
    assert bf.get_current_created_window_names() == bf.window_names()


def test_topology_util_names_under_bf():
    assert bf.RingGraph(4).number_of_nodes() == 4
    assert bf.IsTopologyEquivalent(bf.ExponentialGraph(4), bf.ExponentialGraph(4))


@pytest.mark.timeout(120)
def test_communication_type_switched_between_eager_steps(rank, size):
    """Bluefog's MNIST example switches to allreduce for one step now and then."""
    opt = bf.DistributedAdaptWithCombineOptimizer(keras.optimizers.SGD(0.0), name="switch")
    v = tf.Variable([float(rank)], dtype=tf.float64)
    opt.communication_type = bf.CommunicationType.allreduce
    opt.apply([tf.zeros([1], tf.float64)], [v])
    np.testing.assert_allclose(v.numpy(), [(size - 1) / 2.0], rtol=1e-12)
    opt.communication_type = "neighbor.allreduce"
    assert opt.communication_type == "neighbor_allreduce"
    with pytest.raises(ValueError, match="communication_type must be one of"):
        opt.communication_type = "ring"
    tf.function(lambda: opt.apply([tf.zeros([1], tf.float64)], [v]))()
    with pytest.raises(ValueError, match=r"rank \d+: bluefog DistributedAdaptWithCombineOptimizer:"
                                         r" setting opt.communication_type after a step was "
                                         "traced"):
        opt.communication_type = "allreduce"


def test_window_optimizers_take_bluefog_arguments():
    model = keras.Sequential([keras.layers.Input((1,)), keras.layers.Dense(1)])
    put = bf.DistributedWinPutOptimizer(keras.optimizers.SGD(0.1), model, 3,
                                        window_prefix="bluefog.args")
    assert put.num_steps_per_communication == 3
    assert put._bluefog_prefix == "bluefog.args"
    push = bf.DistributedPushSumOptimizer(keras.optimizers.SGD(0.1), 2)  # the former order
    assert push.num_steps_per_communication == 2


@pytest.mark.timeout(120)
@pytest.mark.parametrize("traced", [False, True], ids=["eager", "tf_function"])
def test_machine_knobs_on_hierarchical_optimizer(traced, rank, size):
    """One machine: no neighbour machines, so the step gives self_weight * the machine's mean
    (the topology's self weight is 1: the mean itself)."""
    opt = bf.DistributedAdaptThenCombineOptimizer(
        keras.optimizers.SGD(0.0), communication_type="hierarchical_neighbor_allreduce",
        name=f"knobs.machine.{traced}")
    v = tf.Variable([float(rank)], dtype=tf.float64)

    def step():
        opt.apply([tf.zeros([1], tf.float64)], [v])

    run = tf.function(step) if traced else step
    mean = (size - 1) / 2.0
    run()
    np.testing.assert_allclose(v.numpy(), [mean], rtol=1e-12)
    opt.self_weight, opt.src_machine_weights, opt.dst_machine_weights = 0.5, {}, []
    run()
    np.testing.assert_allclose(v.numpy(), [0.5 * mean], rtol=1e-12)
    with pytest.raises(ValueError, match="opt.src_weights would be ignored"):
        opt.src_weights = {}
    with pytest.raises(ValueError, match="not another machine"):
        opt.dst_machine_weights = [1]
