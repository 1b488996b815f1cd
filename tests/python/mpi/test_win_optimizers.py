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
