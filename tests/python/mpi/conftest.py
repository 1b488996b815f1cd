"""Shared set-up for the tests run under mpirun: one bluefog init per process.

Every rank runs the same tests in the same order; expected values are computed in closed form
from (rank, size, index), so a test checks real results on every rank.
"""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np
import pytest
import tensorflow as tf

# Several ranks share 2 cores: few threads per rank, or they fight for the cores. Inter-op
# parallelism stays above 1 so graph-mode tests can start independent collectives concurrently.
tf.config.threading.set_intra_op_parallelism_threads(1)
tf.config.threading.set_inter_op_parallelism_threads(4)

import bluefog.tensorflow as bf  # noqa: E402

bf.init()


@pytest.fixture
def rank() -> int:
    return bf.rank()


@pytest.fixture
def size() -> int:
    return bf.size()


def needs_ranks(n: int):
    """Skips a test on jobs with fewer than `n` ranks."""
    return pytest.mark.skipif(bf.size() < n, reason=f"needs at least {n} ranks")


def rank_values(shape, rank: int, dtype=np.float64, offset: int = 0) -> np.ndarray:
    """A rank-dependent array whose sums over ranks are known in closed form."""
    n = int(np.prod(shape)) if len(shape) else 1
    return (np.arange(n, dtype=np.float64).reshape(shape) % 7 + rank + offset).astype(dtype)


def mean_factor(size):
    """Mean over ranks of (rank + 1)."""
    return (size + 1) / 2.0


def gather_rows(vector, name=None):
    """Every rank's 1-D float64 vector, one row per rank."""
    v = tf.reshape(tf.constant(np.asarray(vector, dtype=np.float64)), [1, -1])
    return bf.allgather(v, name=name).numpy()


def neighbor_mixing_matrix(size) -> np.ndarray:
    """W[u][v]: the weight rank v gives to rank u's model when it averages itself with its
    in-neighbours of the current topology, uniformly."""
    graph = bf.load_topology()
    w = np.zeros((size, size))
    for v in range(size):
        sources = [u for u in graph.predecessors(v) if u != v] + [v]
        w[sources, v] = 1.0 / len(sources)
    return w


def flat_weights(variables):
    return np.concatenate([np.asarray(v).astype(np.float64).ravel() for v in variables])


def assert_same_on_all_ranks(variables, name=None):
    rows = gather_rows(flat_weights(variables), name=name)
    for r in range(1, rows.shape[0]):
        np.testing.assert_array_equal(rows[r], rows[0], err_msg=f"rank {r} differs from rank 0")


def win_sync():
    """A barrier for the window tests: after it, every rank's finished puts have landed."""
    bf.allreduce(tf.constant([0.0]), name="win.sync")


@pytest.fixture
def clean_windows():
    """Default topology before; afterwards push-sum off, every window freed, default topology."""
    bf.set_topology()
    yield
    bf.turn_off_win_ops_with_associated_p()
    win_sync()
    bf.win_free()
    bf.set_topology()
