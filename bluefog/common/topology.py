"""The process's current virtual topology: which ranks each rank sends to and receives from.

A ``networkx.DiGraph`` on ranks 0..size-1 whose edge u -> v means "u sends to v"; edge weights
(when the topology is weighted) are the weights the receiver applies. Every rank must set the
same topology. After ``init()`` it is ``default_topology()``: ``ExponentialGraph(size)``, or a
machine-aware graph when the job spans machines with several ranks on each. The machines have a
topology of their own (``set_machine_topology``), used by ``hierarchical_neighbor_allreduce``.
"""

from __future__ import annotations

import threading
from typing import Optional

import networkx as nx

from bluefog.common import basics, topology_util

_lock = threading.Lock()
# Callables returning why the topology may not change now (None: it may). The windows register
# one: a window keeps the neighbours it was created with.
_change_guards: list = []
_state = {"topology": None, "weighted": False, "for_size": None,
          "machine_topology": None, "machine_weighted": False, "for_machines": None}


def _forget_topology() -> None:
    # A new job (elastic reset): its ranks and size are new; the default topology until the
    # user sets one again (set_topology in a reset callback).
    with _lock:
        _state.update(topology=None, weighted=False, for_size=None, machine_topology=None,
                      machine_weighted=False, for_machines=None)


basics.register_reinit_hook(_forget_topology)


# The framework's allgather of one int64 pair per rank (registered by bluefog.tensorflow):
# set_topology uses it to check that every rank set the same graph.
_agreement = {"allgather": None}


def register_agreement(allgather) -> None:
    """``allgather(pair)`` returns every rank's ``pair`` (two ints), in rank order."""
    _agreement["allgather"] = allgather


def _digest(topology: nx.DiGraph, is_weighted: bool) -> int:
    """A 63-bit digest of the graph's edges (with their weights when ``is_weighted``)."""
    import hashlib

    edges = sorted((int(u), int(v), float(d.get("weight", 1.0)) if is_weighted else 0.0)
                   for u, v, d in topology.edges(data=True))
    text = repr((bool(is_weighted), edges)).encode()
    return int.from_bytes(hashlib.sha256(text).digest()[:8], "little") >> 1


def _agree(topology, is_weighted: bool, local_error: Optional[Exception]) -> None:
    """Every rank contributes its graph's digest (or that its arguments failed); raises on
    every rank when one rank's arguments failed or the ranks' graphs differ."""
    allgather = _agreement["allgather"]
    if allgather is None or basics.size() == 1:
        if local_error is not None:
            raise local_error
        return
    mine = 0 if local_error is not None else _digest(topology, is_weighted)
    rows = allgather([1 if local_error is None else 0, mine])
    if local_error is not None:
        raise local_error
    failed = [r for r, (ok, _) in enumerate(rows) if not ok]
    if failed:
        raise ValueError(f"rank {basics.rank()}: set_topology: the arguments of rank(s) "
                         f"{failed} were refused there (see their error), so no rank changed "
                         "its topology")
    groups: dict = {}
    for r, (_, digest) in enumerate(rows):
        groups.setdefault(digest, []).append(r)
    if len(groups) > 1:
        listing = "; ".join(f"ranks {ranks}" for ranks in groups.values())
        raise ValueError(f"rank {basics.rank()}: set_topology: the ranks set different "
                         f"topologies (or weightings): groups with the same graph: {listing}. "
                         "Every rank must pass the same graph and is_weighted")


def register_change_guard(guard) -> None:
    """``guard()`` is asked before ``set_topology`` changes the topology; a string it returns
    is the reason the change is refused."""
    _change_guards.append(guard)


def default_topology() -> nx.DiGraph:
    """The topology ``init()`` and ``set_topology()`` give: ``ExponentialGraph(size())``, or,
    when the job spans machines with several ranks on each (``spans_machines()``),
    ``HierarchicalExponentialGraph(size(), local_size())``, whose cut between machines is
    smaller (docs/decentralized.md)."""
    size = basics.size()  # raises the "call bf.init()" error when not initialized
    if spans_machines():
        return topology_util.HierarchicalExponentialGraph(size, basics.local_size())
    return topology_util.ExponentialGraph(size)


def default_is_weighted() -> bool:
    """Whether the default topology's edge weights are used (the machine-aware one's are)."""
    return spans_machines()


def _current() -> nx.DiGraph:
    size = basics.size()
    with _lock:
        if _state["topology"] is not None and _state["for_size"] == size:
            return _state["topology"]
    default, weighted = default_topology(), default_is_weighted()
    with _lock:
        if _state["topology"] is None or _state["for_size"] != size:
            _state.update(topology=default, weighted=weighted, for_size=size)
        return _state["topology"]


def set_topology(topology: Optional[nx.DiGraph] = None, is_weighted: bool = False) -> bool:
    """Makes ``topology`` (default: ``default_topology()``, weighted when it is the
    machine-aware graph) the virtual topology.

    Every rank must pass the same graph (and ``is_weighted``): an allgather of a digest of it
    checks that, and a difference (or arguments refused on some rank) raises ValueError on
    every rank. With ``is_weighted`` the edge weights are used by
    ``neighbor_allreduce``; otherwise each rank averages uniformly over itself and its
    in-neighbours. Returns whether the topology (or its weighting) changed.
    """
    size = basics.size()
    if topology is None:
        topology, is_weighted = default_topology(), default_is_weighted() or is_weighted
    local_error: Optional[Exception] = None
    if not isinstance(topology, nx.DiGraph):
        local_error = TypeError(f"rank {basics.rank()}: set_topology: topology must be a "
                                f"networkx.DiGraph, got {type(topology).__name__}")
    elif sorted(topology.nodes) != list(range(size)):
        local_error = ValueError(
            f"rank {basics.rank()}: set_topology: the topology's nodes must be exactly the "
            f"ranks 0..{size - 1}, got {sorted(topology.nodes)[:10]}")
    elif not isinstance(is_weighted, bool):
        local_error = TypeError(f"rank {basics.rank()}: set_topology: is_weighted must be a "
                                "bool")
    _agree(topology, is_weighted, local_error)  # every rank raises, or none
    current = _current()
    if not topology_util.IsTopologyEquivalent(topology, current):
        for guard in _change_guards:
            reason = guard()
            if reason:
                raise ValueError(f"rank {basics.rank()}: set_topology: {reason}")
    with _lock:
        changed = (not topology_util.IsTopologyEquivalent(topology, current)
                   or is_weighted != _state["weighted"])
        _state.update(topology=topology, weighted=is_weighted, for_size=size)
    return changed


def load_topology() -> nx.DiGraph:
    """The current virtual topology."""
    return _current()


def is_topo_weighted() -> bool:
    """Whether ``neighbor_allreduce`` uses the topology's edge weights."""
    _current()
    return bool(_state["weighted"])


def in_neighbor_ranks() -> list:
    """The ranks this rank receives from, ascending (itself excluded)."""
    me = basics.rank()
    return sorted(r for r in _current().predecessors(me) if r != me)


def out_neighbor_ranks() -> list:
    """The ranks this rank sends to, ascending (itself excluded)."""
    me = basics.rank()
    return sorted(r for r in _current().successors(me) if r != me)


def recv_weights() -> tuple:
    """(self_weight, {in-neighbour: weight}) that ``neighbor_allreduce`` uses by default."""
    me = basics.rank()
    topo = _current()
    if _state["weighted"]:
        return topology_util.GetRecvWeights(topo, me)
    sources = in_neighbor_ranks()
    w = 1.0 / (len(sources) + 1)
    return w, {r: w for r in sources}


def num_machines() -> int:
    """Number of machines; raises unless the job is homogeneous (``basics.is_homogeneous``)."""
    size, local = basics.size(), basics.local_size()
    if not basics.is_homogeneous():
        raise ValueError(
            f"rank {basics.rank()}: machine-level operations need every machine to run the same "
            f"number of ranks, placed in contiguous blocks (mpirun's default --map-by slot, the "
            f"same number of slots per host, e.g. -H a:4,b:4); this job has size {size} and "
            f"{local} rank(s) on this rank's machine (local rank {basics.local_rank()})")
    return size // local


def machine_size() -> int:
    """Number of machines in the job (``size() // local_size()``).

    Raises ValueError unless every machine runs ``local_size()`` ranks in a contiguous block.
    """
    return num_machines()


def machine_rank() -> int:
    """This rank's machine, in ``[0, machine_size())``: ``rank() // local_size()``."""
    num_machines()
    return basics.rank() // basics.local_size()


def machine_of(rank: int) -> int:
    num_machines()
    return rank // basics.local_size()


def spans_machines() -> bool:
    """Whether the job is homogeneous with more than one machine and more than one rank on each:
    the jobs whose default topology is machine-aware (``HierarchicalExponentialGraph``)."""
    local = basics.local_size()
    return basics.is_homogeneous() and 1 < local < basics.size()


def _current_machine() -> nx.DiGraph:
    n = num_machines()
    with _lock:
        if _state["machine_topology"] is None or _state["for_machines"] != n:
            _state.update(machine_topology=topology_util.ExponentialGraph(n),
                          machine_weighted=False, for_machines=n)
        return _state["machine_topology"]


def set_machine_topology(topology: Optional[nx.DiGraph] = None, is_weighted: bool = False) -> bool:
    """Makes ``topology`` (default: ``ExponentialGraph(machine_size())``) the graph between
    machines that ``hierarchical_neighbor_allreduce`` uses: node ``m`` is machine ``m`` (ranks
    ``m * local_size()`` and up), an edge ``m -> k`` means machine ``m`` sends its mean to ``k``.

    Every rank must pass the same graph (and ``is_weighted``): an allgather of a digest of it
    checks that, and a difference (or arguments refused on some rank) raises ValueError on
    every rank. With ``is_weighted`` its edge weights are the
    receivers' weights; otherwise each machine averages uniformly over itself and its
    in-neighbour machines. Returns whether the machine topology (or its weighting) changed.
    """
    n = num_machines()
    if topology is None:
        topology = topology_util.ExponentialGraph(n)
    if not isinstance(topology, nx.DiGraph):
        raise TypeError(f"rank {basics.rank()}: set_machine_topology: topology must be a "
                        f"networkx.DiGraph, got {type(topology).__name__}")
    if sorted(topology.nodes) != list(range(n)):
        raise ValueError(f"rank {basics.rank()}: set_machine_topology: the topology's nodes must "
                         f"be exactly the machines 0..{n - 1} (machine_size() is {n}), got "
                         f"{sorted(topology.nodes)[:10]}")
    if not isinstance(is_weighted, bool):
        raise TypeError(f"rank {basics.rank()}: set_machine_topology: is_weighted must be a bool")
    current = _current_machine()
    with _lock:
        changed = (not topology_util.IsTopologyEquivalent(topology, current)
                   or is_weighted != _state["machine_weighted"])
        _state.update(machine_topology=topology, machine_weighted=is_weighted, for_machines=n)
    return changed


def load_machine_topology() -> nx.DiGraph:
    """The current topology between machines."""
    return _current_machine()


def is_machine_topo_weighted() -> bool:
    """Whether ``hierarchical_neighbor_allreduce`` uses the machine topology's edge weights."""
    _current_machine()
    return bool(_state["machine_weighted"])


def in_neighbor_machine_ranks() -> list:
    """The machines this rank's machine receives from, ascending (its own excluded)."""
    m = machine_rank()
    return sorted(x for x in _current_machine().predecessors(m) if x != m)


def out_neighbor_machine_ranks() -> list:
    """The machines this rank's machine sends to, ascending (its own excluded)."""
    m = machine_rank()
    return sorted(x for x in _current_machine().successors(m) if x != m)


def machine_recv_weights() -> tuple:
    """(self_weight, {in-neighbour machine: weight}) for this rank's machine."""
    m = machine_rank()
    topo = _current_machine()
    if _state["machine_weighted"]:
        return topology_util.GetRecvWeights(topo, m)
    sources = in_neighbor_machine_ranks()
    w = 1.0 / (len(sources) + 1)
    return w, {x: w for x in sources}


def unified_mpi_window_model_supported() -> bool:
    """Whether bluefog's windows (``bf.win_*``) give the unified memory model's guarantee: a
    finished put or accumulate is visible to the target's next ``win_update`` with no further
    synchronisation.

    bluefog's windows keep their buffers in each process's own memory, written under a lock by
    the core's window thread (docs/windows.md), so this holds wherever windows work at all:
    when MPI granted MPI_THREAD_MULTIPLE, which that thread needs (never on the Gloo backend,
    which has no windows).
    """
    return (basics.is_initialized() and basics.backend() == "mpi"
            and basics.mpi_threads_supported())
