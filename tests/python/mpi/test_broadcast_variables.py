"""broadcast_variables on every rank: eagerly, in tf.function and in v1 graphs, for tf and Keras
variables and whole models, from every root."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import bluefog.tensorflow as bf

from conftest import assert_same_on_all_ranks, needs_ranks

W = np.array([1.0, -2.0, 0.5], dtype=np.float32)


def make_model(seed):
    keras.utils.set_random_seed(seed)
    return keras.Sequential([keras.Input((3,)), keras.layers.Dense(4, activation="tanh"),
                             keras.layers.Dense(1)])


def test_broadcast_variables_eager_tf_and_keras(rank, size):
    root = size - 1
    tv = tf.Variable(W * (rank + 1))
    ti = tf.Variable(np.array([rank, 7], dtype=np.int64))
    kv = keras.Variable(np.full((2, 2), rank, dtype=np.float32))
    assert bf.broadcast_variables([tv, ti, kv], root_rank=root) is None
    np.testing.assert_array_equal(tv.numpy(), W * (root + 1))
    np.testing.assert_array_equal(ti.numpy(), [root, 7])
    np.testing.assert_array_equal(np.asarray(kv), np.full((2, 2), root))


def test_broadcast_variables_of_a_model(rank):
    model = make_model(seed=rank)  # different initial weights on every rank
    bf.broadcast_variables(model.variables, root_rank=0)
    assert_same_on_all_ranks(model.get_weights())


def test_broadcast_variables_graph_mode_returns_op(rank, size):
    graph = tf.Graph()
    with graph.as_default():
        v = tf.compat.v1.Variable(W * (rank + 1), use_resource=True)
        op = bf.broadcast_variables([v], root_rank=0)
        assert isinstance(op, tf.Operation)
        init = tf.compat.v1.global_variables_initializer()
    with tf.compat.v1.Session(graph=graph) as sess:
        sess.run(init)
        sess.run(op)
        np.testing.assert_array_equal(sess.run(v), W)


def test_broadcast_variables_in_tf_function(rank):
    v = tf.Variable(W * (rank + 1))

    @tf.function
    def sync():
        bf.broadcast_variables([v], root_rank=0)

    sync()
    np.testing.assert_array_equal(v.numpy(), W)


def test_broadcast_variables_bad_arguments(size):
    v = tf.Variable(W)
    with pytest.raises(TypeError, match="root_rank must be an int"):
        bf.broadcast_variables([v], root_rank="0")
    with pytest.raises(ValueError, match="outside"):
        bf.broadcast_variables([v], root_rank=size)
    with pytest.raises(TypeError, match="single variable"):
        bf.broadcast_variables(v, root_rank=0)
    with pytest.raises(TypeError, match="element 1"):
        bf.broadcast_variables([v, tf.constant(W)], root_rank=0)
    with pytest.raises(TypeError, match="list of variables"):
        bf.broadcast_variables(3, root_rank=0)


@needs_ranks(2)
def test_broadcast_variables_from_each_root(rank, size):
    v = tf.Variable(np.array([float(rank)]))
    for root in range(size):
        v.assign([float(rank)])
        bf.broadcast_variables([v], root_rank=root)
        assert v.numpy()[0] == root
