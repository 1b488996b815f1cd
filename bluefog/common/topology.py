"""The process's current virtual topology: which ranks each rank sends to and receives from.

A ``networkx.DiGraph`` on ranks 0..size-1 whose edge u -> v means "u sends to v"; edge weights
(when the topology is weighted) are the weights the receiver applies. Every rank must set the
same topology. After ``init()`` it is ``ExponentialGraph(size)``.
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


def register_change_guard(guard) -> None:
    """``guard()`` is asked before ``set_topology`` changes the topology; a string it returns
    is the reason the change is refused."""
    _change_guards.append(guard)


def _current() -> nx.DiGraph:
    size = basics.size()  # raises the "call bf.init()" error when not initialized
    with _lock:
        if _state["topology"] is None or _state["for_size"] != size:
            _state.update(topology=topology_util.ExponentialGraph(size), weighted=False,
                          for_size=size)
        return _state["topology"]


def set_topology(topology: Optional[nx.DiGraph] = None, is_weighted: bool = False) -> bool:
    """Makes ``topology`` (default: ``ExponentialGraph(size())``) the virtual topology.

    Every rank must pass an equivalent graph. With ``is_weighted`` the edge weights are used by
    ``neighbor_allreduce``; otherwise each rank averages uniformly over itself and its
    in-neighbours. Returns whether the topology (or its weighting) changed.
    """
    size = basics.size()
    if topology is None:
        topology = topology_util.ExponentialGraph(size)
    if not isinstance(topology, nx.DiGraph):
        raise TypeError(f"rank {basics.rank()}: set_topology: topology must be a "
                        f"networkx.DiGraph, got {type(topology).__name__}")
    if sorted(topology.nodes) != list(range(size)):
        raise ValueError(f"rank {basics.rank()}: set_topology: the topology's nodes must be "
                         f"exactly the ranks 0..{size - 1}, got {sorted(topology.nodes)[:10]}")
    if not isinstance(is_weighted, bool):
        raise TypeError(f"rank {basics.rank()}: set_topology: is_weighted must be a bool")
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
    """Number of machines, assuming ranks fill machines in blocks of ``local_size()``."""
    size, local = basics.size(), basics.local_size()
    if size % local or basics.local_rank() != basics.rank() % local:
        raise ValueError(
            f"rank {basics.rank()}: machine-level operations need ranks placed on machines in "
            f"contiguous blocks of local_size()={local} (mpirun's default --map-by slot); this job "
            f"has size {size}, local rank {basics.local_rank()}")
    return size // local


def machine_of(rank: int) -> int:
    num_machines()
    return rank // basics.local_size()


def _current_machine() -> nx.DiGraph:
    n = num_machines()
    with _lock:
        if _state["machine_topology"] is None or _state["for_machines"] != n:
            _state.update(machine_topology=topology_util.ExponentialGraph(n),
                          machine_weighted=False, for_machines=n)
        return _state["machine_topology"]


def set_machine_topology(topology: Optional[nx.DiGraph] = None, is_weighted: bool = False) -> bool:
    """Sets the topology between machines used by ``hierarchical_neighbor_allreduce``."""
    n = num_machines()
    if topology is None:
        topology = topology_util.ExponentialGraph(n)
    if not isinstance(topology, nx.DiGraph) or sorted(topology.nodes) != list(range(n)):
        raise ValueError(f"rank {basics.rank()}: set_machine_topology: expected a "
                         f"networkx.DiGraph on machines 0..{n - 1}")
    current = _current_machine()
    with _lock:
        changed = (not topology_util.IsTopologyEquivalent(topology, current)
                   or is_weighted != _state["machine_weighted"])
        _state.update(machine_topology=topology, machine_weighted=bool(is_weighted),
                      for_machines=n)
    return changed


def load_machine_topology() -> nx.DiGraph:
    return _current_machine()


def out_neighbor_machines() -> list:
    m = machine_of(basics.rank())
    return sorted(x for x in _current_machine().successors(m) if x != m)


def machine_recv_weights() -> tuple:
    """(self_weight, {in-neighbour machine: weight}) for this rank's machine."""
    m = machine_of(basics.rank())
    topo = _current_machine()
    if _state["machine_weighted"]:
        return topology_util.GetRecvWeights(topo, m)
    sources = sorted(x for x in topo.predecessors(m) if x != m)
    w = 1.0 / (len(sources) + 1)
    return w, {x: w for x in sources}


def unified_mpi_window_model_supported() -> bool:
    """Whether bluefog's windows (``bf.win_*``) give the unified memory model's guarantee: a
    finished put or accumulate is visible to the target's next ``win_update`` with no further
    synchronisation.

    bluefog's windows keep their buffers in each process's own memory, written under a lock by
    the core's window thread (docs/windows.md), so this holds wherever windows work at all:
    when MPI granted MPI_THREAD_MULTIPLE, which that thread needs.
    """
    return basics.is_initialized() and basics.mpi_threads_supported()
