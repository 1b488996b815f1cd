"""The Gloo job of tests/python/test_flood.py (under ``bfrun --gloo -np 3``).

Every rank allreduces [rank + 1, stop] in a loop, checking the sum each time, until the test
creates the file named by argv[1] (rank 0 sees it; the sum tells every rank at the same step).
Rank 0 prints ``READY pid ADDR PORT`` once warm, so that the test floods its rendezvous server
and counts its descriptors and threads. After the loop, a process set of ranks 0 and 2 forms
(new Gloo connections through the store the flood hit) and allreduces.
"""

import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import tensorflow as tf  # noqa: E402

import bluefog.tensorflow as bf  # noqa: E402

bf.init()
tf.config.threading.set_intra_op_parallelism_threads(1)
tf.config.threading.set_inter_op_parallelism_threads(1)
stop_file = sys.argv[1]
rank, size = bf.rank(), bf.size()
expected = size * (size + 1) / 2


def step() -> bool:
    stop = 1.0 if rank == 0 and os.path.exists(stop_file) else 0.0
    got = bf.allreduce(tf.constant([float(rank + 1), stop]), average=False).numpy()
    if got[0] != expected:
        raise SystemExit(f"WRONG rank {rank}: allreduce gave {got[0]}, expected {expected}")
    return got[1] > 0


for _ in range(20):
    step()
if rank == 0:
    print(f"READY {os.getpid()} {os.environ['MASTER_ADDR']} {os.environ['MASTER_PORT']}",
          flush=True)
steps = 0
while not step():
    steps += 1
    time.sleep(0.02)
ps = bf.add_process_set([0, 2])
total = 4.0
if rank in (0, 2):
    total = float(bf.allreduce(tf.constant([float(rank + 1)]), average=False,
                               process_set=ps).numpy()[0])
print(f"DONE rank {rank} steps {steps} process-set {total:.0f}", flush=True)
