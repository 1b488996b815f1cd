"""A custom training loop (docs/custom-loops.md): `bfrun -np 2 python custom_loop.py`."""
# --8<-- [start:example]
import keras
import numpy as np
import tensorflow as tf

import bluefog.tensorflow as bf

bf.init()
rng = np.random.default_rng(bf.rank())
x = tf.constant(rng.normal(size=(256, 4)).astype("float32"))
y = tf.reduce_sum(x, axis=1, keepdims=True)                 # learn the sum of the inputs
model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
opt = keras.optimizers.SGD(0.05 * bf.size())
opt.build(model.trainable_variables)                        # create the optimizer's state first
bf.broadcast_variables(model.weights + opt.variables, root_rank=0)   # same start everywhere


@tf.function
def train_step(xb, yb):
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(tf.square(model(xb) - yb))
    tape = bf.DistributedGradientTape(tape)                 # gradients averaged over ranks
    grads = tape.gradient(loss, model.trainable_variables)
    opt.apply_gradients(zip(grads, model.trainable_variables))
    return loss


for step in range(60):                                      # every rank runs the same steps
    i = (step * 32) % 256
    loss = train_step(x[i:i + 32], y[i:i + 32])
# --8<-- [end:example]

gathered = bf.allgather(model.get_weights()[0][None]).numpy()
assert all(np.array_equal(gathered[0], w) for w in gathered), "weights differ across ranks"
assert float(loss) < 0.1, f"loss {float(loss)}"
print(f"custom_loop ok rank {bf.rank()} loss {float(loss):.4f}")
