"""Horovod's view of the hosts: ``cross_rank``, ``cross_size`` (``is_homogeneous`` is in
``basics``).

A host is the set of ranks that share memory (``local_rank``/``local_size`` within it). The
ranks with the same local rank, one per host, form a "cross" group, ordered by rank:
``cross_rank()`` is this rank's index in it and ``cross_size()`` its size (the number of
hosts when every host runs the same number of ranks).
"""

from __future__ import annotations

from bluefog.common.basics import _query


def cross_rank() -> int:
    """This rank's index among the ranks with its local rank (one per host)."""
    return _query("bluefog_cross_rank")


def cross_size() -> int:
    """The number of ranks with this rank's local rank: one per host that has one."""
    return _query("bluefog_cross_size")

