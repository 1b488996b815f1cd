"""Bluefog's optimizer API on the Keras wrappers: CommunicationType, the model argument, and the
per-step knobs (accepted at their neutral values, refused otherwise, never ignored)."""

import numpy as np
import pytest
import tensorflow as tf

import bluefog.tensorflow as bf
from bluefog.tensorflow import wrapping

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


@pytest.mark.parametrize("knob,neutral,other", [
    ("self_weight", None, 0.5), ("src_weights", None, {0: 0.5}), ("dst_weights", None, [0]),
    ("src_machine_weights", None, {0: 1.0}), ("dst_machine_weights", None, [0]),
    ("enable_topo_check", True, False), ("force_barrier", False, True)])
def test_per_step_knobs_refused_not_ignored(knob, neutral, other, rank):
    opt = bf.DistributedAdaptThenCombineOptimizer(keras.optimizers.SGD(0.1))
    setattr(opt, knob, neutral)
    assert getattr(opt, knob) == neutral
    with pytest.raises(ValueError, match=rf"rank {rank}: bluefog "
                                         rf"DistributedAdaptThenCombineOptimizer: setting "
                                         rf"opt.{knob} per step is not supported"):
        setattr(opt, knob, other)


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
