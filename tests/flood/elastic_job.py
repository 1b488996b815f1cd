"""The in-place elastic job of tests/python/test_flood.py (under ``bfrun --gloo --min-np 2``).

Each step allreduces [1, stop] (the sum must be the job's size) and adds 1 to a committed
counter, until the test creates the file named by argv[1]. At the end every worker prints its
step and counter: equal whatever was lost and re-formed on the way.
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
me = os.environ.get("BLUEFOG_ELASTIC_WORKER", "")
print(f"START worker {me} pid {os.getpid()}", flush=True)
counter = tf.Variable(0.0)
state = bf.elastic.TensorFlowState([counter], step=0)


@bf.elastic.run
def train(state):
    while True:
        stop = 1.0 if bf.rank() == 0 and os.path.exists(stop_file) else 0.0
        got = bf.allreduce(tf.constant([1.0, stop]), average=False).numpy()
        if got[0] != bf.size():
            raise SystemExit(f"WRONG worker {me}: allreduce gave {got[0]}, size {bf.size()}")
        if got[1] > 0:
            return
        counter.assign_add(1.0)
        state.step += 1
        if bf.rank() == 0:
            print(f"STEP {state.step} size {bf.size()}", flush=True)
        if state.step % 5 == 0:
            state.commit()
        time.sleep(0.05)


train(state)
print(f"DONE worker {me} rank {bf.rank()} size {bf.size()} step {state.step} counter "
      f"{float(counter.numpy()):.0f}", flush=True)
