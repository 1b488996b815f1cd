"""BLUEFOG_DETERMINISTIC=1: every floating-point allreduce sums each element in rank order,
((x0 + x1) + x2) / n rounded in the tensor's dtype at each step (16-bit floats: x0/n + x1/n +
x2/n), whatever the path, the fusion or the backend. Inputs spanning many magnitudes make any
other order round differently, so the expectation (computed on each rank from the allgathered
inputs, exactly) fails a reordering: without the setting, 47 of 200 float64 sums differ at 3
ranks on MPI. The Gloo job runs nightly.
"""

import textwrap

import pytest

from gloo_jobs import gloo_built, run_gloo_job
from mpi_jobs import PYTHON, have_mpirun, mpirun_prefix, run_job

SCRIPT = textwrap.dedent("""
    import numpy as np
    import tensorflow as tf
    tf.config.threading.set_intra_op_parallelism_threads(1)
    import bluefog.tensorflow as bf

    bf.init()
    n, me = bf.size(), bf.rank()
    rng = np.random.default_rng(1234 + me)
    checked = 0
    for step, count in enumerate([5, 200, 70001]):  # inline, small, fused or ring-sized
        for dtype in (tf.float16, tf.bfloat16, tf.float32, tf.float64):
            x = rng.standard_normal(count) * 10.0 ** rng.integers(-4, 5, count)
            x = tf.cast(tf.constant(x), dtype)
            everyone = bf.allgather(tf.reshape(x, [1, -1]), name=f"in.{step}.{dtype.name}")
            for average in (False, True):
                # 16-bit floats average as the sum of each rank's x / n (no overflow on the way).
                part = [everyone[r] / tf.cast(n, dtype) if average and dtype.size == 2
                        else everyone[r] for r in range(n)]
                want = part[0]
                for r in range(1, n):
                    want = want + part[r]
                if average and dtype.size > 2:
                    want = want / tf.cast(n, dtype)
                names = [f"d.{step}.{dtype.name}.{average}.{k}" for k in range(3)]
                got = bf.grouped_allreduce([x, x, x], average=average, name=names[0])
                got.append(bf.allreduce(x, average=average, name=names[1]))
                for g in got:
                    same = tf.bitcast(g, tf.uint16 if dtype.size == 2 else
                                      tf.uint32 if dtype.size == 4 else tf.uint64)
                    expect = tf.bitcast(want, same.dtype)
                    bad = int(tf.reduce_sum(tf.cast(same != expect, tf.int32)))
                    assert bad == 0, (me, count, dtype.name, average, bad)
                    checked += 1
    print(f"rank {me}: {checked} results bitwise in rank order", flush=True)
""")


def _check(result, np_):
    assert not result.timed_out, result.output[-3000:]
    assert result.returncode == 0, result.output[-3000:]
    assert result.output.count("results bitwise in rank order") == np_, result.output[-3000:]


@pytest.mark.skipif(not have_mpirun(), reason="mpirun not installed")
def test_mpi_three_ranks_default_paths():
    _check(run_job(mpirun_prefix(3) + [PYTHON, "-c", SCRIPT], timeout=240,
                   env={"BLUEFOG_DETERMINISTIC": "1", "TF_CPP_MIN_LOG_LEVEL": "3"}), 3)


@pytest.mark.nightly
@pytest.mark.skipif(not gloo_built(), reason="bluefog built without Gloo")
def test_gloo_three_ranks_forced_gloo_ring_without_fusion():
    _check(run_gloo_job([PYTHON, "-c", SCRIPT], np_=3, timeout=240,
                        env={"BLUEFOG_DETERMINISTIC": "1", "BLUEFOG_ALLREDUCE_ALGORITHM": "gloo",
                             "BLUEFOG_FUSION_THRESHOLD": "0", "TF_CPP_MIN_LOG_LEVEL": "3"}), 3)
