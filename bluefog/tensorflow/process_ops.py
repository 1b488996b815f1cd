"""Horovod's ``rank_op()``, ``size_op()``, ``local_rank_op()``, ``local_size_op()``: the
process layout as int32 tensors, for graphs that compute with it.

The values are fixed once ``bf.init()`` has run, so each op is a constant of the current value;
calling one before ``init()`` raises the same ValueError as ``bf.rank()``.
"""

from __future__ import annotations

import ctypes
from typing import List, Optional

import tensorflow as tf

from bluefog.common import basics, library

__all__ = ["rank_op", "size_op", "local_rank_op", "local_size_op", "process_set_included_op"]


def rank_op(name: Optional[str] = None) -> tf.Tensor:
    """This process's rank, as an int32 tensor."""
    return tf.constant(basics.rank(), tf.int32, name=name or "bluefog_rank")


def size_op(name: Optional[str] = None, process_set_id: int = 0) -> tf.Tensor:
    """The number of processes, as an int32 tensor; with ``process_set_id`` (Horovod's), the
    size of that registered process set (-1 on a rank outside it, as Horovod)."""
    if process_set_id == 0:
        return tf.constant(basics.size(), tf.int32, name=name or "bluefog_size")
    _check_set_id(process_set_id, "size_op")
    return tf.constant(library.load().bluefog_process_set_size(process_set_id), tf.int32,
                       name=name or "bluefog_process_set_size")


def _process_set_ranks(set_id: int) -> List[int]:
    """The set's job-wide ranks; empty when there is no such set (or not initialized)."""
    lib = library.load()
    n = lib.bluefog_process_set_ranks(set_id, None, 0)
    if n <= 0:
        return []
    out = (ctypes.c_int * n)()
    lib.bluefog_process_set_ranks(set_id, out, n)
    return list(out)


def _check_set_id(process_set_id, op: str) -> None:
    basics.size()  # raises the not-initialized error first
    if isinstance(process_set_id, bool) or not isinstance(process_set_id, int) or \
            not _process_set_ranks(process_set_id):
        raise ValueError(f"rank {basics.rank()}: bluefog {op}: process_set_id "
                         f"{process_set_id!r} is not a registered process set; pass "
                         f"process_set.process_set_id of one added with bf.add_process_set")


def process_set_included_op(process_set_id: int = 0, name: Optional[str] = None) -> tf.Tensor:
    """Horovod's: 1 (int32) when this rank belongs to the registered process set
    ``process_set_id`` (0: every rank), else 0."""
    if process_set_id == 0:
        basics.size()
        return tf.constant(1, tf.int32, name=name or "bluefog_process_set_included")
    _check_set_id(process_set_id, "process_set_included_op")
    included = basics.rank() in _process_set_ranks(process_set_id)
    return tf.constant(int(included), tf.int32, name=name or "bluefog_process_set_included")


def local_rank_op(name: Optional[str] = None) -> tf.Tensor:
    """This process's rank on its host, as an int32 tensor."""
    return tf.constant(basics.local_rank(), tf.int32, name=name or "bluefog_local_rank")


def local_size_op(name: Optional[str] = None) -> tf.Tensor:
    """The number of processes on this host, as an int32 tensor."""
    return tf.constant(basics.local_size(), tf.int32, name=name or "bluefog_local_size")
