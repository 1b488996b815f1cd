"""A 2-rank job for test_job_page.py: a short Keras fit with JobPageCallback (TensorBoard
scalars too), then a custom loop calling bf.job_page_step() until the test writes the stop
file (argv[1]). Rank 1 is slowed by 30 ms a step: the straggler; once the file argv[1] + ".stall"
appears it stops for 3 s: a stall. Rank 0 also checks that a
busy port and bad addresses are refused with clear errors, and prints what it found."""

import glob
import os
import socket
import sys
import time

import numpy as np
import tensorflow as tf

tf.config.threading.set_intra_op_parallelism_threads(1)
tf.config.threading.set_inter_op_parallelism_threads(1)

import keras  # noqa: E402

import bluefog.tensorflow as bf  # noqa: E402
from bluefog.common.job_page import JobPage  # noqa: E402

stop_file, log_dir = sys.argv[1], sys.argv[2]
bf.init()
slow = 0.03 if bf.rank() == 1 else 0.0

for bad in ("abc", "70000", "host:", "a b:80"):
    try:
        bf.serve_job_page(bad)
    except ValueError as e:
        print(f"rank {bf.rank()} refused {bad!r}: {e}", flush=True)


class Slow(keras.callbacks.Callback):
    def on_train_batch_end(self, batch, logs=None):
        time.sleep(slow)


model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(4)])
model.compile(optimizer=bf.DistributedOptimizer(keras.optimizers.SGD(0.01)), loss="mse")
x, y = np.ones((160, 8), np.float32), np.ones((160, 4), np.float32)
model.fit(x, y, batch_size=8, epochs=1, verbose=0,
          callbacks=[bf.keras.callbacks.BroadcastGlobalVariablesCallback(0), Slow(),
                     bf.keras.callbacks.JobPageCallback(every_n_steps=5, log_dir=log_dir)])
if bf.rank() == 0:
    tags = set()
    for path in glob.glob(os.path.join(log_dir, "events.*")):
        for event in tf.compat.v1.train.summary_iterator(path):
            tags.update(v.tag for v in event.summary.value)
    print("tensorboard tags: " + " ".join(sorted(tags)), flush=True)
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen()
    try:
        JobPage("127.0.0.1", busy.getsockname()[1], 0)
    except OSError as e:
        print(f"busy port refused: {e}", flush=True)
    busy.close()

grad = tf.Variable(tf.zeros([4096]))
step, stalled = 0, False
while True:
    time.sleep(0.01 + slow)
    if bf.rank() == 1 and not stalled and os.path.exists(stop_file + ".stall"):
        stalled = True
        time.sleep(3)  # rank 0 waits in 'grad': BLUEFOG_STALL_CHECK_TIME=1 warns
    flag = 1.0 if bf.rank() == 0 and os.path.exists(stop_file) else 0.0
    grad.assign(tf.fill([4096], flag))
    if bf.allreduce(grad, average=False, name="grad").numpy()[0] > 0:
        break
    bf.job_page_step()
    step += 1
print(f"rank {bf.rank()} done after {step} loop steps", flush=True)
