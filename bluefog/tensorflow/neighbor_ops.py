"""Decentralized collectives: each rank combines its tensor only with its neighbours'.

The exchange and the weighted sum run in C++; this module turns the topology (or per-call
weights) into the send/receive lists and weights the op takes as inputs. In eager mode they may
change every call. Inside a tf.function they are fixed when the function is traced: after
``set_topology`` (or to use a new dynamic schedule step), retrace it (for Keras,
``model.train_function = None``).
"""

from __future__ import annotations

from typing import Dict, Iterable, Optional, Union

import tensorflow as tf

from bluefog.common import basics, topology
from bluefog.tensorflow.op_library import const_input, forward_name, name_input, ops, request_name
from bluefog.tensorflow.op_rules import check_dtype, op_error_prefix, to_tensor


def _ranks(values: Iterable, what: str, name: str) -> list:
    out = []
    for r in values:
        if isinstance(r, bool) or not isinstance(r, int):
            raise TypeError(f"{op_error_prefix('neighbor op', name)}: {what} must hold int "
                            f"ranks, got {r!r}")
        if not 0 <= r < basics.size() or r == basics.rank():
            raise ValueError(f"{op_error_prefix('neighbor op', name)}: {what} holds rank {r}, "
                             f"which is not another rank in [0, {basics.size()})")
        out.append(r)
    if len(set(out)) != len(out):
        raise ValueError(f"{op_error_prefix('neighbor op', name)}: {what} lists a rank "
                         f"twice: {out}")
    return sorted(out)


def _weight(value, what: str, name: str) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        raise TypeError(f"{op_error_prefix('neighbor op', name)}: {what} must be a number, "
                        f"got {value!r}") from None


def _weights(mapping, what: str, name: str) -> Dict[int, float]:
    if isinstance(mapping, dict):
        ranks = _ranks(mapping.keys(), what, name)
        return {r: _weight(mapping[r], f"{what}[{r}]", name) for r in ranks}
    if isinstance(mapping, (list, tuple)):
        return {r: 1.0 for r in _ranks(mapping, what, name)}
    raise TypeError(f"{op_error_prefix('neighbor_allreduce', name)}: {what} must be a dict "
                    f"{{rank: weight}} or a list of ranks, got {type(mapping).__name__}")


# Plain Python over static arguments: AutoGraph has nothing to convert (and fails on
# topology_util's walrus operator, warning on every trace).
@tf.autograph.experimental.do_not_convert
def neighbor_allreduce(tensor: Union[tf.Tensor, tf.Variable], self_weight: Optional[float] = None,
                       src_weights: Optional[Dict[int, float]] = None,
                       dst_weights: Optional[Union[Dict[int, float], list]] = None,
                       enable_topo_check: bool = True, name: Optional[str] = None) -> tf.Tensor:
    """Weighted combination of this rank's tensor with its in-neighbours' tensors.

    Returns ``self_weight * tensor + sum(src_weights[j] * tensor_j)``. Without weights, the
    topology decides: its edge weights when ``set_topology(..., is_weighted=True)``, otherwise
    the uniform mean over this rank and its in-neighbours. With ``src_weights`` (and
    ``self_weight``) and ``dst_weights`` given, this call uses those neighbours instead
    (dynamic topology): ``dst_weights`` lists the ranks to send to (a dict scales what is sent
    to each). Every rank must call it with the same name, shape and dtype; the ranks' send and
    receive lists must mirror each other, which is always checked (the check rides on the
    negotiation that happens anyway, so ``enable_topo_check`` cannot make it cheaper).
    """
    name = request_name("neighbor_allreduce", name)
    tensor = to_tensor(tensor, "neighbor_allreduce", name)
    check_dtype(tensor, "neighbor_allreduce", name)
    if (src_weights is None) != (dst_weights is None):
        raise ValueError(f"{op_error_prefix('neighbor_allreduce', name)}: "
                         "src_weights and dst_weights must be given together (a dynamic "
                         "topology needs both the sources and the destinations of this call)")
    if src_weights is None:
        default_self, recv = topology.recv_weights()
        send = {r: None for r in topology.out_neighbor_ranks()}
        self_weight = (default_self if self_weight is None
                       else _weight(self_weight, "self_weight", name))
        send_weights: list = []
    else:
        if self_weight is None:
            raise ValueError(f"{op_error_prefix('neighbor_allreduce', name)}: self_weight must "
                             "be given with src_weights")
        recv = _weights(src_weights, "src_weights", name)
        send = _weights(dst_weights, "dst_weights", name)
        self_weight = _weight(self_weight, "self_weight", name)
        send_weights = ([send[r] for r in sorted(send)] if isinstance(dst_weights, dict) else [])
    return _neighbor_allreduce_op(tensor, name, sorted(send), sorted(recv),
                                  self_weight, [recv[r] for r in sorted(recv)], send_weights)


def _neighbor_allreduce_op(tensor, name, send_ranks, recv_ranks, self_weight, recv_weights,
                           send_weights):
    return ops.bluefog_neighbor_allreduce(
        tensor, tensor_name=name_input(name),
        send_ranks=const_input(send_ranks, tf.int32),
        recv_ranks=const_input(recv_ranks, tf.int32),
        self_weight=const_input(float(self_weight), tf.float64),
        recv_weights=const_input(recv_weights, tf.float64),
        send_weights=const_input(send_weights, tf.float64))


@tf.autograph.experimental.do_not_convert
def neighbor_allgather(tensor: Union[tf.Tensor, tf.Variable], src_ranks: Optional[list] = None,
                       dst_ranks: Optional[list] = None, name: Optional[str] = None) -> tf.Tensor:
    """Concatenation along dimension 0 of the in-neighbours' tensors, in ascending rank order.

    The first dimension may differ between ranks. Without ``src_ranks``/``dst_ranks`` the
    topology's in- and out-neighbours are used; given, they must be given together and mirror
    the other ranks' lists.
    """
    name = request_name("neighbor_allgather", name)
    tensor = to_tensor(tensor, "neighbor_allgather", name)
    check_dtype(tensor, "neighbor_allgather", name)
    if tensor.shape.rank == 0:
        raise ValueError(f"{op_error_prefix('neighbor_allgather', name)}: "
                         "needs a tensor of rank >= 1; reshape the scalar to [1] first")
    if (src_ranks is None) != (dst_ranks is None):
        raise ValueError(f"{op_error_prefix('neighbor_allgather', name)}: "
                         "src_ranks and dst_ranks must be given together")
    if src_ranks is None:
        recv, send = topology.in_neighbor_ranks(), topology.out_neighbor_ranks()
    else:
        recv = _ranks(src_ranks, "src_ranks", name)
        send = _ranks(dst_ranks, "dst_ranks", name)
    return ops.bluefog_neighbor_allgather(
        tensor, tensor_name=name_input(name), send_ranks=const_input(send, tf.int32),
        recv_ranks=const_input(recv, tf.int32))


@tf.autograph.experimental.do_not_convert
def hierarchical_neighbor_allreduce(
        tensor: Union[tf.Tensor, tf.Variable], self_weight: Optional[float] = None,
        neighbor_machine_weights: Optional[Dict[int, float]] = None,
        send_neighbor_machines: Optional[list] = None, enable_topo_check: bool = False,
        name: Optional[str] = None) -> tf.Tensor:
    """Machine-level neighbour averaging for multi-host jobs.

    First the ranks of each machine average their tensors, then each machine combines that mean
    with its in-neighbour machines' means, following the machine topology
    (``set_machine_topology``; default ``ExponentialGraph(number of machines)``) or, when given,
    ``self_weight`` / ``neighbor_machine_weights`` (machine -> weight) and
    ``send_neighbor_machines`` for this call. Every rank of a machine gets the same result.
    Ranks must be placed on machines in contiguous blocks of ``local_size()`` (mpirun's default).
    """
    name = request_name("hierarchical_neighbor_allreduce", name)
    tensor = to_tensor(tensor, "hierarchical_neighbor_allreduce", name)
    check_dtype(tensor, "hierarchical_neighbor_allreduce", name)
    me, local, local_rank = basics.rank(), basics.local_size(), basics.local_rank()
    machine, first = topology.machine_of(me), me - local_rank
    local_peers = [r for r in range(first, first + local) if r != me]
    what = op_error_prefix("hierarchical_neighbor_allreduce", name)
    mean = _neighbor_allreduce_op(tensor, name + ".local", local_peers, local_peers,
                                  1.0 / local, [1.0 / local] * len(local_peers), [])
    if (neighbor_machine_weights is None) != (send_neighbor_machines is None):
        raise ValueError(f"{what}: neighbor_machine_weights and send_neighbor_machines must be "
                         "given together")
    if neighbor_machine_weights is None:
        self_w, machine_weights = topology.machine_recv_weights()
        send_machines = topology.out_neighbor_machines()
    else:
        if self_weight is None:
            raise ValueError(f"{what}: self_weight must be given with neighbor_machine_weights")
        self_w, machine_weights = float(self_weight), dict(neighbor_machine_weights)
        send_machines = list(send_neighbor_machines)
    for m in list(machine_weights) + list(send_machines):
        if not isinstance(m, int) or not 0 <= m < topology.num_machines() or m == machine:
            raise ValueError(f"{what}: machine {m!r} is not another machine in "
                             f"[0, {topology.num_machines()})")
    # The same local rank on each neighbour machine carries that machine's mean.
    recv = sorted(machine_weights)
    return _neighbor_allreduce_op(mean, name + ".machines",
                                  sorted(m * local + local_rank for m in send_machines),
                                  [m * local + local_rank for m in recv], self_w,
                                  [float(machine_weights[m]) for m in recv], [])


@tf.RegisterGradient("BluefogNeighborAllreduce")
def _neighbor_allreduce_grad(op, grad):
    """The transpose exchange: what was received with weight w is sent back scaled by w."""
    send_ranks, recv_ranks, self_weight, recv_weights, send_weights = op.inputs[2:7]
    # The forward request's name is input 1 (the last input is send_weights here).
    base = forward_name(op, index=1)
    back = ops.bluefog_neighbor_allreduce(
        grad, tensor_name=base or request_name("neighbor_allreduce", None),
        send_ranks=recv_ranks, recv_ranks=send_ranks, self_weight=self_weight,
        send_weights=recv_weights,
        recv_weights=tf.cond(tf.size(send_weights) > 0, lambda: send_weights,
                             lambda: tf.ones(tf.shape(send_ranks), tf.float64)))
    return [back, None, None, None, None, None, None]


@tf.RegisterGradient("BluefogNeighborAllgather")
def _neighbor_allgather_grad(op, grad):
    """Each in-neighbour's slice of the upstream gradient goes back to it; every rank sums the
    slices its out-neighbours send back."""
    tensor, _, send_ranks, recv_ranks = op.inputs
    base = forward_name(op, index=1)
    back = ops.bluefog_neighbor_allgather_grad(
        tf.convert_to_tensor(grad),
        tensor_name=base or request_name("neighbor_allgather.grad", None),
        send_ranks=recv_ranks, recv_ranks=send_ranks,
        first_dim=tf.shape(tensor, out_type=tf.int64)[0])
    return [back, None, None, None]
