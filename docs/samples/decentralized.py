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

# --8<-- [start:knobs]
gen = topology_util.GetDynamicOnePeerSendRecvRanks(bf.load_topology(), bf.rank())
v = tf.Variable([float(bf.rank())])
opt = bf.DistributedAdaptThenCombineOptimizer(keras.optimizers.SGD(0.0), name="knobs")


@tf.function
def train_step():
    opt.apply([tf.zeros([1])], [v])


for _ in range(3):
    send, recv = next(gen)
    opt.dst_weights = send                                   # ranks to send to
    opt.src_weights = {r: 1 / (len(recv) + 1) for r in recv}
    opt.self_weight = 1 / (len(recv) + 1)
    train_step()                                             # the step reads the knobs
# --8<-- [end:knobs]

# At 2 ranks each step averages the two ranks' values: both hold the mean, 0.5.
if bf.size() == 2:
    assert abs(float(v[0]) - 0.5) < 1e-6, float(v[0])
bf.set_topology()                                           # back to the default topology
print(f"decentralized ok rank {bf.rank()} loss {loss:.4f}")
