"""The asynchronous window optimizers (DistributedWinPutOptimizer, DistributedPushSumOptimizer)
under Keras ``model.fit``: with a learning rate of 0 only the mixing changes the weights, so
ranks that start from different weights must come together."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import bluefog.tensorflow as bf

from conftest import flat_weights, gather_rows, needs_ranks

OPTIMIZERS = {"winput": bf.DistributedWinPutOptimizer,
              "pushsum": bf.DistributedPushSumOptimizer}


@needs_ranks(2)
@pytest.mark.parametrize("mode", sorted(OPTIMIZERS))
def test_model_fit_mixes_weights(mode, rank, size):
    bf.set_topology()
    keras.utils.set_random_seed(100 + rank)  # a different model on every rank
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)])
    name = f"test_win_optimizers.fit.{mode}"
    model.compile(optimizer=OPTIMIZERS[mode](keras.optimizers.SGD(0.0), name=name), loss="mse")
    before = gather_rows(flat_weights(model.get_weights()), name=f"{name}.before")
    x = np.ones((8, 4), np.float32)
    y = np.zeros((8, 3), np.float32)
    model.fit(x, y, batch_size=8, epochs=20, verbose=0)
    bf.allreduce(tf.constant(0.0), name=f"{name}.barrier").numpy()  # every rank's puts are done
    after = gather_rows(flat_weights(model.get_weights()), name=f"{name}.after")
    spread_before = np.abs(before - before.mean(axis=0)).max()
    spread_after = np.abs(after - after.mean(axis=0)).max()
    assert spread_after < 0.2 * spread_before, (spread_before, spread_after)
    for window in [n for n in bf.window_names() if n.startswith(name + ".")]:
        bf.win_free(window)


@needs_ranks(2)
@pytest.mark.timeout(120)
@pytest.mark.parametrize("traced", [False, True], ids=["eager", "tf_function"])
def test_win_put_knob_dst_weights_honoured(traced, rank, size):
    """opt.dst_weights = {} puts nothing: every step mixes with the buffers as win_create filled
    them (with this rank's own first weights), so the weights stay where they started; the
    topology's puts would mix in the neighbours' weights."""
    bf.set_topology()
    name = f"test_win_optimizers.knobs.winput.{traced}"
    opt = bf.DistributedWinPutOptimizer(keras.optimizers.SGD(0.0), name=name)
    v = tf.Variable([float(rank)], dtype=tf.float64)

    def step():
        opt.apply([tf.zeros([1], tf.float64)], [v])

    run = tf.function(step) if traced else step
    opt.force_barrier = True
    opt.dst_weights = {}
    with pytest.raises(ValueError, match=r"opt.self_weight would be ignored"):
        opt.self_weight = 0.5
    for _ in range(4):
        run()
        np.testing.assert_allclose(v.numpy(), [float(rank)], rtol=1e-12)
    # A destination outside the window's out-neighbours fails the step, naming the knob.
    outsiders = sorted(set(range(size)) - set(bf.out_neighbor_ranks()) - {rank})
    if outsiders:
        opt.dst_weights = {outsiders[0]: 1.0}
        with pytest.raises((ValueError, tf.errors.OpError),
                           match=r"opt.dst_weights names ranks .* not out-neighbours"):
            run()
    opt.dst_weights = None
    run()  # the topology's puts again
    bf.barrier()
    bf.win_free(f"{name}.float64")


@needs_ranks(2)
@pytest.mark.timeout(120)
@pytest.mark.parametrize("traced", [False, True], ids=["eager", "tf_function"])
def test_push_sum_knobs_honoured(traced, rank, size):
    """Push-sum keeps x / p: with opt.self_weight = 0.5 and no destinations, nothing moves
    between ranks and the weights stay as they are; with the default shares set as knobs, the
    ranks agree on the mean."""
    bf.set_topology()
    name = f"test_win_optimizers.knobs.pushsum.{traced}"
    opt = bf.DistributedPushSumOptimizer(keras.optimizers.SGD(0.0), name=name)
    v = tf.Variable([float(rank)], dtype=tf.float64)

    def step():
        opt.apply([tf.zeros([1], tf.float64)], [v])

    run = tf.function(step) if traced else step
    opt.force_barrier = True
    opt.self_weight, opt.dst_weights = 0.5, {}
    for _ in range(3):
        run()
        np.testing.assert_allclose(v.numpy(), [float(rank)], rtol=1e-12)
    np.testing.assert_allclose(bf.win_associated_p(f"{name}.float64"), 0.125, rtol=1e-12)
    out = bf.out_neighbor_ranks()
    opt.self_weight = 1.0 / (len(out) + 1)
    opt.dst_weights = {r: 1.0 / (len(out) + 1) for r in out}
    for _ in range(30):
        run()
    bf.barrier()
    np.testing.assert_allclose(v.numpy(), [(size - 1) / 2.0], atol=0.05)
    bf.barrier()
    bf.win_free(f"{name}.float64")
