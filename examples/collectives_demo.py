"""The three collectives on every rank.

Run with `bfrun -np 2 python examples/collectives_demo.py`.
"""

import tensorflow as tf

import bluefog.tensorflow as bf

bf.init()
r, n = bf.rank(), bf.size()

summed = bf.allreduce(tf.fill([2, 2], float(r + 1)), average=False, name="demo.sum")
mean = bf.allreduce(tf.fill([2, 2], float(r + 1)), name="demo.mean")
gathered = bf.allgather(tf.fill([r + 1], r), name="demo.gather")
root_value = bf.broadcast(tf.constant([10 * r, 10 * r + 1]), root_rank=n - 1, name="demo.bcast")

assert (summed.numpy() == n * (n + 1) / 2).all()
assert (mean.numpy() == (n + 1) / 2).all()
assert gathered.numpy().tolist() == [k for k in range(n) for _ in range(k + 1)]
assert root_value.numpy().tolist() == [10 * (n - 1), 10 * (n - 1) + 1]
print(f"rank {r}/{n}: sum {summed.numpy()[0, 0]}, mean {mean.numpy()[0, 0]}, "
      f"allgather {gathered.numpy().tolist()}, broadcast {root_value.numpy().tolist()}")
