"""The Keras quickstart (README, docs/index.md, docs/quickstart.md).

Run: `bfrun -np 2 python keras_quickstart.py`."""
# --8<-- [start:example]
import keras
import numpy as np

import bluefog.tensorflow.keras as bfk

bfk.init()                                                      # on every rank
x = np.random.default_rng(bfk.rank()).normal(size=(512, 8)).astype("float32")  # its own data
y = (x.sum(axis=1) > 0).astype("int32")
model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(2)])
opt = bfk.DistributedOptimizer(keras.optimizers.Adam(0.01 * bfk.size()))  # averages gradients
model.compile(optimizer=opt, loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
              metrics=["accuracy"])
model.fit(x, y, batch_size=32, epochs=3, verbose=2 if bfk.rank() == 0 else 0,
          callbacks=[bfk.callbacks.BroadcastGlobalVariablesCallback(0),  # same start
                     bfk.callbacks.MetricAverageCallback()])             # averaged logs
# --8<-- [end:example]

# The check the docs test runs: every rank holds the same weights, and the model learned.
kernel = model.get_weights()[0]
gathered = bfk.allgather(kernel[None]).numpy()
assert all(np.array_equal(gathered[0], w) for w in gathered), "weights differ across ranks"
accuracy = model.evaluate(x, y, verbose=0)[1]
assert accuracy > 0.8, f"accuracy {accuracy}"
print(f"keras_quickstart ok rank {bfk.rank()} accuracy {accuracy:.2f}")
