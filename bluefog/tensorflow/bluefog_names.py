"""Names of Bluefog's ``bluefog.torch`` API that map onto what this package already has.

Each is a thin function (or a re-export) with Bluefog's signature and meaning; the mapping and
the names left out are listed in docs/bluefog.md ("Left out, and what to use instead").
"""

from __future__ import annotations

from typing import List, Optional

from bluefog.common.topology_util import (  # noqa: F401 - re-exported under bf.
    ExponentialGraph,
    ExponentialTwoGraph,
    FullyConnectedGraph,
    GetDynamicOnePeerSendRecvRanks,
    GetExp2DynamicSendRecvMachineRanks,
    GetInnerOuterExpo2DynamicSendRecvRanks,
    GetInnerOuterRingDynamicSendRecvRanks,
    GetRecvWeights,
    GetSendWeights,
    IsRegularGraph,
    IsTopologyEquivalent,
    MeshGrid2DGraph,
    RingGraph,
    StarGraph,
    SymmetricExponentialGraph,
)
from bluefog.tensorflow import decentralized, keras_optimizer, variables, windows

__all__ = ["DistributedAllreduceOptimizer", "DistributedHierarchicalNeighborAllreduceOptimizer",
           "DistributedGradientAllreduceOptimizer", "broadcast_parameters",
           "get_current_created_window_names", "ExponentialGraph", "ExponentialTwoGraph",
           "FullyConnectedGraph", "GetDynamicOnePeerSendRecvRanks",
           "GetExp2DynamicSendRecvMachineRanks", "GetInnerOuterExpo2DynamicSendRecvRanks",
           "GetInnerOuterRingDynamicSendRecvRanks", "GetRecvWeights", "GetSendWeights",
           "IsRegularGraph", "IsTopologyEquivalent", "MeshGrid2DGraph", "RingGraph", "StarGraph",
           "SymmetricExponentialGraph"]


def DistributedAllreduceOptimizer(optimizer, model=None, num_steps_per_communication: int = 1,
                                  name: Optional[str] = None):
    """Bluefog's model-averaging optimizer: ``DistributedAdaptWithCombineOptimizer(optimizer,
    model, bf.CommunicationType.allreduce, num_steps_per_communication)`` (every rank ends each
    communication with the mean model over all ranks)."""
    return decentralized.wrap(optimizer, "awc", "allreduce", num_steps_per_communication, name,
                              "DistributedAllreduceOptimizer")


def DistributedHierarchicalNeighborAllreduceOptimizer(optimizer, model=None,
                                                      num_steps_per_communication: int = 1,
                                                      name: Optional[str] = None):
    """Bluefog's ``DistributedAdaptWithCombineOptimizer(optimizer, model,
    bf.CommunicationType.hierarchical_neighbor_allreduce, num_steps_per_communication)``:
    machine means combined over the machine topology (``bf.set_machine_topology``)."""
    return decentralized.wrap(optimizer, "awc", "hierarchical_neighbor_allreduce",
                              num_steps_per_communication, name,
                              "DistributedHierarchicalNeighborAllreduceOptimizer")


def DistributedGradientAllreduceOptimizer(optimizer, model=None,
                                          num_steps_per_communication: int = 1,
                                          name: Optional[str] = None):
    """Bluefog's gradient-averaging optimizer (Horovod's scheme): ``bf.DistributedOptimizer``
    with the gradients accumulated over ``num_steps_per_communication`` steps
    (``backward_passes_per_step``) and averaged over all ranks before each step."""
    return keras_optimizer.DistributedOptimizer(
        optimizer, name=name, backward_passes_per_step=num_steps_per_communication)


def broadcast_parameters(params, root_rank: int):
    """Bluefog's name for ``bf.broadcast_variables``: assigns every variable of ``params`` (a
    list of variables, or a dict or list of ``(name, variable)`` pairs as torch gives) the
    value it has on ``root_rank``."""
    if isinstance(params, dict):
        params = [v for _, v in sorted(params.items())]
    else:
        params = [p[1] if isinstance(p, tuple) else p for p in params]
    return variables.broadcast_variables(params, root_rank)


def get_current_created_window_names() -> List[str]:
    """Bluefog's name for ``bf.window_names``: the names of the windows created and not yet
    freed."""
    return windows.window_names()
