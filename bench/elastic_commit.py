"""What a ``commit()`` costs: copying the state to memory, plus writing it to the host's disk
(under an elastic bfrun), for states of growing size. One process per run is enough: the only
communication is the one-integer allreduce of the host-update check.

    .venv/bin/python bench/elastic_commit.py [--sizes-mib 1 16 64 256] [--reps 5]

Prints the median time of commit() in memory only and with the commit file, per state size.
"""

import argparse
import os
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np
import tensorflow as tf

import bluefog.tensorflow as bf
from bluefog.common import elastic_env


def median_commit(state, reps):
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        state.commit()
        times.append(time.perf_counter() - start)
    return float(np.median(times))


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes-mib", type=int, nargs="+", default=[1, 16, 64, 256])
    p.add_argument("--reps", type=int, default=5)
    args = p.parse_args()
    bf.init()
    print("| state (float32) | commit, memory only | commit, memory + file | file MiB/s |")
    print("|---|---|---|---|")
    with tempfile.TemporaryDirectory() as folder:
        for mib in args.sizes_mib:
            n = mib * 1024 * 1024 // 4 // 8
            variables = [tf.Variable(tf.random.uniform([n])) for _ in range(8)]
            os.environ.pop(elastic_env.ENV_STATE_DIR, None)
            memory = median_commit(bf.elastic.TensorFlowState(variables, step=0), args.reps)
            os.environ[elastic_env.ENV_STATE_DIR] = folder
            disk = median_commit(bf.elastic.TensorFlowState(variables, step=0), args.reps)
            rate = mib / max(disk - memory, 1e-9)
            print(f"| {mib} MiB | {memory * 1e3:.1f} ms | {disk * 1e3:.1f} ms | {rate:.0f} |")


if __name__ == "__main__":
    main()
