"""Virtual topologies for decentralized (neighbor) communication.

Every static generator returns a :class:`networkx.DiGraph` on the ranks
``0 .. size-1``.  An edge ``u -> v`` means "rank ``u`` sends to rank ``v``" and
its ``weight`` attribute is the factor rank ``v`` applies to what it receives
from ``u``.  Every node has a self loop and, for every node ``v``, the weights
of the incoming edges (self loop included) sum to one.  In matrix form, with
``A = networkx.to_numpy_array(G)`` (``A[u][v]`` = weight of ``u -> v``), every
column sums to one and column ``r`` holds the receive weights of rank ``r``.
Unless a generator says otherwise, weights are uniform: edge ``u -> v`` has
weight ``1 / in_degree(v)``, the in-degree counting the self loop.

The dynamic schedules are infinite generators yielding one
``(send_ranks, recv_ranks)`` pair per communication step.  They are globally
consistent: at every step, rank ``u`` lists ``v`` among its send ranks exactly
when rank ``v`` lists ``u`` among its receive ranks.
Arguments are validated eagerly; errors are ValueError naming the argument.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator

import networkx as nx
import numpy as np

_WEIGHT_TOL = 1e-9

SendRecv = tuple[list[int], list[int]]
"""One step of a dynamic schedule: ``(send_ranks, recv_ranks)`` of this rank."""
_Phase = tuple[int, int, Callable[[int], int]]  # (group size, my index, index->rank)


# ---- Validation helpers ----
def _check_int(name: str, value: object, lo: int, hi: int | None = None) -> int:
    """Return ``value`` as int; raise ValueError unless lo <= value (< hi)."""
    allowed = f"an integer >= {lo}" if hi is None else f"an integer in [{lo}, {hi - 1}]"
    bad = isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer))
    if bad or value < lo or (hi is not None and value >= hi):
        raise ValueError(f"{name} must be {allowed}, got {value!r}")
    return int(value)


def _check_digraph(topo: object, name: str = "topo") -> None:
    # The documented contract is ValueError for every invalid argument.
    if not isinstance(topo, nx.DiGraph):
        msg = f"{name} must be a networkx.DiGraph, got {type(topo).__name__}"
        raise ValueError(msg)


def _check_topology(topo: object) -> int:
    """Check that ``topo`` is a DiGraph on nodes 0..n-1 and return n."""
    _check_digraph(topo)
    size = topo.number_of_nodes()
    if set(topo.nodes) != set(range(size)):
        nodes = sorted(topo.nodes, key=repr)
        raise ValueError(f"topo must have nodes 0..{size - 1}, got nodes {nodes!r}")
    return size


def _weight(topo: nx.DiGraph, u: int, v: int) -> float:
    return float(topo[u][v].get("weight", 1.0))


def _uniform_graph(size: int, targets: Callable[[int], set[int]]) -> nx.DiGraph:
    """Self loops, edges r -> targets(r), weight of u -> v = 1 / in_degree(v)."""
    out_neighbors = {r: set(targets(r)) - {r} for r in range(size)}
    in_degree = [1] * size  # the self loop
    for r in range(size):
        for v in out_neighbors[r]:
            in_degree[v] += 1
    graph = nx.DiGraph()
    graph.add_nodes_from(range(size))
    for r in range(size):
        graph.add_edge(r, r, weight=1.0 / in_degree[r])
        for v in sorted(out_neighbors[r]):
            graph.add_edge(r, v, weight=1.0 / in_degree[v])
    return graph


def _powers_below(base: int, size: int) -> list[int]:
    """``[base**0, base**1, ...]`` restricted to values < size."""
    powers = []
    while (p := base ** len(powers)) < size:
        powers.append(p)
    return powers


# ---- Static topologies ----
def ExponentialGraph(size: int, base: int = 2) -> nx.DiGraph:
    """Directed exponential graph with uniform weights.

    Rank ``r`` sends to ``(r + base**k) % size`` for every ``k >= 0`` with
    ``base**k < size`` (distinct, never ``r``), hence receives from
    ``(r - base**k) % size``.  All in-degrees are equal, so all weights are.
    Raises ValueError unless ``size >= 1`` and ``base >= 2``.
    """
    size = _check_int("size", size, 1)
    base = _check_int("base", base, 2)
    powers = _powers_below(base, size)
    return _uniform_graph(size, lambda r: {(r + p) % size for p in powers})


def HierarchicalExponentialGraph(size: int, local_size: int) -> nx.DiGraph:
    """Machine-aware graph: complete within each machine, one exponential graph between
    machines, each of whose edges is carried by one rank.

    Machines hold ``local_size`` consecutive ranks: rank ``r`` is local rank
    ``l = r % local_size`` of machine ``m = r // local_size`` of ``n = size // local_size``.
    Rank ``r`` sends to every other rank of machine ``m`` and, for every ``k >= 0`` with
    ``2**k < n`` and ``k % local_size == l``, to local rank ``l`` of machine
    ``(m + 2**k) % n``. So each machine sends ``ceil(log2 n)`` tensors to other machines per
    ``neighbor_allreduce``, as many as ``hierarchical_neighbor_allreduce`` sends means, where
    ``ExponentialGraph(size)`` sends ``local_size - 1 + local_size * log2(n)`` (``n`` a power
    of two).

    Weights are doubly stochastic (every rank's in- and out-weights sum to one, so repeated
    averaging converges to the exact mean): every edge between two ranks weighs
    ``1 / (local_size + c)``, ``c = ceil(ceil(log2 n) / local_size)`` the most machine edges
    one rank carries, and each self loop takes the rest. Use it with
    ``set_topology(..., is_weighted=True)``. ``local_size == 1`` gives ``ExponentialGraph(size)``
    and ``local_size == size`` the complete graph. Raises ValueError unless ``size >= 1``,
    ``local_size >= 1`` and ``local_size`` divides ``size``.
    """
    size = _check_int("size", size, 1)
    local = _check_int("local_size", local_size, 1)
    if size % local:
        raise ValueError(f"local_size must divide size ({size}), got {local}")
    n = size // local
    powers = _powers_below(2, n)
    most = -(-len(powers) // local)  # machine edges of the busiest local rank
    w = 1.0 / (local + most)
    graph = nx.DiGraph()
    graph.add_nodes_from(range(size))
    for r in range(size):
        m, lr = divmod(r, local)
        targets = [m * local + i for i in range(local) if i != lr]
        targets += [((m + p) % n) * local + lr for k, p in enumerate(powers) if k % local == lr]
        # In-degree equals out-degree for every rank (machines are alike), so the self loop
        # that completes the out-weights also completes the in-weights.
        graph.add_edge(r, r, weight=1.0 - w * len(targets))
        for v in sorted(targets):
            graph.add_edge(r, v, weight=w)
    return graph


def ExponentialTwoGraph(size: int) -> nx.DiGraph:
    """Same as ``ExponentialGraph(size, 2)``.  Raises ValueError unless size >= 1."""
    return ExponentialGraph(size, 2)


def SymmetricExponentialGraph(size: int, base: int = 4) -> nx.DiGraph:
    """Undirected exponential graph with uniform weights.

    Rank ``r`` is connected, both ways, to ``(r ± base**k) % size`` for every
    ``k >= 0`` with ``base**k < size`` (duplicates merged).
    Raises ValueError unless ``size >= 1`` and ``base >= 2``.
    """
    size = _check_int("size", size, 1)
    base = _check_int("base", base, 2)
    offsets = [s * p for p in _powers_below(base, size) for s in (1, -1)]
    return _uniform_graph(size, lambda r: {(r + d) % size for d in offsets})


def MeshGrid2DGraph(size: int, shape: tuple[int, int] | None = None) -> nx.DiGraph:
    """Two-dimensional grid (no wraparound) with Metropolis-Hastings weights.

    Rank ``r`` sits at row ``r // ncol``, column ``r % ncol`` of an
    ``nrow x ncol`` grid and is connected, both ways, to its horizontal and
    vertical neighbours.  ``shape`` defaults to the most square factorization
    ``(nrow, ncol)`` with ``nrow <= ncol``.  With ``d(r)`` the number of
    neighbours of ``r`` (self excluded), edge ``u -> v`` (``u != v``) weighs
    ``1 / (1 + max(d(u), d(v)))`` and the self loop of ``v`` takes the rest,
    so the weight matrix is symmetric and doubly stochastic.
    Raises ValueError unless ``size >= 1`` and ``shape`` is None or a pair of
    positive integers with ``shape[0] * shape[1] == size``.
    """
    size = _check_int("size", size, 1)
    if shape is None:
        nrow = max(d for d in range(1, math.isqrt(size) + 1) if size % d == 0)
        ncol = size // nrow
    else:
        msg = f"shape must be None or (nrow, ncol) with nrow * ncol == {size}"
        if not isinstance(shape, (tuple, list)) or len(shape) != 2:
            raise ValueError(f"{msg}, got {shape!r}")
        nrow, ncol = (_check_int(f"shape[{i}]", x, 1) for i, x in enumerate(shape))
        if nrow * ncol != size:
            raise ValueError(f"{msg}, got {shape!r}")
    nbrs: dict[int, set[int]] = {r: set() for r in range(size)}
    for r in range(size):
        for v in (r + 1 if (r + 1) % ncol else None, r + ncol):
            if v is not None and v < size:
                nbrs[r].add(v)
                nbrs[v].add(r)
    graph = nx.DiGraph()
    graph.add_nodes_from(range(size))
    for v in range(size):
        weights = {u: 1.0 / (1 + max(len(nbrs[u]), len(nbrs[v]))) for u in nbrs[v]}
        graph.add_edge(v, v, weight=1.0 - sum(weights.values()))
        for u in sorted(weights):
            graph.add_edge(u, v, weight=weights[u])
    return graph


def StarGraph(size: int, center_rank: int = 0) -> nx.DiGraph:
    """Star graph with doubly stochastic weights (Bluefog's).

    ``center_rank`` is connected, both ways, to every other rank; other ranks
    are connected only to the center.  Every edge to or from the center weighs
    ``1 / size``: the center keeps ``1 / size`` of its own value and each other
    rank ``1 - 1 / size``.  Every rank's in- and out-weights sum to one, so
    repeated ``neighbor_allreduce`` converges to the exact mean.
    Raises ValueError unless ``size >= 1`` and ``0 <= center_rank < size``.
    """
    size = _check_int("size", size, 1)
    center = _check_int("center_rank", center_rank, 0, size)
    w = 1.0 / size
    graph = nx.DiGraph()
    graph.add_nodes_from(range(size))
    for r in range(size):
        graph.add_edge(r, r, weight=w if r == center else 1.0 - w)
        if r != center:
            graph.add_edge(center, r, weight=w)
            graph.add_edge(r, center, weight=w)
    return graph


def RingGraph(size: int, connect_style: int = 0) -> nx.DiGraph:
    """Ring graph with uniform weights.

    ``connect_style`` 0: rank ``r`` sends to ``r - 1`` and ``r + 1``;
    1: only to its left neighbour ``r - 1``; 2: only to its right neighbour
    ``r + 1`` (all modulo ``size``).  ``size == 1`` gives a lone self loop;
    for ``size == 2`` left and right coincide, so every style gives one edge
    each way between the two ranks.
    Raises ValueError unless ``size >= 1`` and ``connect_style`` is 0, 1 or 2.
    """
    size = _check_int("size", size, 1)
    if isinstance(connect_style, bool) or connect_style not in (0, 1, 2):
        raise ValueError(f"connect_style must be 0, 1 or 2, got {connect_style!r}")
    offsets = {0: (-1, 1), 1: (-1,), 2: (1,)}[int(connect_style)]
    return _uniform_graph(size, lambda r: {(r + d) % size for d in offsets})


def FullyConnectedGraph(size: int) -> nx.DiGraph:
    """Complete graph with self loops; every weight is ``1 / size``.

    Raises ValueError unless ``size >= 1``.
    """
    size = _check_int("size", size, 1)
    return _uniform_graph(size, lambda r: set(range(size)))


# ---- Inspection ----
def IsRegularGraph(topo: nx.DiGraph) -> bool:
    """True iff all nodes share one in-degree and all share one out-degree.

    Self loops count.  (In a finite digraph the two common values are then
    equal.)  Raises ValueError if ``topo`` is not a networkx.DiGraph.
    """
    _check_digraph(topo)
    in_degrees = {d for _, d in topo.in_degree()}
    out_degrees = {d for _, d in topo.out_degree()}
    return len(in_degrees) <= 1 and len(out_degrees) <= 1


def IsTopologyEquivalent(topo1: nx.DiGraph | None, topo2: nx.DiGraph | None) -> bool:
    """True iff both graphs have the same nodes, edges and edge weights.

    Weights are compared with absolute tolerance 1e-9 (a missing ``weight``
    counts as 1.0).  False if either argument is None; ValueError if an
    argument is neither None nor a networkx.DiGraph.
    """
    if topo1 is None or topo2 is None:
        return False
    _check_digraph(topo1, "topo1")
    _check_digraph(topo2, "topo2")
    if set(topo1.nodes) != set(topo2.nodes) or set(topo1.edges) != set(topo2.edges):
        return False
    return all(
        abs(_weight(topo1, u, v) - _weight(topo2, u, v)) <= _WEIGHT_TOL for u, v in topo1.edges
    )


def _self_and_neighbor_weights(
    topo: nx.DiGraph, rank: int, incoming: bool
) -> tuple[float, dict[int, float]]:
    size = _check_topology(topo)
    rank = _check_int("rank", rank, 0, size)
    self_weight = _weight(topo, rank, rank) if topo.has_edge(rank, rank) else 0.0
    if incoming:
        nbrs = {int(u): _weight(topo, u, rank) for u in topo.predecessors(rank)}
    else:
        nbrs = {int(v): _weight(topo, rank, v) for v in topo.successors(rank)}
    nbrs.pop(rank, None)
    return self_weight, nbrs


def GetRecvWeights(topo: nx.DiGraph, rank: int) -> tuple[float, dict[int, float]]:
    """Weights ``rank`` applies to what it receives.

    Returns ``(self_weight, {u: weight of u -> rank})`` over in-neighbours
    ``u != rank``; ``self_weight`` is the self-loop weight (0.0 if absent).
    Raises ValueError if ``topo`` is not a DiGraph on nodes 0..n-1 or
    ``rank`` is not in ``[0, n-1]``.
    """
    return _self_and_neighbor_weights(topo, rank, incoming=True)


def GetSendWeights(topo: nx.DiGraph, rank: int) -> tuple[float, dict[int, float]]:
    """Weights on the out-edges of ``rank``.

    Returns ``(self_weight, {v: weight of rank -> v})`` over out-neighbours
    ``v != rank``.  Otherwise as ``GetRecvWeights``.
    """
    return _self_and_neighbor_weights(topo, rank, incoming=False)


# ---- Dynamic one-peer schedules ----
def GetDynamicOnePeerSendRecvRanks(topo: nx.DiGraph, self_rank: int) -> Iterator[SendRecv]:
    """Yield ``(send_ranks, recv_ranks)`` for a one-peer walk over ``topo``.

    Let ``N(r)`` be the out-neighbours of ``r`` other than ``r``, sorted by
    ``(v - r) % size``.  At step ``t = 0, 1, ...`` every rank ``r`` with a
    non-empty ``N(r)`` sends to ``N(r)[t % len(N(r))]``.  ``send_ranks`` holds
    that single target of ``self_rank`` (empty if ``N(self_rank)`` is empty);
    ``recv_ranks`` lists, in increasing order, every rank whose step-``t``
    target is ``self_rank``.
    Raises ValueError if ``topo`` is not a DiGraph on nodes 0..n-1 or
    ``self_rank`` is not in ``[0, n-1]``.
    """
    size = _check_topology(topo)
    me = _check_int("self_rank", self_rank, 0, size)

    def sorted_out(r: int) -> list[int]:
        out = (int(v) for v in topo.successors(r) if v != r)
        return sorted(out, key=lambda v: (v - r) % size)

    my_out = sorted_out(me)
    senders = {u: sorted_out(u) for u in sorted(int(u) for u in topo.predecessors(me))}
    senders.pop(me, None)

    def schedule() -> Iterator[SendRecv]:
        t = 0
        while True:
            send = [my_out[t % len(my_out)]] if my_out else []
            recv = [u for u, out in senders.items() if out[t % len(out)] == me]
            yield send, recv
            t += 1

    return schedule()


def _check_world(world: int, local: int, rank: int) -> tuple[int, int, int]:
    world = _check_int("world_size", world, 1)
    local = _check_int("local_size", local, 1)
    if world % local != 0:
        raise ValueError(f"local_size must divide world_size ({world}), got {local}")
    return world, local, _check_int("self_rank", rank, 0, world)


def _group_schedule(phases: list[_Phase], expo2: bool) -> Iterator[SendRecv]:
    """Cycle through ``phases`` = [(group size g, my index i, index -> rank)].

    At the ``j``-th use of a phase the distance is ``d = 1`` (ring) or
    ``2 ** (j % ceil(log2 g))`` (expo2); send to index ``(i + d) % g`` and
    receive from ``(i - d) % g``.  No phases: yield ``([], [])`` forever.
    """
    t = 0
    while True:
        if not phases:
            yield [], []
        else:
            group, me, to_rank = phases[t % len(phases)]
            k_count = (group - 1).bit_length()  # number of k with 2**k < group
            d = 2 ** ((t // len(phases)) % k_count) if expo2 else 1
            yield [to_rank((me + d) % group)], [to_rank((me - d) % group)]
        t += 1


def GetExp2DynamicSendRecvMachineRanks(
    world_size: int, local_size: int, self_rank: int, local_rank: int
) -> Iterator[SendRecv]:
    """Yield ``([send_machine], [recv_machine])`` for a machine-level exp-2 walk.

    Machines hold ``local_size`` consecutive ranks: ``self_rank`` is on machine
    ``m = self_rank // local_size`` of ``n = world_size // local_size``.  With
    ``d = 2 ** (t % ceil(log2 n))``, at step ``t`` machine ``m`` sends to
    machine ``(m + d) % n`` and receives from ``(m - d) % n``.  If ``n == 1``
    every step yields ``([], [])``.
    Raises ValueError unless ``world_size >= 1``, ``local_size >= 1``,
    ``world_size % local_size == 0``, ``0 <= self_rank < world_size`` and
    ``local_rank == self_rank % local_size``.
    """
    world_size, local_size, self_rank = _check_world(world_size, local_size, self_rank)
    local_rank = _check_int("local_rank", local_rank, 0, local_size)
    if local_rank != self_rank % local_size:
        raise ValueError(
            f"local_rank must equal self_rank % local_size "
            f"({self_rank % local_size}), got {local_rank}"
        )
    n = world_size // local_size
    phases = [(n, self_rank // local_size, int)] if n > 1 else []
    return _group_schedule(phases, expo2=True)


def _inner_outer_phases(world: int, local: int, rank: int) -> list[_Phase]:
    machine, local_rank = divmod(rank, local)
    n = world // local
    phases = []
    if local > 1:
        phases.append((local, local_rank, lambda i: machine * local + i))
    if n > 1:
        phases.append((n, machine, lambda i: i * local + local_rank))
    return phases


def GetInnerOuterRingDynamicSendRecvRanks(
    world_size: int, local_size: int, self_rank: int
) -> Iterator[SendRecv]:
    """Yield ``([send_rank], [recv_rank])``, alternating inner and outer rings.

    Rank ``r`` has machine ``m = r // local_size`` and local rank
    ``l = r % local_size``; there are ``n = world_size // local_size`` machines.
    Inner step: send to local rank ``(l + 1) % local_size`` of machine ``m``,
    receive from local rank ``(l - 1) % local_size`` of machine ``m``.
    Outer step: send to local rank ``l`` of machine ``(m + 1) % n``, receive
    from local rank ``l`` of machine ``(m - 1) % n``.
    Steps ``t = 0, 1, 2, ...`` are inner, outer, inner, ...  A phase with a
    single participant (``local_size == 1`` or ``n == 1``) is dropped, so every
    step uses the other one; if both are dropped every step yields ``([], [])``.
    Raises ValueError unless ``world_size >= 1``, ``local_size >= 1``,
    ``world_size % local_size == 0`` and ``0 <= self_rank < world_size``.
    """
    phases = _inner_outer_phases(*_check_world(world_size, local_size, self_rank))
    return _group_schedule(phases, expo2=False)


def GetInnerOuterExpo2DynamicSendRecvRanks(
    world_size: int, local_size: int, self_rank: int
) -> Iterator[SendRecv]:
    """Yield ``([send_rank], [recv_rank])``, alternating inner and outer exp-2 steps.

    Same layout, phase order, degenerate cases and argument checks as
    ``GetInnerOuterRingDynamicSendRecvRanks``, but the distance 1 becomes
    ``d = 2 ** (j % ceil(log2 g))`` at the ``j``-th occurrence (``j = 0, 1,
    ...``) of a phase whose group has ``g`` members (``g = local_size`` for
    inner steps, ``g = n`` for outer steps).  Inner step: send to local rank
    ``(l + d) % local_size`` of machine ``m``, receive from local rank
    ``(l - d) % local_size``.  Outer step: send to local rank ``l`` of machine
    ``(m + d) % n``, receive from local rank ``l`` of machine ``(m - d) % n``.
    """
    phases = _inner_outer_phases(*_check_world(world_size, local_size, self_rank))
    return _group_schedule(phases, expo2=True)


def GetInnerOuterExp2DynamicSendRecvMachineRanks(
    world_size: int, local_size: int, self_rank: int, local_rank: int, inner_steps: int = 1
) -> Iterator[SendRecv]:
    """Yield ``(send_machines, recv_machines)``: ``inner_steps`` steps without machines, then
    one step of ``GetExp2DynamicSendRecvMachineRanks``, and so on.

    With ``hierarchical_neighbor_allreduce`` a step without machines is the exact mean within
    each machine and sends nothing between machines, so the link between machines carries one
    machine mean per ``inner_steps + 1`` steps. Arguments and errors as for
    ``GetExp2DynamicSendRecvMachineRanks``; ``inner_steps`` must be an integer >= 0.
    """
    inner = _check_int("inner_steps", inner_steps, 0)
    outer = GetExp2DynamicSendRecvMachineRanks(world_size, local_size, self_rank, local_rank)

    def schedule() -> Iterator[SendRecv]:
        while True:
            for _ in range(inner):
                yield [], []
            yield next(outer)

    return schedule()
