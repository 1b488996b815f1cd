"""Horovod's ``rank_op()``, ``size_op()``, ``local_rank_op()``, ``local_size_op()``: the
process layout as int32 tensors, for graphs that compute with it.

The values are fixed once ``bf.init()`` has run, so each op is a constant of the current value;
calling one before ``init()`` raises the same ValueError as ``bf.rank()``.
"""

from __future__ import annotations

from typing import Optional

import tensorflow as tf

from bluefog.common import basics

__all__ = ["rank_op", "size_op", "local_rank_op", "local_size_op"]


def rank_op(name: Optional[str] = None) -> tf.Tensor:
    """This process's rank, as an int32 tensor."""
    return tf.constant(basics.rank(), tf.int32, name=name or "bluefog_rank")


def size_op(name: Optional[str] = None) -> tf.Tensor:
    """The number of processes, as an int32 tensor."""
    return tf.constant(basics.size(), tf.int32, name=name or "bluefog_size")


def local_rank_op(name: Optional[str] = None) -> tf.Tensor:
    """This process's rank on its host, as an int32 tensor."""
    return tf.constant(basics.local_rank(), tf.int32, name=name or "bluefog_local_rank")


def local_size_op(name: Optional[str] = None) -> tf.Tensor:
    """The number of processes on this host, as an int32 tensor."""
    return tf.constant(basics.local_size(), tf.int32, name=name or "bluefog_local_size")
