"""The gradients of allreduce, grouped_allreduce, allgather and broadcast.

Registered with TensorFlow when this module is imported (``bluefog.tensorflow`` does). A
gradient is itself a collective, named after its forward op so that every rank's backward pass
agrees on it; allgather's and broadcast's gradients are sums over the ranks.
"""

from __future__ import annotations

from typing import Optional

import tensorflow as tf

from bluefog.common import basics
from bluefog.common.process_sets import process_set_by_id
from bluefog.tensorflow.mpi_ops import Max, Min, allgather, allreduce, grouped_allreduce
from bluefog.tensorflow.op_library import forward_name, set_rank


def _reduce_op_attr(op) -> str:
    value = op.get_attr("reduce_op")
    return value.decode() if isinstance(value, bytes) else value


def _extremum_or_product_grad(x, y, grad, reduce_op: str, base: Optional[str],
                              process_set=None):
    """d(sum over ranks of loss_r)/dx for y = min/max/product over ranks of x.

    min, max: the summed upstream gradient goes to the ranks whose x equals the result, split
    evenly between ties. product: it is multiplied by the product of the other ranks' x,
    computed from every rank's x (so zeros are handled exactly).
    """
    def sub(suffix):
        return None if base is None else base + suffix

    summed = allreduce(grad, average=False, name=sub(""), process_set=process_set)
    if reduce_op in (Min, Max):
        hit = tf.cast(tf.equal(x, y), grad.dtype)
        ties = allreduce(hit, average=False, name=sub(".ties"), process_set=process_set)
        return summed * hit / tf.maximum(ties, tf.ones_like(ties))
    everyone = allgather(tf.expand_dims(x, 0), name=sub(".inputs"),
                         process_set=process_set)  # [size, ...]
    before = tf.math.cumprod(everyone, axis=0, exclusive=True)
    after = tf.math.cumprod(everyone, axis=0, exclusive=True, reverse=True)
    others = (before * after)[set_rank(process_set)]
    return summed * tf.cast(others, grad.dtype)


def _scale_of(op) -> dict:
    """The forward op's scale factors, for its gradient (the same linear map)."""
    return {"prescale_factor": op.get_attr("prescale_factor"),
            "postscale_factor": op.get_attr("postscale_factor")}


def _grad_set(op):
    """The process set the forward op ran on (None: every rank), for its gradient."""
    set_id = op.get_attr("process_set_id")
    return None if set_id == 0 else process_set_by_id(set_id)


@tf.RegisterGradient("BluefogAllreduce")
def _allreduce_grad(op, grad):
    """The gradient of a sum over ranks is the sum of the upstream gradients over ranks."""
    reduce_op = _reduce_op_attr(op)
    if reduce_op == "sum":
        return [allreduce(grad, average=op.get_attr("average"), name=forward_name(op),
                          process_set=_grad_set(op), **_scale_of(op)), None]
    return [_extremum_or_product_grad(op.inputs[0], op.outputs[0], grad, reduce_op,
                                      forward_name(op), _grad_set(op)), None]


@tf.RegisterGradient("BluefogGroupedAllreduce")
def _grouped_allreduce_grad(op, *grads):
    base = forward_name(op)
    reduce_op = _reduce_op_attr(op)
    if reduce_op == "sum":
        reduced = grouped_allreduce(list(grads), average=op.get_attr("average"), name=base,
                                    process_set=_grad_set(op), **_scale_of(op))
        return reduced + [None]
    return [None if g is None else
            _extremum_or_product_grad(op.inputs[i], op.outputs[i], tf.convert_to_tensor(g),
                                      reduce_op, None if base is None else f"{base}.{i}",
                                      _grad_set(op))
            for i, g in enumerate(grads)] + [None]


@tf.RegisterGradient("BluefogAllgather")
def _allgather_grad(op, grad):
    """Each rank's input receives its own slice of the upstream gradient summed over ranks."""
    base = forward_name(op)
    process_set = _grad_set(op)
    summed = allreduce(grad, average=False, name=base, process_set=process_set)
    first_dims = allgather(tf.shape(op.inputs[0], out_type=tf.int64)[:1],
                           name=None if base is None else base + ".dims",
                           process_set=process_set)
    me = set_rank(process_set)
    start = tf.reduce_sum(first_dims[:me])
    return [summed[start:start + first_dims[me]], None]


@tf.RegisterGradient("BluefogBroadcast")
def _broadcast_grad(op, grad):
    """Only the root's input influences the result: it receives the summed gradient."""
    summed = allreduce(grad, average=False, name=forward_name(op), process_set=_grad_set(op))
    if basics.rank() == op.get_attr("root_rank"):
        return [summed, None]
    # The zeros must wait for the allreduce, or graphs would prune it on non-root ranks and the
    # root would wait forever.
    with tf.control_dependencies([summed]):
        return [tf.zeros_like(summed), None]
