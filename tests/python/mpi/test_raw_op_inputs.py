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
from bluefog.common import library

# The same library bluefog loaded; TensorFlow returns the already registered ops.
_raw = tf.load_op_library(os.path.join(library.library_dir(), "libbluefog_tf.so"))

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


_NUL_CASES = {
    "allreduce": lambda name: _raw.bluefog_allreduce(_X, name, average=False),
    "grouped_allreduce": lambda name: _raw.bluefog_grouped_allreduce([_X, _X], name,
                                                                     average=False),
    "allgather": lambda name: _raw.bluefog_allgather(_X, name),
    "broadcast": lambda name: _raw.bluefog_broadcast(_X, name, root_rank=0),
}


@pytest.mark.parametrize("case", sorted(_NUL_CASES))
def test_names_with_nul_are_refused(case, rank, size):
    """Names that differ only after a NUL byte must never be paired: every entry into C++
    refuses them (the kernels, the eager extension) as does the Python layer."""
    with pytest.raises(tf.errors.InvalidArgumentError) as info:
        _NUL_CASES[case](f"raw.nul.{case}\0rank{rank}")
    message = str(info.value)
    assert f"rank {rank}: bluefog " in message and "NUL" in message, message
    assert f"raw.nul.{case}\\0rank{rank}" in message, message
    with pytest.raises(ValueError, match="NUL"):
        bf.allreduce(tf.constant(_X), name=f"raw.nul.py.{case}\0{rank}")
    out = bf.allreduce(tf.constant([float(rank)]), average=False, name="raw.nul.after." + case)
    np.testing.assert_allclose(out.numpy(), [size * (size - 1) / 2])


def test_eager_extension_refuses_names_with_nul(rank, size):
    from bluefog.tensorflow import eager_calls

    with pytest.raises(tf.errors.InvalidArgumentError, match=f"rank {rank}: .*NUL"):
        eager_calls._eager.allreduce(f"raw.nul.eager\0{rank}",
                                     eager_calls._CORE_DTYPE[tf.float32.as_datatype_enum],
                                     _X.copy(), False)
    out = bf.allreduce(tf.constant([float(rank)]), average=False, name="raw.nul.eager.after")
    np.testing.assert_allclose(out.numpy(), [size * (size - 1) / 2])


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_neighbor_weights_that_are_not_finite_are_refused(bad, rank, size):
    """A NaN or infinite weight would reach every neighbour's result: refused locally, by the
    Python layer and by the kernel (weights may come as tensors)."""
    with pytest.raises(ValueError, match="finite"):
        bf.neighbor_allreduce(tf.constant(_X), self_weight=bad, src_weights={}, dst_weights=[],
                              name="raw.nan.py")
    with pytest.raises(tf.errors.InvalidArgumentError, match=f"rank {rank}: .*finite"):
        _raw.bluefog_neighbor_allreduce(_X, "raw.nan.self", _I, _I, np.float64(bad), _W, _W)
    if size > 1:
        peer = np.array([(rank + 1) % size], np.int32)
        with pytest.raises(tf.errors.InvalidArgumentError, match=f"rank {rank}: .*finite"):
            _raw.bluefog_neighbor_allreduce(_X, "raw.nan.recv", _I, peer, np.float64(0.5),
                                            np.array([bad]), _W)
    out = bf.allreduce(tf.constant([float(rank)]), average=False, name="raw.nan.after")
    np.testing.assert_allclose(out.numpy(), [size * (size - 1) / 2])
