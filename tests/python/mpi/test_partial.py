"""Worker-local variables (PartialDistributedGradientTape / PartialDistributedOptimizer,
register_local_source / register_local_var, BroadcastGlobalVariablesCallback's
local_variables) and DistributedOptimizer's average_aggregated_gradients.

References are computed in closed form on every rank: rank q's data is known to all ranks, so
each rank computes every rank's plain (single-process) gradient itself.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

import bluefog.tensorflow as bf

N_IN, N_HIDDEN = 3, 4


def rank_batch(q: int):
    rng = np.random.default_rng(50 + q)
    return (rng.normal(size=(5, N_IN)).astype(np.float32),
            rng.normal(size=(5, 1)).astype(np.float32))


def make_model():
    """A shared body and a head that will be worker-local; identical weights on every rank."""
    body = keras.layers.Dense(N_HIDDEN, activation="tanh", name="body",
                              kernel_initializer=keras.initializers.Constant(0.1))
    head = keras.layers.Dense(1, name="head",
                              kernel_initializer=keras.initializers.Constant(-0.2),
                              bias_initializer=keras.initializers.Constant(0.3))
    model = keras.Sequential([keras.Input((N_IN,)), body, head])
    return model, body, head


def loss_fn(model, x, y):
    return tf.reduce_mean(tf.square(model(x) - y))


def plain_grads(model, q: int) -> list:
    x, y = rank_batch(q)
    with tf.GradientTape() as tape:
        loss = loss_fn(model, x, y)
    return [g.numpy() for g in tape.gradient(loss, model.trainable_variables)]


def expected_grads(model, head, scale: bool) -> list:
    """Mean over ranks for shared variables, this rank's own (/size if scale) for the head."""
    n, per_rank = bf.size(), [plain_grads(model, q) for q in range(bf.size())]
    head_ids = {id(v) for v in head.trainable_weights}
    out = []
    for j, v in enumerate(model.trainable_variables):
        if id(v) in head_ids:
            out.append(per_rank[bf.rank()][j] / (n if scale else 1))
        else:
            out.append(np.mean([g[j] for g in per_rank], axis=0))
    return out


@pytest.mark.parametrize("scale", [True, False])
@pytest.mark.parametrize("in_function", [False, True])
def test_partial_tape(scale, in_function):
    model, body, head = make_model()
    want = expected_grads(model, head, scale)
    x, y = rank_batch(bf.rank())

    def step():
        with tf.GradientTape() as tape:
            loss = loss_fn(model, x, y)
        tape = bf.PartialDistributedGradientTape(tape, local_layers=[head],
                                                 scale_local_gradients=scale)
        return tape.gradient(loss, model.trainable_variables)

    got = tf.function(step)() if in_function else step()
    for g, w in zip(got, want):
        np.testing.assert_allclose(g.numpy(), w, rtol=1e-5, atol=1e-6)


def test_register_local_source_on_tape():
    model, body, head = make_model()
    want = expected_grads(model, head, True)
    x, y = rank_batch(bf.rank())
    with tf.GradientTape() as tape:
        loss = loss_fn(model, x, y)
    tape = bf.DistributedGradientTape(tape)
    for v in head.trainable_weights:
        tape.register_local_source(v)
    for g, w in zip(tape.gradient(loss, model.trainable_variables), want):
        np.testing.assert_allclose(g.numpy(), w, rtol=1e-5, atol=1e-6)
    with pytest.raises(TypeError, match="register_local_source"):
        tape.register_local_source("head")


@pytest.mark.parametrize("how", ["layers", "register"])
def test_partial_optimizer_fit_step(how):
    model, body, head = make_model()
    want = expected_grads(model, head, True)
    before = [v.numpy() for v in model.trainable_variables]
    if how == "layers":
        opt = bf.PartialDistributedOptimizer(keras.optimizers.SGD(0.5), local_layers=head)
    else:
        opt = bf.DistributedOptimizer(keras.optimizers.SGD(0.5))
        for v in head.trainable_weights:
            opt.register_local_var(v)
    model.compile(optimizer=opt, loss="mse")
    x, y = rank_batch(bf.rank())
    model.fit(x, y, batch_size=5, epochs=1, verbose=0, shuffle=False)
    for v, b, w in zip(model.trainable_variables, before, want):
        np.testing.assert_allclose(v.numpy(), b - 0.5 * w, rtol=1e-5, atol=1e-6)


def test_partial_optimizer_errors():
    with pytest.raises(ValueError, match=r"local_layers\[0\]"):
        bf.PartialDistributedOptimizer(keras.optimizers.SGD(0.1), local_layers=["head"])
    with pytest.raises(ValueError, match="Keras optimizer"):
        bf.PartialDistributedOptimizer(tf.compat.v1.train.GradientDescentOptimizer(0.1))
    with pytest.raises(TypeError, match="scale_local_gradients"):
        bf.DistributedOptimizer(keras.optimizers.SGD(0.1), scale_local_gradients=1)


@pytest.mark.parametrize("average", [True, False])
def test_average_aggregated_gradients(average):
    """Two backward passes with gradients g1, g2 (rank-dependent), then one update:
    w = w0 - lr * mean_r((g1 + g2) / 2) when averaging, w0 - lr * mean_r(g1 + g2) otherwise."""
    n, r = bf.size(), bf.rank()
    v = keras.Variable(np.zeros(3, np.float32))
    opt = bf.DistributedOptimizer(keras.optimizers.SGD(0.1), backward_passes_per_step=2,
                                  average_aggregated_gradients=average)
    g1 = np.array([1.0, 2.0, 3.0], np.float32) * (r + 1)
    g2 = np.array([0.5, -1.0, 4.0], np.float32) * (r + 1)
    opt.apply_gradients([(tf.constant(g1), v)])
    np.testing.assert_allclose(v.numpy(), 0.0)  # accumulated, not applied
    opt.apply_gradients([(tf.constant(g2), v)])
    mean_factor = np.mean(np.arange(1, n + 1))
    total = (np.array([1.0, 2.0, 3.0]) + np.array([0.5, -1.0, 4.0])) * mean_factor
    want = -0.1 * (total / 2 if average else total)
    np.testing.assert_allclose(v.numpy(), want, rtol=1e-5)


def test_broadcast_callback_leaves_local_variables_alone():
    model, body, head = make_model()
    for v in model.weights:
        v.assign(np.full(v.shape, 10.0 * bf.rank() + 1, np.float32))
    model.compile(optimizer=bf.DistributedOptimizer(keras.optimizers.SGD(0.1)), loss="mse")
    cb = bf.keras.callbacks.BroadcastGlobalVariablesCallback(0, local_variables=[head])
    cb.set_model(model)
    cb.on_train_begin()
    for v in body.weights:
        np.testing.assert_allclose(v.numpy(), 1.0)  # rank 0's value
    for v in head.weights:
        np.testing.assert_allclose(v.numpy(), 10.0 * bf.rank() + 1)  # its own


def test_local_variable_with_gradient_accumulation():
    """backward_passes_per_step=2 with one shared and one registered local variable: the shared
    one moves by the mean over ranks of the summed passes, the local one by its own sum / size."""
    n, r = bf.size(), bf.rank()
    shared, local = keras.Variable(np.zeros(2, np.float32)), keras.Variable(np.zeros(2, np.float32))
    opt = bf.DistributedOptimizer(keras.optimizers.SGD(1.0), backward_passes_per_step=2,
                                  average_aggregated_gradients=False)
    opt.register_local_var(local)
    g = np.array([1.0, -2.0], np.float32)
    for _ in range(2):
        opt.apply_gradients([(tf.constant(g * (r + 1)), shared), (tf.constant(g * (r + 1)), local)])
    np.testing.assert_allclose(shared.numpy(), -2 * g * np.mean(np.arange(1, n + 1)), rtol=1e-6)
    np.testing.assert_allclose(local.numpy(), -2 * g * (r + 1) / n, rtol=1e-6)
    assert len(opt.variables) == 2 + 2  # iteration, lr, two accumulators: nothing else tracked


def test_op_sum_on_tape_and_optimizer():
    n, r = bf.size(), bf.rank()
    w = tf.Variable([1.0, 2.0])
    with tf.GradientTape() as tape:
        loss = (r + 1) * tf.reduce_sum(w)
    g = bf.DistributedGradientTape(tape, op=bf.Sum).gradient(loss, [w])[0]
    np.testing.assert_allclose(g.numpy(), [n * (n + 1) / 2] * 2)
    v = keras.Variable(np.zeros(2, np.float32))
    opt = bf.DistributedOptimizer(keras.optimizers.SGD(1.0), op=bf.Sum)
    opt.apply_gradients([(tf.constant([1.0, -1.0]) * (r + 1), v)])
    np.testing.assert_allclose(v.numpy(), [-n * (n + 1) / 2, n * (n + 1) / 2])
    with pytest.raises(ValueError, match="op must be"):
        bf.DistributedOptimizer(keras.optimizers.SGD(1.0), op=bf.Max)
