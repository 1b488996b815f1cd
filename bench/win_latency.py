"""How long a blocking ``bf.win_put`` takes (until the target acknowledged it), with the target
idle in ``time.sleep`` or busy computing, against ``bf.neighbor_allreduce`` of the same tensor
(which needs the target to take part).

    mpirun -np 2 python bench/win_latency.py            # JSON lines, median over repetitions

Rank 0 is the origin, rank 1 the target; sizes 4 KiB to 16 MiB of float32.
"""

import json
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np
import tensorflow as tf

import bluefog.tensorflow as bf
from bluefog.common import topology_util

tf.config.threading.set_intra_op_parallelism_threads(1)
tf.config.threading.set_inter_op_parallelism_threads(1)
bf.init()
if bf.size() != 2:
    sys.exit("run with 2 ranks")
bf.set_topology(topology_util.RingGraph(2))
reps = int(os.environ.get("REPS", "20"))


def barrier():
    bf.allreduce(tf.constant(0.0), name="barrier")


for nbytes in [4096, 65536, 1 << 20, 16 << 20]:
    x = tf.ones([nbytes // 4])
    name = f"lat{nbytes}"
    bf.win_create(x, name)
    for target_state in ["sleep", "busy"]:
        barrier()
        times = []
        if bf.rank() == 0:
            bf.win_put(x, name)  # warm-up
            for _ in range(reps):
                t0 = time.perf_counter()
                bf.win_put(x, name)
                times.append(time.perf_counter() - t0)
            bf.allreduce(tf.constant(1.0), name="done")
        else:
            # Busy or asleep until every put has landed, without any communication of its own:
            # get_win_version only reads this rank's own counters.
            a = np.random.rand(256, 256)
            t_end = time.time() + 60
            while time.time() < t_end:
                if target_state == "busy":
                    for _ in range(20):
                        a = a @ a
                        a /= np.abs(a).max()
                else:
                    time.sleep(0.05)
                if bf.get_win_version(name).get(0, 0) >= reps + 1:
                    break
            bf.allreduce(tf.constant(1.0), name="done")
            bf.win_update(name)
        if bf.rank() == 0:
            print(json.dumps({"op": "win_put", "bytes": nbytes, "target": target_state,
                              "median_ms": 1e3 * float(np.median(times)),
                              "min_ms": 1e3 * float(np.min(times))}), flush=True)
    barrier()
    times = []
    for _ in range(reps):
        barrier()
        t0 = time.perf_counter()
        bf.neighbor_allreduce(x, name=f"na{nbytes}")
        times.append(time.perf_counter() - t0)
    if bf.rank() == 0:
        print(json.dumps({"op": "neighbor_allreduce", "bytes": nbytes, "target": "in the call",
                          "median_ms": 1e3 * float(np.median(times))}), flush=True)
    barrier()
    bf.win_free(name)
