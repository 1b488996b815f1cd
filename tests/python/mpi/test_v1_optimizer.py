"""DistributedOptimizer around tf.compat.v1 optimizers, in a Session, on every rank."""

import numpy as np
import tensorflow as tf

import bluefog.tensorflow as bf

from conftest import mean_factor

W = np.array([1.0, -2.0, 0.5], dtype=np.float32)


def test_v1_optimizer_in_session(rank, size):
    graph = tf.Graph()
    with graph.as_default():
        v = tf.compat.v1.Variable(W, use_resource=True)
        loss = (rank + 1) * tf.reduce_sum(v * tf.constant(W))
        opt = bf.DistributedOptimizer(tf.compat.v1.train.GradientDescentOptimizer(0.5))
        assert opt.get_name() == "DistributedGradientDescentOptimizer"
        grads_and_vars = opt.compute_gradients(loss, var_list=[v])
        train_op = opt.minimize(loss, var_list=[v])
        init = tf.compat.v1.global_variables_initializer()
    with tf.compat.v1.Session(graph=graph) as sess:
        sess.run(init)
        g = sess.run(grads_and_vars[0][0])
        np.testing.assert_allclose(g, mean_factor(size) * W, rtol=1e-6)
        sess.run(train_op)
        sess.run(train_op)
        np.testing.assert_allclose(sess.run(v), W - 2 * 0.5 * mean_factor(size) * W, rtol=1e-6)


def test_v1_momentum_optimizer_slots_delegate(rank, size):
    graph = tf.Graph()
    with graph.as_default():
        v = tf.compat.v1.Variable(W, use_resource=True)
        loss = (rank + 1) * tf.reduce_sum(v)
        opt = bf.DistributedOptimizer(
            tf.compat.v1.train.MomentumOptimizer(0.1, momentum=0.9), name="mom")
        train_op = opt.minimize(loss)
        assert opt.get_slot_names() == ["momentum"]
        slot = opt.get_slot(v, "momentum")
        init = tf.compat.v1.global_variables_initializer()
    with tf.compat.v1.Session(graph=graph) as sess:
        sess.run(init)
        sess.run(train_op)
        np.testing.assert_allclose(sess.run(slot), mean_factor(size) * np.ones(3), rtol=1e-6)
