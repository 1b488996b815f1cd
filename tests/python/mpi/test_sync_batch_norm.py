"""bf.keras.layers.SyncBatchNormalization against plain Keras BatchNormalization run in this
one process on the concatenation of every rank's batch (rank q's batch is known to all ranks;
its size is q + 2, so batches are uneven): outputs, moving statistics, gradients (of the sum of
all ranks' losses), masks, model.fit, and saving/loading.
"""

import os
import tempfile

import keras
import numpy as np
import pytest
import tensorflow as tf

import bluefog.tensorflow as bf

SyncBN = bf.keras.layers.SyncBatchNormalization


def rank_x(q: int, shape=(2, 2, 3)) -> np.ndarray:
    rng = np.random.default_rng(300 + q)
    return (rng.normal(size=(q + 2,) + shape) * (q + 1) + q).astype(np.float32)


def rank_c(q: int, shape=(2, 2, 3)) -> np.ndarray:
    return np.random.default_rng(700 + q).normal(size=(q + 2,) + shape).astype(np.float32)


def concat(fn, **kw) -> np.ndarray:
    return np.concatenate([fn(q, **kw) for q in range(bf.size())])


def my_rows():
    start = sum(q + 2 for q in range(bf.rank()))
    return slice(start, start + bf.rank() + 2)


def init_kwargs():
    return dict(gamma_initializer=keras.initializers.Constant(1.5),
                beta_initializer=keras.initializers.Constant(-0.25), momentum=0.8)


def reference(shape=(2, 2, 3), mask=None, **layer_kw):
    """Plain BatchNormalization on the concatenated batch: outputs, d(sum c*y)/dx, /dgamma,
    /dbeta, moving mean and variance after the call."""
    layer = keras.layers.BatchNormalization(**init_kwargs(), **layer_kw)
    x = tf.constant(concat(rank_x, shape=shape))
    c = tf.constant(concat(rank_c, shape=shape))
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = layer(x, training=True, mask=mask)
        loss = tf.reduce_sum(c * y)
    dx, dgamma, dbeta = tape.gradient(loss, [x, layer.gamma, layer.beta])
    return (y.numpy(), dx.numpy(), dgamma.numpy(), dbeta.numpy(),
            layer.moving_mean.numpy(), layer.moving_variance.numpy())


def run_sync(layer, shape=(2, 2, 3), in_function=False, mask=None):
    x = tf.constant(rank_x(bf.rank(), shape=shape))
    c = tf.constant(rank_c(bf.rank(), shape=shape))

    def step(x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = layer(x, training=True, mask=mask)
            loss = tf.reduce_sum(c * y)
        dx, dgamma, dbeta = tape.gradient(loss, [x, layer.gamma, layer.beta])
        return y, dx, dgamma, dbeta

    if in_function:
        layer.build(x.shape)
        step = tf.function(step)
    y, dx, dgamma, dbeta = step(x)
    # gamma and beta gradients of the whole job's loss: the sum of every rank's part
    dgamma = bf.allreduce(dgamma, average=False, name=f"sbn.test.dgamma.{in_function}")
    dbeta = bf.allreduce(dbeta, average=False, name=f"sbn.test.dbeta.{in_function}")
    return (y.numpy(), dx.numpy(), dgamma.numpy(), dbeta.numpy(),
            layer.moving_mean.numpy(), layer.moving_variance.numpy())


def check(got, want, rows, tol=2e-4):
    names = ["output", "dx", "dgamma", "dbeta", "moving_mean", "moving_variance"]
    for name, g, w, sliced in zip(names, got, want, [True, True, False, False, False, False]):
        w = w[rows] if sliced else w
        np.testing.assert_allclose(g, w, rtol=tol, atol=tol, err_msg=name)


@pytest.mark.parametrize("in_function", [False, True])
def test_matches_batch_norm_on_concatenated_uneven_batches(in_function):
    check(run_sync(SyncBN(**init_kwargs()), in_function=in_function), reference(), my_rows())


def test_channels_first_axis():
    got = run_sync(SyncBN(axis=1, **init_kwargs()), shape=(3, 2, 2))
    check(got, reference(shape=(3, 2, 2), axis=1), my_rows())


def test_mask():
    shape = (4, 3)  # (time, channels); mask over (batch, time)
    masks = [np.arange((q + 2) * 4).reshape(q + 2, 4) % 3 != 1 for q in range(bf.size())]
    full_mask = tf.constant(np.concatenate(masks))
    got = run_sync(SyncBN(**init_kwargs()), shape=shape, mask=tf.constant(masks[bf.rank()]))
    check(got, reference(shape=shape, mask=full_mask), my_rows())


def test_fit_keeps_moving_statistics_identical():
    def model_of(bn):
        return keras.Sequential([keras.Input((2, 2, 3)), bn, keras.layers.Flatten(),
                                 keras.layers.Dense(1, kernel_initializer="ones")])

    model = model_of(SyncBN(**init_kwargs()))
    model.compile(optimizer=bf.DistributedOptimizer(keras.optimizers.SGD(0.0)), loss="mse")
    x = rank_x(bf.rank())
    model.fit(x, np.zeros((len(x), 1), np.float32), batch_size=len(x), epochs=1, verbose=0,
              shuffle=False)
    ref = keras.layers.BatchNormalization(**init_kwargs())
    ref(tf.constant(concat(rank_x)), training=True)
    bn = model.layers[0]
    np.testing.assert_allclose(bn.moving_mean.numpy(), ref.moving_mean.numpy(), rtol=1e-5)
    np.testing.assert_allclose(bn.moving_variance.numpy(), ref.moving_variance.numpy(),
                               rtol=1e-4)
    everyone = bf.allgather(tf.reshape(bn.moving_variance, [1, -1]), name="sbn.test.fit").numpy()
    assert (everyone == everyone[0]).all()


def test_save_and_load(tmp_path_factory):
    model = keras.Sequential([keras.Input((2, 2, 3)), SyncBN(**init_kwargs())])
    model(rank_x(bf.rank()), training=True)
    path = os.path.join(tempfile.mkdtemp(), f"sbn_rank{bf.rank()}.keras")
    model.save(path)
    loaded = keras.models.load_model(path)
    assert type(loaded.layers[0]) is SyncBN
    x = rank_x(0)
    np.testing.assert_allclose(loaded(x, training=False).numpy(),
                               model(x, training=False).numpy(), rtol=1e-6)
    got = run_sync(loaded.layers[0])[4]  # training still synchronizes after loading
    assert got.shape == (3,)


def test_horovod_names():
    assert bf.SyncBatchNormalization is SyncBN is bf.keras.SyncBatchNormalization


def test_refuses_synchronized():
    with pytest.raises(ValueError, match="synchronized"):
        SyncBN(synchronized=True)
