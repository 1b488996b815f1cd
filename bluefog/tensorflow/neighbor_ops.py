"""Decentralized collectives: each rank combines its tensor only with its neighbours'.

The exchange and the weighted sum run in C++; this module turns the topology (or per-call
weights) into the send/receive lists and weights the op takes as inputs. In eager mode they may
change every call. Inside a tf.function they are fixed when the function is traced: after
``set_topology`` (or to use a new dynamic schedule step), retrace it (for Keras,
``model.train_function = None``).
"""

from __future__ import annotations

import math
import warnings
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
        weight = float(value)
    except (TypeError, ValueError):
        raise TypeError(f"{op_error_prefix('neighbor op', name)}: {what} must be a number, "
                        f"got {value!r}") from None
    if not math.isfinite(weight):
        raise ValueError(f"{op_error_prefix('neighbor op', name)}: {what} is {weight}; weights "
                         "must be finite numbers")
    return weight


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
    to each). With ``self_weight`` and ``src_weights`` but no ``dst_weights`` (Bluefog's static
    weighting), the topology's neighbours are used with these weights: ``src_weights`` may name
    in-neighbours only, and an in-neighbour it leaves out gets weight 0. Every rank must call it
    with the same name, shape and dtype; the ranks' send and receive lists must mirror each
    other, which is always checked (the check rides on the negotiation that happens anyway, so
    ``enable_topo_check`` cannot make it cheaper).
    """
    name = request_name("neighbor_allreduce", name)
    tensor = to_tensor(tensor, "neighbor_allreduce", name)
    check_dtype(tensor, "neighbor_allreduce", name)
    if src_weights is None and dst_weights is not None:
        raise ValueError(f"{op_error_prefix('neighbor_allreduce', name)}: "
                         "dst_weights needs src_weights and self_weight (a dynamic topology "
                         "needs both the sources and the destinations of this call)")
    if dst_weights is None and src_weights is not None:
        # Bluefog's meaning: the topology's neighbours, with this call's weights.
        if self_weight is None:
            raise ValueError(f"{op_error_prefix('neighbor_allreduce', name)}: self_weight must "
                             "be given with src_weights")
        if not isinstance(src_weights, dict):
            raise TypeError(f"{op_error_prefix('neighbor_allreduce', name)}: src_weights must "
                            f"be a dict {{rank: weight}}, got {type(src_weights).__name__}")
        given = _weights(src_weights, "src_weights", name)
        in_ranks = topology.in_neighbor_ranks()
        extra = sorted(set(given) - set(in_ranks))
        if extra:
            raise ValueError(
                f"{op_error_prefix('neighbor_allreduce', name)}: src_weights names ranks "
                f"{extra} that are not in-neighbours in the topology (in-neighbours: "
                f"{in_ranks}); without dst_weights the topology's neighbours are used. For a "
                "dynamic topology give dst_weights too: the ranks this rank sends to, e.g. "
                "dst_weights=bf.out_neighbor_ranks() for the topology's out-neighbours")
        send = {r: None for r in topology.out_neighbor_ranks()}
        recv = {r: given.get(r, 0.0) for r in in_ranks}
        self_weight = _weight(self_weight, "self_weight", name)
        send_weights = []
    elif src_weights is None:
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
    return neighbor_allreduce_op(tensor, name, sorted(send), sorted(recv),
                                  self_weight, [recv[r] for r in sorted(recv)], send_weights)


def _input(values, dtype):
    """A constant for Python values (cached in eager mode), the tensor itself otherwise."""
    if isinstance(values, (tf.Tensor, tf.Variable)):
        return tf.cast(values, dtype)
    return const_input(float(values) if dtype == tf.float64 and not isinstance(values, list)
                       else values, dtype)


def neighbor_allreduce_op(tensor, name, send_ranks, recv_ranks, self_weight, recv_weights,
                           send_weights):
    """The op; ranks and weights are Python values or tensors (dynamic schedules)."""
    return ops.bluefog_neighbor_allreduce(
        tensor, tensor_name=name_input(name),
        send_ranks=_input(send_ranks, tf.int32),
        recv_ranks=_input(recv_ranks, tf.int32),
        self_weight=_input(self_weight, tf.float64),
        recv_weights=_input(recv_weights, tf.float64),
        send_weights=_input(send_weights, tf.float64))


@tf.autograph.experimental.do_not_convert
def neighbor_allgather(tensor: Union[tf.Tensor, tf.Variable], src_ranks: Optional[list] = None,
                       dst_ranks: Optional[list] = None, name: Optional[str] = None,
                       enable_topo_check: bool = True) -> tf.Tensor:
    """Concatenation along dimension 0 of the in-neighbours' tensors, in ascending rank order.

    The first dimension may differ between ranks. Without ``src_ranks``/``dst_ranks`` the
    topology's in- and out-neighbours are used; given, they must be given together and mirror
    the other ranks' lists, which is always checked (``enable_topo_check``, Bluefog's
    argument, is accepted; the check rides on the negotiation, so turning it off saves nothing).
    """
    if not isinstance(enable_topo_check, bool):
        raise TypeError(f"{op_error_prefix('neighbor_allgather', name)}: enable_topo_check must "
                        f"be a bool, got {enable_topo_check!r}")
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


def _machine_list(values, what: str, name: str, machine: int, machines: int) -> list:
    prefix = op_error_prefix("hierarchical_neighbor_allreduce", name)
    out = []
    for m in values:
        if isinstance(m, bool) or not isinstance(m, int) or not 0 <= m < machines or m == machine:
            raise ValueError(f"{prefix}: {what} holds machine {m!r}, which is not another "
                             f"machine in [0, {machines}) (this rank is on machine {machine})")
        out.append(m)
    if len(set(out)) != len(out):
        raise ValueError(f"{prefix}: {what} lists a machine twice: {out}")
    return sorted(out)


@tf.autograph.experimental.do_not_convert
def hierarchical_neighbor_allreduce(
        tensor: Union[tf.Tensor, tf.Variable], self_weight: Optional[float] = None,
        src_machine_weights: Optional[Dict[int, float]] = None,
        dst_machine_weights: Optional[Union[Dict[int, float], list]] = None,
        enable_topo_check: bool = False, name: Optional[str] = None, *,
        neighbor_machine_weights: Optional[Dict[int, float]] = None,
        send_neighbor_machines: Optional[list] = None) -> tf.Tensor:
    """Machine-level neighbour averaging for multi-host jobs.

    Returns, on every rank of machine ``m``, ``self_weight * mean_m + sum(w_k * mean_k)`` over
    its in-neighbour machines ``k``, where ``mean_k`` is the mean of machine ``k``'s ranks'
    tensors. The weights and neighbours come from the machine topology
    (``set_machine_topology``; default ``ExponentialGraph(machine_size())``) or, for this call,
    from ``self_weight``, ``src_machine_weights`` ({machine: weight}) and
    ``dst_machine_weights`` (the machines to send to: a list, or a dict whose weights are all
    1.0), given together; an empty pair means
    only the mean within the machine. Every rank of a machine must pass the same machines and
    weights, and machines' lists must mirror each other.

    Each machine's mean crosses to each neighbour machine once, split over its local ranks: a
    reduce-scatter within the machine leaves local rank ``l`` with slice ``l`` of the mean, local
    rank ``l`` exchanges that slice with local rank ``l`` of the neighbour machines, and an
    allgather within the machine joins the slices. Needs a homogeneous job (``is_homogeneous``).
    ``neighbor_machine_weights`` and ``send_neighbor_machines`` are the former names of
    ``src_machine_weights`` and ``dst_machine_weights`` (accepted with a DeprecationWarning).
    """
    for old, new, value in (("neighbor_machine_weights", "src_machine_weights",
                             neighbor_machine_weights),
                            ("send_neighbor_machines", "dst_machine_weights",
                             send_neighbor_machines)):
        if value is None:
            continue
        warnings.warn(f"bluefog hierarchical_neighbor_allreduce: {old} is deprecated; call it "
                      f"{new} (Bluefog's name)", DeprecationWarning, stacklevel=3)
        if (src_machine_weights if new == "src_machine_weights" else dst_machine_weights) \
                is not None:
            raise ValueError(f"{op_error_prefix('hierarchical_neighbor_allreduce', name)}: "
                             f"{old} and {new} are one argument; give only {new}")
    if neighbor_machine_weights is not None:
        src_machine_weights = neighbor_machine_weights
    if send_neighbor_machines is not None:
        dst_machine_weights = send_neighbor_machines
    if isinstance(dst_machine_weights, dict):
        if any(float(w) != 1.0 for w in dst_machine_weights.values()):
            raise ValueError(f"{op_error_prefix('hierarchical_neighbor_allreduce', name)}: "
                             "dst_machine_weights other than 1.0 are not supported; give the "
                             "weights on the receiving side (src_machine_weights) and list the "
                             "destination machines")
        dst_machine_weights = list(dst_machine_weights)
    neighbor_machine_weights, send_neighbor_machines = src_machine_weights, dst_machine_weights
    name = request_name("hierarchical_neighbor_allreduce", name)
    tensor = to_tensor(tensor, "hierarchical_neighbor_allreduce", name)
    check_dtype(tensor, "hierarchical_neighbor_allreduce", name)
    what = op_error_prefix("hierarchical_neighbor_allreduce", name)
    try:
        machines, machine = topology.machine_size(), topology.machine_rank()
    except ValueError as e:
        raise ValueError(f"{what}: {e}") from None
    if (neighbor_machine_weights is None) != (send_neighbor_machines is None):
        raise ValueError(f"{what}: src_machine_weights and dst_machine_weights must be "
                         "given together (a dynamic machine topology needs both the sources and "
                         "the destinations of this call)")
    if neighbor_machine_weights is None:
        default_self, machine_weights = topology.machine_recv_weights()
        send_machines = topology.out_neighbor_machine_ranks()
        self_w = (default_self if self_weight is None
                  else _weight(self_weight, "self_weight", name))
    else:
        if self_weight is None:
            raise ValueError(f"{what}: self_weight must be given with src_machine_weights")
        if not isinstance(neighbor_machine_weights, dict):
            raise TypeError(f"{what}: src_machine_weights must be a dict {{machine: "
                            f"weight}}, got {type(neighbor_machine_weights).__name__}")
        self_w = _weight(self_weight, "self_weight", name)
        recv = _machine_list(neighbor_machine_weights, "src_machine_weights", name,
                             machine, machines)
        machine_weights = {m: _weight(neighbor_machine_weights[m],
                                      f"src_machine_weights[{m}]", name) for m in recv}
        send_machines = _machine_list(send_neighbor_machines, "dst_machine_weights", name,
                                      machine, machines)
    recv = sorted(machine_weights)
    return hierarchical_exchange(tensor, name, basics.local_size(), basics.local_rank(),
                                 send_machines, recv, self_w, [machine_weights[m] for m in recv])


def hierarchical_exchange(tensor, name: str, local: int, local_rank: int, send_machines,
                          recv_machines, self_weight, recv_weights) -> tf.Tensor:
    """The three exchanges of ``hierarchical_neighbor_allreduce`` for ranks placed in blocks of
    ``local``: machine lists and weights may be Python lists or (dynamic) tensors."""
    first = basics.rank() - local_rank

    def as_tensor(values, dtype):  # a Python list straight to dtype (no float32 detour)
        if isinstance(values, (tf.Tensor, tf.Variable)):
            return tf.cast(values, dtype)
        return tf.constant(values, dtype)

    def to_rank(machines):
        return as_tensor(machines, tf.int32) * local + local_rank

    send, recv = to_rank(send_machines), to_rank(recv_machines)
    if local == 1:
        return neighbor_allreduce_op(tensor, name + ".machines", send, recv, self_weight,
                                      recv_weights, [])
    shape = tf.shape(tensor)
    flat = tf.reshape(tensor, [-1])
    count = tf.size(flat, out_type=tf.int64)
    # Equal slices on every rank (the exchange between machines is one request, whose shape
    # every rank must share): pad to a multiple of `local` with zeros, cut them off at the end
    # (two copies of the tensor, skipped when its size is known to divide).
    part = (count + local - 1) // local
    static = tensor.shape.num_elements()
    padded = static is None or static % local != 0
    if padded:
        flat = tf.concat([flat, tf.zeros([part * local - count], flat.dtype)], axis=0)
    lo, hi = part * local_rank, part * (local_rank + 1)
    peers = [first + j for j in range(local) if j != local_rank]
    # Reduce-scatter within the machine: local rank j receives slice j from every peer (the
    # blocks of `others` are the peers' slices, in the peers' ascending order).
    others = tf.concat([flat[:lo], flat[hi:]], axis=0)
    summed = ops.bluefog_neighbor_allgather_grad(
        others, tensor_name=name_input(name + ".local"), send_ranks=const_input(peers, tf.int32),
        recv_ranks=const_input(peers, tf.int32), first_dim=hi - lo)
    machine_sum = summed + flat[lo:hi]
    # The machine mean is the sum / local: folded into the weights of the exchange between
    # machines (every received slice is a machine's sum too).
    scale = 1.0 / local
    mixed = neighbor_allreduce_op(
        machine_sum, name + ".machines", send, recv,
        as_tensor(self_weight, tf.float64) * scale, as_tensor(recv_weights, tf.float64) * scale,
        [])
    gathered = ops.bluefog_neighbor_allgather(
        mixed, tensor_name=name_input(name + ".gather"), send_ranks=const_input(peers, tf.int32),
        recv_ranks=const_input(peers, tf.int32))
    joined = tf.concat([gathered[:lo], mixed, gathered[lo:]], axis=0)
    return tf.reshape(joined[:count] if padded else joined, shape)


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


@tf.RegisterGradient("BluefogNeighborAllgatherGrad")
def _neighbor_allgather_grad_grad(op, grad):
    """Block k of the input went to send_ranks[k]: its gradient is that rank's upstream gradient,
    fetched by a neighbor_allgather over the transposed edges (in send_ranks' order)."""
    _, _, send_ranks, recv_ranks, _ = op.inputs
    base = forward_name(op, index=1)
    back = ops.bluefog_neighbor_allgather(
        tf.convert_to_tensor(grad), tensor_name=base or request_name("neighbor_allgather", None),
        send_ranks=recv_ranks, recv_ranks=send_ranks)
    return [back, None, None, None, None]


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
