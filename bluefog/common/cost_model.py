"""A cost model for choosing between allreduce and decentralized averaging.

Two link classes, each with a latency and a bandwidth measured by a short calibration run
(``python -m bluefog.tensorflow.calibrate`` under ``bfrun``):

* within a host: ``intra``, seconds per message and bytes/s *per rank* while every rank of the
  host exchanges with a local peer at once (memory and cores are shared);
* between hosts: ``inter``, seconds per message and bytes/s *per host and direction* (the
  host's link, shared by its ranks);

plus what one bluefog op costs by itself (``op_latency_s`` and ``op_bps``: the op without
peers, TensorFlow's dispatch, the negotiation, allocating and writing its output) and
``combine_bps``, one pass over memory (a weighted sum or a copy). The calibrated exchange with
one peer includes combining what it received, so only receives beyond the first cost extra
passes. Every method is a sequence of ops and exchange rounds; a round costs its message
latency plus the larger of its per-rank bytes within the host over ``intra`` and its per-host
bytes across hosts over ``inter`` (the two overlap). Ranks fill hosts in blocks of
``local_size``. Pure Python: no MPI, no TensorFlow.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterator

from bluefog.common import topology_util as tu


@dataclasses.dataclass(frozen=True)
class Link:
    latency_s: float  # one message
    bandwidth_bps: float  # bytes per second


@dataclasses.dataclass(frozen=True)
class Costs:
    intra: Link  # per rank, all local ranks busy
    inter: Link  # per host and direction
    op_latency_s: float  # one bluefog op on a tiny tensor, no peers (dispatch + negotiation)
    op_bps: float  # bytes/s of one bluefog op's own work on its tensor (no peers)
    combine_bps: float  # one pass of weighted sum or copy over memory

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)

    @staticmethod
    def from_dict(d: dict) -> Costs:
        return Costs(Link(**d["intra"]), Link(**d["inter"]), float(d["op_latency_s"]),
                     float(d["op_bps"]), float(d["combine_bps"]))


def _op(c: Costs, nbytes: float) -> float:
    return c.op_latency_s + nbytes / c.op_bps


def _transfer(c: Costs, intra_bytes: float, cross_bytes: float) -> float:
    """One exchange round: within the host and across hosts at once (they overlap)."""
    latency = c.inter.latency_s if cross_bytes > 0 else c.intra.latency_s
    return latency + max(intra_bytes / c.intra.bandwidth_bps,
                         cross_bytes / c.inter.bandwidth_bps)


def ring_allreduce(c: Costs, size: int, local: int, nbytes: float) -> float:
    """bluefog's flat ring (BLUEFOG_HIERARCHICAL_ALLREDUCE=0): one op of 2 (N-1) steps of S/N;
    where the ring crosses hosts one stream per host and direction uses the link."""
    if size == 1:
        return _op(c, nbytes)
    cross = nbytes / size if size > local else 0.0
    steps = 2 * (size - 1) * _transfer(c, nbytes / size, cross)
    return _op(c, nbytes) + steps + (size - 1) / size * nbytes / c.combine_bps


def hierarchical_allreduce(c: Costs, size: int, local: int, nbytes: float) -> float:
    """bluefog's allreduce across hosts (the default with several ranks per host), one op:
    reduce-scatter within the host, a ring of each local rank's slice across the n hosts (the L
    slices at once: S / n per host per step), allgather within the host."""
    n = size // local
    if n == 1 or local == 1:
        return ring_allreduce(c, size, local, nbytes)
    share = (local - 1) / local * nbytes
    inner = 2 * ((local - 1) * c.intra.latency_s + share / c.intra.bandwidth_bps)
    cross = 2 * (n - 1) * _transfer(c, 0.0, nbytes / n)
    return _op(c, nbytes) + inner + cross + share / c.combine_bps


def neighbor_step(c: Costs, sends: list[list[int]], local: int, nbytes: float) -> float:
    """One neighbor_allreduce in which rank r sends its tensor to ``sends[r]``."""
    size = len(sends)
    recv_count = [0] * size
    intra_out = [0] * size
    intra_in = [0] * size
    host_out = [0] * (size // local)
    host_in = [0] * (size // local)
    for r, dsts in enumerate(sends):
        for v in dsts:
            recv_count[v] += 1
            if v // local == r // local:
                intra_out[r] += 1
                intra_in[v] += 1
            else:
                host_out[r // local] += 1
                host_in[v // local] += 1
    intra = max(max(a, b) for a, b in zip(intra_out, intra_in)) * nbytes
    cross = max(max(a, b) for a, b in zip(host_out, host_in)) * nbytes
    # The calibrated exchange includes combining one receive; each further one is a pass.
    extra = max(0, max(recv_count) - 1) * nbytes / c.combine_bps
    if intra == 0 and cross == 0:
        return _op(c, nbytes)
    return _op(c, nbytes) + _transfer(c, intra, cross) + extra


def _graph_sends(graph) -> list[list[int]]:
    return [[v for v in graph.successors(r) if v != r] for r in range(graph.number_of_nodes())]


def neighbor_static(c: Costs, graph, local: int, nbytes: float) -> float:
    return neighbor_step(c, _graph_sends(graph), local, nbytes)


def neighbor_schedule(c: Costs, make: Callable[[int], Iterator], size: int, local: int,
                      nbytes: float, steps: int) -> float:
    """Mean step time of a rank-level dynamic schedule (``make(rank)`` -> generator)."""
    gens = [make(r) for r in range(size)]
    total = 0.0
    for _ in range(steps):
        total += neighbor_step(c, [list(next(g)[0]) for g in gens], local, nbytes)
    return total / steps


def hierarchical_neighbor(c: Costs, size: int, local: int, nbytes: float,
                          machine_degree: float) -> float:
    """hierarchical_neighbor_allreduce, three ops: reduce-scatter within the host, each local
    rank sends its 1/L slice to ``machine_degree`` machines (d * S per host), allgather within
    the host; around them TensorFlow copies the tensor about four times (padding, the blocks to
    send, joining the slices, cutting the padding off): a copy moves two streams of memory, a
    weighted-sum pass five, so four copies cost about 1.6 passes."""
    if local == 1:
        if machine_degree == 0 or size == 1:
            return _op(c, nbytes)
        return (_op(c, nbytes) + _transfer(c, 0.0, machine_degree * nbytes)
                + max(0, machine_degree - 1) * nbytes / c.combine_bps)
    share = (local - 1) / local * nbytes
    inner = 2 * (_op(c, share) + _transfer(c, share, 0.0)) + 1.6 * nbytes / c.combine_bps
    if machine_degree == 0 or size == local:
        return inner + _op(c, nbytes / local)
    return inner + _op(c, nbytes / local) + _transfer(c, 0.0, machine_degree * nbytes)


def _exp_degree(n: int) -> int:
    return max(0, math.ceil(math.log2(n))) if n > 1 else 0


def predict(c: Costs, size: int, local: int, nbytes: float) -> dict[str, float]:
    """Predicted seconds per step of every method, for ``size`` ranks, ``local`` per host."""
    if size % local:
        raise ValueError(f"local_size {local} must divide size {size}")
    n = size // local
    steps = max(1, math.ceil(math.log2(size)))
    out = {
        "allreduce (hierarchical)": hierarchical_allreduce(c, size, local, nbytes),
        "allreduce (flat ring)": ring_allreduce(c, size, local, nbytes),
        "neighbor, ExponentialGraph": neighbor_static(c, tu.ExponentialGraph(size), local, nbytes),
        "neighbor, HierarchicalExponentialGraph":
            neighbor_static(c, tu.HierarchicalExponentialGraph(size, local), local, nbytes),
        "neighbor, RingGraph": neighbor_static(c, tu.RingGraph(size), local, nbytes),
        "neighbor, one-peer exponential": neighbor_schedule(
            c, lambda r: tu.GetDynamicOnePeerSendRecvRanks(tu.ExponentialGraph(size), r),
            size, local, nbytes, steps),
        "hierarchical, ExponentialGraph of machines":
            hierarchical_neighbor(c, size, local, nbytes, _exp_degree(n)),
        "hierarchical, one-peer exponential of machines":
            hierarchical_neighbor(c, size, local, nbytes, 1 if n > 1 else 0),
        "hierarchical, one-peer machines every 2nd step": 0.5 * (
            hierarchical_neighbor(c, size, local, nbytes, 0)
            + hierarchical_neighbor(c, size, local, nbytes, 1 if n > 1 else 0)),
    }
    return out


DECENTRALIZED_USE = {
    "neighbor, ExponentialGraph": "bf.set_topology(topology_util.ExponentialGraph(bf.size()))",
    "neighbor, HierarchicalExponentialGraph": "the default topology (bf.set_topology())",
    "neighbor, RingGraph": "bf.set_topology(topology_util.RingGraph(bf.size()))",
    "neighbor, one-peer exponential":
        "schedule=topology_util.GetDynamicOnePeerSendRecvRanks(bf.load_topology(), bf.rank()) "
        "with the ExponentialGraph topology",
    "hierarchical, ExponentialGraph of machines":
        "communication_type='hierarchical_neighbor_allreduce'",
    "hierarchical, one-peer exponential of machines":
        "communication_type='hierarchical_neighbor_allreduce', schedule=topology_util."
        "GetExp2DynamicSendRecvMachineRanks(bf.size(), bf.local_size(), bf.rank(), "
        "bf.local_rank())",
    "hierarchical, one-peer machines every 2nd step":
        "communication_type='hierarchical_neighbor_allreduce', schedule=topology_util."
        "GetInnerOuterExp2DynamicSendRecvMachineRanks(bf.size(), bf.local_size(), bf.rank(), "
        "bf.local_rank())",
}


def recommend(c: Costs, size: int, local: int, nbytes: float,
              margin: float = 1.2) -> tuple[str, str, dict[str, float]]:
    """(method, how to use it, predictions). Allreduce averages exactly, so a decentralized
    method is recommended only when predicted at least ``margin`` times faster per step; among
    those, the fastest (one-peer schedules mix less per step than static graphs: see
    docs/decentralized.md)."""
    times = predict(c, size, local, nbytes)
    allreduce = ("allreduce (hierarchical)" if size > local > 1 else "allreduce (flat ring)")
    candidates = list(DECENTRALIZED_USE)
    if not size > local > 1:
        # Without both levels an inner step averages nothing: it would only skip steps.
        candidates.remove("hierarchical, one-peer machines every 2nd step")
    best = min(candidates, key=lambda k: times[k])
    if times[best] * margin <= times[allreduce]:
        return best, DECENTRALIZED_USE[best], times
    return allreduce, "bf.DistributedOptimizer (exact averaging)", times


def format_table(c: Costs, sizes: list[int], local: int, nbytes: float) -> str:
    names = list(predict(c, max(local, 2 * local), local, nbytes))
    lines = ["| method | " + " | ".join(f"{s} ranks" for s in sizes) + " |",
             "|---|" + "---|" * len(sizes)]
    table = {s: predict(c, s, local, nbytes) for s in sizes}
    for name in names:
        cells = [f"{table[s][name] * 1e3:.0f}" for s in sizes]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)
