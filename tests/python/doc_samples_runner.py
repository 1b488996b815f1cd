"""Runs the documentation's code samples (docs/samples/*.py) one after another in this process.

Started by test_doc_samples.py under `mpirun -np 2`: one TensorFlow import for every sample
instead of one per sample. Each sample runs as `__main__` (as `python sample.py` would) and ends
with its own checks; `bf.init()` is a no-op after the first sample's.
"""

import os
import runpy
import sys

import tensorflow as tf

tf.config.threading.set_intra_op_parallelism_threads(1)
tf.config.threading.set_inter_op_parallelism_threads(1)

for path in sys.argv[1:]:
    runpy.run_path(path, run_name="__main__")
    sys.stdout.flush()
print(f"all {len(sys.argv) - 1} samples ran on pid {os.getpid()}")
