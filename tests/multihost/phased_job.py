"""Run by test_multihost.py on 2 network-namespace hosts x 2 ranks (mpirun -H a:2,b:2): the
exchanges with one peer on the other host, which the MPI backend runs in two phases, against
closed-form results; also with the phased exchange off on rank 0 only (the orders must still
match); and the flat ring allreduce across the hosts. Prints PHASED OK from every rank."""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

tf.config.threading.set_intra_op_parallelism_threads(1)
tf.config.threading.set_inter_op_parallelism_threads(2)

import bluefog.tensorflow as bf  # noqa: E402
from bluefog.common import basics  # noqa: E402

bf.init()
n, me, local = bf.size(), bf.rank(), bf.local_size()
assert (n, local, bf.machine_size()) == (4, 2, 2), (n, local, bf.machine_size())
across = (me + local) % n  # the same local rank on the other host
for phased_on_rank0 in (1, 0):
    if me == 0:
        basics._tune("phased_exchange", phased_on_rank0)
    for elements in (262144, 1001):  # 1 MiB; an odd size (hierarchical: padded slices)
        x = tf.fill([elements], float(me + 1))
        got = bf.neighbor_allreduce(x, self_weight=0.25, src_weights={across: 0.75},
                                    dst_weights=[across], name=f"pair.{elements}").numpy()
        np.testing.assert_allclose(got, 0.25 * (me + 1) + 0.75 * (across + 1))
        got = bf.hierarchical_neighbor_allreduce(x, name=f"hier.{elements}").numpy()
        np.testing.assert_allclose(got, (n + 1) / 2.0)  # two machines: the global mean
        # The ranks of host 0 also exchange with each other: they post both transfers at
        # once, while their peers across run the phases.
        srcs = {1 - me: 0.25, across: 0.25} if me < local else {across: 0.5}
        dsts = sorted(srcs)
        got = bf.neighbor_allreduce(x, self_weight=1.0 - sum(srcs.values()), src_weights=srcs,
                                    dst_weights=dsts, name=f"mixed.{elements}").numpy()
        want = (1.0 - sum(srcs.values())) * (me + 1) + sum(w * (r + 1) for r, w in srcs.items())
        np.testing.assert_allclose(got, want, rtol=1e-6)
basics._tune("phased_exchange", 1)
# The allreduce's ring with neighbours on the other host (the hierarchical path off), which
# waits without spinning there.
basics._tune("hierarchical", 0)
for elements in (1 << 20, 1000003):
    got = bf.allreduce(tf.fill([elements], float(me + 1)), average=False,
                       name=f"ring.{elements}").numpy()
    np.testing.assert_allclose(got, n * (n + 1) / 2.0)
basics._tune("hierarchical", 1)
print(f"PHASED OK rank {me}", flush=True)
