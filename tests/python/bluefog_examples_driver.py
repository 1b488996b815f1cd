"""Runs several of examples/bluefog/ in one process of an MPI job, one after the other.

    mpirun -np 4 python tests/python/bluefog_examples_driver.py OUT_DIR \
        "average_consensus.py" "optimization.py --method push_diging" ...

Each argument after OUT_DIR is a script of examples/bluefog/ with its command line; what the
k-th prints on rank r goes to OUT_DIR/r.k.txt (ranks' lines interleave on a shared stdout), with
the seconds it took on the last line. Starting TensorFlow and bluefog once per job instead of
once per example keeps tests/python/test_bluefog_examples.py short: the examples call
``bf.init()``, which does nothing when bluefog is already running, and set their own topology.
"""

import contextlib
import io
import os
import runpy
import shlex
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

EXAMPLES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples",
                        "bluefog")


def main(out_dir, runs):
    import tensorflow as tf

    import bluefog.tensorflow as bf
    from bluefog.common import topology_util

    # Four ranks share a few cores.
    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(2)
    bf.init()
    for k, run in enumerate(runs):
        argv = shlex.split(run)
        # Each example starts from bluefog's default topology, as in a fresh job.
        bf.set_topology(topology_util.ExponentialGraph(bf.size()))
        start = time.perf_counter()
        sys.argv = [os.path.join(EXAMPLES, argv[0])] + argv[1:]
        captured = io.StringIO()
        try:
            with contextlib.redirect_stdout(captured):
                runpy.run_path(sys.argv[0], run_name="__main__")
        finally:
            captured.write(f"seconds: {time.perf_counter() - start:.1f}\n")
            with open(os.path.join(out_dir, f"{bf.rank()}.{k}.txt"), "w") as f:
                f.write(captured.getvalue())
        # What a finished job would release: windows the example left (push-DIGing keeps its
        # own), before the next one sets its topology.
        bf.barrier()
        bf.win_free()
    bf.barrier()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
