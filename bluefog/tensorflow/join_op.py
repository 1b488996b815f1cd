"""``bf.join()``: uneven data across ranks without a hang.

A rank that has run out of batches calls ``join()``. Until every rank has called it, that rank
keeps taking part in the collectives the others submit: allreduces with zeros, allgathers with
no rows (any other collective then fails on every rank with an error naming the joined
ranks). ``op=bf.Average`` still divides by ``size()``: the joined ranks count, contributing
zeros, as in Horovod. ``join()`` returns once every rank has joined, with the last rank to
join.
"""

from __future__ import annotations

import tensorflow as tf

from bluefog.tensorflow.op_library import name_input, ops, request_name

__all__ = ["join"]


def join() -> tf.Tensor:
    """Blocks (eagerly) until every rank has called ``join()``; returns the last rank to join
    as an int32 scalar tensor.

    Every rank must call it the same number of times (the n-th calls match each other).
    """
    return ops.bluefog_join(name_input(request_name("join", None)))
