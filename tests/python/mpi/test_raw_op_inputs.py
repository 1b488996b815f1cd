"""The registered ops called directly with wrongly shaped side inputs (name, ranks, weights).

Reading such an input as a scalar used to trip a TensorFlow CHECK that aborted the process. Now
the shape functions refuse them when a graph is built, and the kernels refuse them in eager
mode, each with an error naming the rank, the op and the input; the runtime stays usable.
"""

import os

import numpy as np
import pytest
import tensorflow as tf

import bluefog.tensorflow as bf
from bluefog.common import basics

# The same library bluefog loaded; TensorFlow returns the already registered ops.
_raw = tf.load_op_library(os.path.join(basics.library_dir(), "libbluefog_tf.so"))

# numpy values, so that each call makes its constants in the current graph or eagerly.
_NAMES = np.array([b"a", b"b"])
_X = np.array([1.0, 2.0], np.float32)
_I = np.zeros([0], np.int32)
_W = np.zeros([0], np.float64)

_CASES = {
    "allreduce_name": (lambda: _raw.bluefog_allreduce(_X, _NAMES, average=False),
                       "tensor_name input must be a scalar"),
    "grouped_name": (lambda: _raw.bluefog_grouped_allreduce([_X, _X], _NAMES, average=False),
                     "tensor_name input must be a scalar"),
    "allgather_name": (lambda: _raw.bluefog_allgather(_X, _NAMES),
                       "tensor_name input must be a scalar"),
    "broadcast_name": (lambda: _raw.bluefog_broadcast(_X, _NAMES, root_rank=0),
                       "tensor_name input must be a scalar"),
    "neighbor_self_weight": (
        lambda: _raw.bluefog_neighbor_allreduce(_X, "raw.nsw", _I, _I,
                                                np.array([1.0, 1.0]), _W, _W),
        "self_weight input must be a scalar"),
    "neighbor_ranks": (
        lambda: _raw.bluefog_neighbor_allreduce(_X, "raw.nr", np.zeros([1, 1], np.int32), _I,
                                                np.float64(1.0), _W, _W),
        "send_ranks input must be a vector"),
    "neighbor_allgather_name": (lambda: _raw.bluefog_neighbor_allgather(_X, _NAMES, _I, _I),
                                "tensor_name input must be a scalar"),
    "allgather_grad_first_dim": (
        lambda: _raw.bluefog_neighbor_allgather_grad(_X, "raw.g", _I, _I,
                                                     np.array([2], np.int64)),
        "first_dim input must be a scalar"),
}


@pytest.mark.parametrize("case", sorted(_CASES))
def test_eager_kernel_refuses(case, rank, size):
    call, words = _CASES[case]
    with pytest.raises(tf.errors.InvalidArgumentError) as info:
        call()
    message = str(info.value)
    assert words in message
    assert f"rank {rank}: bluefog " in message
    out = bf.allreduce(tf.constant([float(rank)]), average=False, name="raw.after." + case)
    np.testing.assert_allclose(out.numpy(), [size * (size - 1) / 2])


@pytest.mark.parametrize("case", sorted(_CASES))
def test_graph_construction_refuses(case):
    call, _ = _CASES[case]
    with tf.Graph().as_default():
        with pytest.raises(ValueError, match="must be rank"):
            call()
