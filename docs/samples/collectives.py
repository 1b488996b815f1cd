"""Horovod's collectives beyond the seed (docs/collectives.md), at any number of ranks.

Run: `bfrun -np 3 python collectives.py`."""
import tensorflow as tf

import bluefog.tensorflow as bf

bf.init()
n, r = bf.size(), bf.rank()
# --8<-- [start:example]
x = tf.fill([n * (n + 1) // 2, 2], float(r))              # 1 + 2 + ... + n rows
out, received_splits = bf.alltoall(x, splits=list(range(1, n + 1)))  # i+1 rows to rank i
y = tf.fill([2 * n, 2], float(r))
even = bf.alltoall(y)                                      # no splits: 2 rows to each rank
grads, a, b = tf.ones([n, 3]), tf.ones([2, 2]), tf.ones([3])
part = bf.reducescatter(grads, op=bf.Average)              # this rank's rows of the mean
parts = bf.grouped_reducescatter([grads, grads], op=bf.Sum)
gathered = bf.grouped_allgather([a, b])
z = bf.allreduce(x, op=bf.Sum, prescale_factor=0.5, postscale_factor=2.0)
# --8<-- [end:example]

# Rank r receives r+1 rows from every rank s, holding s.
assert received_splits.numpy().tolist() == [r + 1] * n, received_splits
want = [float(s) for s in range(n) for _ in range(r + 1)]
assert out[:, 0].numpy().tolist() == want, out
assert even[:, 0].numpy().tolist() == [float(s) for s in range(n) for _ in range(2)], even
assert part.numpy().tolist() == [[1.0] * 3], part
assert [p.numpy().tolist() for p in parts] == [[[float(n)] * 3]] * 2, parts
assert gathered[0].shape == (2 * n, 2) and gathered[1].shape == (3 * n,), gathered
assert abs(float(z[0, 0]) - n * (n - 1) / 2) < 1e-6, z
print(f"collectives ok rank {r}", flush=True)
