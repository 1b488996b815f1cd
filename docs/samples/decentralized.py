"""Neighbour averaging on a topology (docs/decentralized.md).

Run: `bfrun -np 2 python decentralized.py`."""
# --8<-- [start:example]
import tensorflow as tf

import bluefog.tensorflow as bf
from bluefog.common import topology_util

bf.init()
bf.set_topology(topology_util.RingGraph(bf.size()))         # each rank talks to its ring neighbours
x = tf.constant([float(bf.rank())])
y = bf.neighbor_allreduce(x)              # uniform mean of this rank's and its in-neighbours' x
print(bf.rank(), bf.in_neighbor_ranks(), y.numpy())
# --8<-- [end:example]

neighbors = bf.in_neighbor_ranks()
expected = (bf.rank() + sum(neighbors)) / (1 + len(neighbors))
assert abs(float(y[0]) - expected) < 1e-6, (float(y[0]), expected)

# --8<-- [start:optimizer]
import keras  # noqa: E402
import numpy as np  # noqa: E402

rng = np.random.default_rng(bf.rank())
xs = rng.normal(size=(256, 4)).astype("float32")
ys = xs.sum(axis=1, keepdims=True)
model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
opt = bf.DistributedAdaptThenCombineOptimizer(keras.optimizers.SGD(0.05),
                                              communication_type="neighbor_allreduce")
model.compile(optimizer=opt, loss="mse")    # each step: a local update, then neighbour averaging
model.fit(xs, ys, batch_size=32, epochs=2, verbose=0,
          callbacks=[bf.keras.callbacks.BroadcastGlobalVariablesCallback(0)])
# --8<-- [end:optimizer]

# At 2 ranks on a ring each rank's only neighbour is the other, and the uniform average of the
# two makes the weights equal after every step; the loss must have come down.
kernel = model.get_weights()[0]
gathered = bf.allgather(kernel[None]).numpy()
if bf.size() == 2:
    assert np.allclose(gathered[0], gathered[1], atol=1e-6), gathered
loss = model.evaluate(xs, ys, verbose=0)
assert loss < 0.5, f"loss {loss}"
bf.set_topology()                                           # back to the default topology
print(f"decentralized ok rank {bf.rank()} loss {loss:.4f}")
