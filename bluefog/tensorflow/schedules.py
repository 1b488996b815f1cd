"""Dynamic schedules of the decentralized optimizers: an iterator of ``(send, recv)`` lists,
one pair per communication (such as ``topology_util.GetDynamicOnePeerSendRecvRanks``), advanced
in Python, also inside a traced step (through ``tf.py_function``)."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import tensorflow as tf

from bluefog.common import basics, topology


def schedule_step(schedule: Iterator, communication_type: str, what: str) -> tuple:
    """The next ``(send, recv, self_weight, recv_weights)`` of ``schedule``, checked; uniform
    weights over this rank (machine) and its receive list."""
    machines = communication_type == "hierarchical_neighbor_allreduce"
    unit = "machine" if machines else "rank"
    me, count = ((topology.machine_rank(), topology.machine_size()) if machines
                 else (basics.rank(), basics.size()))
    try:
        step = next(schedule)
    except StopIteration:
        raise ValueError(f"rank {basics.rank()}: bluefog {what}: the schedule is exhausted; pass "
                         "an endless iterator (topology_util's Get*SendRecv* generators are)") \
            from None
    try:
        send, recv = (list(x) for x in step)
    except (TypeError, ValueError):
        raise ValueError(f"rank {basics.rank()}: bluefog {what}: the schedule must yield "
                         f"(send_{unit}s, recv_{unit}s) pairs of lists, got {step!r}") from None
    for label, values in (("send", send), ("recv", recv)):
        for x in values:
            if (isinstance(x, (bool, np.bool_)) or not isinstance(x, (int, np.integer))
                    or not 0 <= x < count or x == me):
                raise ValueError(
                    f"rank {basics.rank()}: bluefog {what}: the schedule's {label} list holds "
                    f"{x!r}, which is not another {unit} in [0, {count}) (this {unit} is {me}); "
                    + ("machine-level schedules such as GetExp2DynamicSendRecvMachineRanks "
                       "yield machines" if machines else "it must yield ranks"))
        if len(set(values)) != len(values):
            raise ValueError(f"rank {basics.rank()}: bluefog {what}: the schedule's {label} "
                             f"list names a {unit} twice: {values}")
    w = 1.0 / (len(recv) + 1)
    return sorted(int(x) for x in send), sorted(int(x) for x in recv), w, [w] * len(recv)


def scheduled_peers(schedule: Iterator, communication_type: str, what: str) -> tuple:
    """This communication's peers and weights: Python values in eager mode, tensors fed by a
    py_function (advanced once per run of the traced step) in a graph."""
    if tf.executing_eagerly():
        return schedule_step(schedule, communication_type, what)

    def fetch():
        send, recv, w, ws = schedule_step(schedule, communication_type, what)
        return (np.array(send, np.int32), np.array(recv, np.int32), np.float64(w),
                np.array(ws, np.float64))

    send, recv, w, ws = tf.py_function(fetch, [], [tf.int32, tf.int32, tf.float64, tf.float64])
    for t in (send, recv, ws):
        t.set_shape([None])
    w.set_shape([])
    return send, recv, w, ws
