"""A Horovod TF2 custom loop after porting (docs/horovod.md).

Run: `bfrun -np 2 python horovod_port.py`."""
# --8<-- [start:example]
import keras
import numpy as np
import tensorflow as tf

import bluefog.tensorflow as hvd  # was: import horovod.tensorflow as hvd

hvd.init()
rng = np.random.default_rng(hvd.rank())
x = tf.constant(rng.normal(size=(128, 4)).astype("float32"))
y = tf.reduce_sum(x, axis=1, keepdims=True)
model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
opt = keras.optimizers.SGD(0.01)
opt.learning_rate.assign(0.05 * hvd.size())   # Keras 3: was keras.backend.set_value(opt.lr, ...)


@tf.function
def train_step(xb, yb, first_batch):
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(tf.square(model(xb) - yb))
    tape = hvd.DistributedGradientTape(tape)
    grads = tape.gradient(loss, model.trainable_variables)
    opt.apply_gradients(zip(grads, model.trainable_variables))
    if first_batch:   # after the first step, so that the optimizer's variables exist
        hvd.broadcast_variables(model.variables, root_rank=0)
        hvd.broadcast_variables(opt.variables, root_rank=0)   # Keras 3: was opt.variables()
    return loss


for step in range(40):
    i = (step * 32) % 128
    loss = train_step(x[i:i + 32], y[i:i + 32], step == 0)
# --8<-- [end:example]

gathered = hvd.allgather(model.get_weights()[0][None]).numpy()
assert all(np.array_equal(gathered[0], w) for w in gathered), "weights differ across ranks"
assert float(loss) < 0.2, f"loss {float(loss)}"
print(f"horovod_port ok rank {hvd.rank()} loss {float(loss):.4f}")
