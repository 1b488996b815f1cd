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
bf.set_topology()                                           # back to the default topology
print(f"decentralized ok rank {bf.rank()}")
