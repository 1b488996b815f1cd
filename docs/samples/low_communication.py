"""Optimizers that sync every H steps (docs/low-communication.md).

Run: `bfrun -np 2 python low_communication.py`."""
# --8<-- [start:fit]
import keras
import numpy as np

import bluefog.tensorflow as bf

bf.init()
rng = np.random.default_rng(bf.rank())                   # each rank has its own data
xs = rng.normal(size=(256, 4)).astype("float32")
ys = xs.sum(axis=1, keepdims=True)
model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
opt = bf.DiLoCo(keras.optimizers.Adam(0.05), sync_every=8)   # an outer step every 8 steps
model.compile(optimizer=opt, loss="mse")
model.fit(xs, ys, batch_size=32, epochs=2, verbose=0)        # 16 steps: 2 syncs
print(opt.communication_stats())
# --8<-- [end:fit]

stats = opt.communication_stats()
assert (stats["steps"], stats["syncs"]) == (16, 2), stats
assert stats["bytes_sent"] == (2 * 5 * 4 if bf.size() > 1 else 0), stats  # 5 float32 weights
kernel = model.get_weights()[0]
rows = bf.allgather(kernel.reshape(1, -1)).numpy()
assert np.all(rows == rows[0]), rows                     # the last step was a sync
loss = model.evaluate(xs, ys, verbose=0)
assert loss < 2.0, f"loss {loss}"

# --8<-- [start:loop]
import tensorflow as tf  # noqa: E402

w = tf.Variable(tf.zeros([4]))
local = bf.LocalSGD(keras.optimizers.SGD(0.1), sync_every=4, averaging="neighbor")


@tf.function
def train_step(x, y):
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(tf.square(tf.linalg.matvec(x, w) - y))
    local.apply_gradients([(tape.gradient(loss, w), w)])
    return loss


for i in range(0, 256, 32):                              # 8 steps: neighbour averaging twice
    train_step(xs[i:i + 32], ys[i:i + 32, 0])
# --8<-- [end:loop]

# At 2 ranks each rank's only neighbour is the other: after the sync at step 8 they agree.
rows = bf.allgather(tf.reshape(w, [1, -1])).numpy()
if bf.size() == 2:
    assert np.allclose(rows[0], rows[1]), rows
assert local.communication_stats()["syncs"] == 2
print(f"low_communication ok rank {bf.rank()} loss {loss:.4f}")
