"""``import bluefog.tensorflow as bf``: TensorFlow collectives and training helpers over MPI."""

from bluefog.common.basics import (  # noqa: F401
    BluefogError,
    backend,
    init,
    is_homogeneous,
    is_initialized,
    local_rank,
    local_size,
    mpi_threads_supported,
    rank,
    shutdown,
    size,
)
from bluefog.common.capabilities import (  # noqa: F401
    ccl_built,
    cuda_built,
    ddl_built,
    gloo_built,
    gloo_enabled,
    mpi_built,
    mpi_enabled,
    nccl_built,
    rocm_built,
)
from bluefog.common.flight_recorder import diagnose, flight_recorder, straggler_report  # noqa: F401
from bluefog.common.hosts import cross_rank, cross_size  # noqa: F401
from bluefog.common.process_sets import (  # noqa: F401
    ProcessSet,
    add_process_set,
    global_process_set,
    remove_process_set,
)
from bluefog.common.timeline import (  # noqa: F401
    merge_timelines,
    start_timeline,
    stop_timeline,
    timeline_context,
    timeline_end_activity,
    timeline_start_activity,
)
from bluefog.common.topology import (  # noqa: F401
    in_neighbor_machine_ranks,
    in_neighbor_ranks,
    is_machine_topo_weighted,
    is_topo_weighted,
    load_machine_topology,
    load_topology,
    machine_rank,
    machine_size,
    out_neighbor_machine_ranks,
    out_neighbor_ranks,
    set_machine_topology,
    set_topology,
    unified_mpi_window_model_supported,
)
from bluefog.tensorflow import (
    collective_grads,  # noqa: F401  (registers the gradients)
    elastic,  # noqa: F401
    util,  # noqa: F401  (Horovod's hvd.util)
)
from bluefog.tensorflow.bluefog_names import (  # noqa: F401
    DistributedAllreduceOptimizer,
    DistributedGradientAllreduceOptimizer,
    DistributedHierarchicalNeighborAllreduceOptimizer,
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
    broadcast_parameters,
    get_current_created_window_names,
)
from bluefog.tensorflow.compression import Compression  # noqa: F401
from bluefog.tensorflow.decentralized import (  # noqa: F401
    CommunicationType,
    DistributedAdaptThenCombineOptimizer,
    DistributedAdaptWithCombineOptimizer,
    DistributedNeighborAllreduceOptimizer,
)
from bluefog.tensorflow.feedback import (  # noqa: F401
    compression_stats,
    reset_compression_stats,
)
from bluefog.tensorflow.gradient_tape import DistributedGradientTape  # noqa: F401
from bluefog.tensorflow.job_page import (  # noqa: F401
    job_page_step,
    job_page_url,
    serve_job_page,
    stop_job_page,
)
from bluefog.tensorflow.join_op import join  # noqa: F401
from bluefog.tensorflow.keras_optimizer import DistributedOptimizer  # noqa: F401
from bluefog.tensorflow.low_communication import DiLoCo, LocalSGD  # noqa: F401
from bluefog.tensorflow.mpi_ops import (  # noqa: F401
    Adasum,
    Average,
    Max,
    Min,
    Product,
    Sum,
    UnsupportedReductionError,
    allgather,
    allreduce,
    barrier,
    broadcast,
    grouped_allreduce,
)
from bluefog.tensorflow.neighbor_ops import (  # noqa: F401
    hierarchical_neighbor_allreduce,
    neighbor_allgather,
    neighbor_allreduce,
)
from bluefog.tensorflow.nonblocking import (  # noqa: F401
    Handle,
    allgather_nonblocking,
    allreduce_nonblocking,
    broadcast_nonblocking,
    hierarchical_neighbor_allreduce_nonblocking,
    neighbor_allgather_nonblocking,
    neighbor_allreduce_nonblocking,
    poll,
    synchronize,
    wait,
)
from bluefog.tensorflow.objects import allgather_object, broadcast_object  # noqa: F401
from bluefog.tensorflow.partial import (  # noqa: F401
    PartialDistributedGradientTape,
    PartialDistributedOptimizer,
)
from bluefog.tensorflow.process_ops import (  # noqa: F401
    local_rank_op,
    local_size_op,
    process_set_included_op,
    rank_op,
    size_op,
)
from bluefog.tensorflow.replicas import (  # noqa: F401
    ReplicaMismatchError,
    check_replicas,
    replica_spread,
)
from bluefog.tensorflow.scatter_ops import (  # noqa: F401
    UnevenSplitError,
    alltoall,
    grouped_allgather,
    grouped_reducescatter,
    reducescatter,
)
from bluefog.tensorflow.util import _executing_eagerly  # noqa: F401
from bluefog.tensorflow.variables import (  # noqa: F401
    broadcast_,
    broadcast_global_variables,
    broadcast_variables,
)
from bluefog.tensorflow.win_optimizers import (  # noqa: F401
    DistributedPushSumOptimizer,
    DistributedWinPutOptimizer,
)
from bluefog.tensorflow.windows import (  # noqa: F401
    get_win_version,
    turn_off_win_ops_with_associated_p,
    turn_on_win_ops_with_associated_p,
    win_accumulate,
    win_accumulate_nonblocking,
    win_associated_p,
    win_create,
    win_free,
    win_get,
    win_get_nonblocking,
    win_mutex,
    win_ops_with_associated_p,
    win_poll,
    win_put,
    win_put_nonblocking,
    win_update,
    win_update_then_collect,
    win_wait,
    window_names,
    window_variable,
)

# The public names, and only those: `from bluefog.tensorflow import *`, `dir(bf)` and the
# API reference (docs/api/tensorflow.md; tests/python/test_api_docs.py checks both ways) follow
# it. The submodules that hold the implementation are not part of the API.
__all__ = [
    "Adasum", "Average", "BluefogError", "CommunicationType", "Compression",
    "DistributedAdaptThenCombineOptimizer", "DistributedAdaptWithCombineOptimizer",
    "DistributedAllreduceOptimizer", "DistributedGradientAllreduceOptimizer",
    "DistributedGradientTape", "DistributedHierarchicalNeighborAllreduceOptimizer",
    "DistributedNeighborAllreduceOptimizer", "DistributedOptimizer", "DistributedPushSumOptimizer",
    "DistributedWinPutOptimizer", "ExponentialGraph", "ExponentialTwoGraph", "FullyConnectedGraph",
    "GetDynamicOnePeerSendRecvRanks", "GetExp2DynamicSendRecvMachineRanks",
    "GetInnerOuterExpo2DynamicSendRecvRanks", "GetInnerOuterRingDynamicSendRecvRanks",
    "GetRecvWeights", "GetSendWeights", "Handle", "IsRegularGraph", "IsTopologyEquivalent", "Max",
    "MeshGrid2DGraph", "Min", "PartialDistributedGradientTape", "PartialDistributedOptimizer",
    "ProcessSet", "Product", "RingGraph", "StarGraph", "Sum", "SymmetricExponentialGraph",
    "SyncBatchNormalization", "UnevenSplitError", "UnsupportedReductionError", "add_process_set",
    "allgather", "allgather_nonblocking", "allgather_object", "allreduce", "allreduce_nonblocking",
    "alltoall", "backend", "barrier", "broadcast", "broadcast_", "broadcast_global_variables",
    "broadcast_nonblocking", "broadcast_object", "broadcast_parameters", "broadcast_variables",
    "ccl_built", "compression_stats", "cross_rank", "cross_size", "cuda_built", "ddl_built",
    "get_current_created_window_names", "get_win_version", "global_process_set", "gloo_built",
    "gloo_enabled", "grouped_allgather", "grouped_allreduce", "grouped_reducescatter",
    "hierarchical_neighbor_allreduce", "hierarchical_neighbor_allreduce_nonblocking",
    "in_neighbor_machine_ranks", "in_neighbor_ranks", "init", "is_homogeneous", "is_initialized",
    "is_machine_topo_weighted", "is_topo_weighted", "join", "load_machine_topology",
    "load_topology", "local_rank", "local_rank_op", "local_size", "local_size_op", "machine_rank",
    "machine_size", "merge_timelines", "mpi_built", "mpi_enabled", "mpi_threads_supported",
    "nccl_built", "neighbor_allgather", "neighbor_allgather_nonblocking", "neighbor_allreduce",
    "neighbor_allreduce_nonblocking", "out_neighbor_machine_ranks", "out_neighbor_ranks", "poll",
    "process_set_included_op", "rank", "rank_op", "reducescatter", "remove_process_set",
    "reset_compression_stats", "rocm_built", "set_machine_topology", "set_topology", "shutdown",
    "size", "size_op",
    "start_timeline", "stop_timeline", "synchronize", "timeline_context", "timeline_end_activity",
    "timeline_start_activity", "turn_off_win_ops_with_associated_p",
    "turn_on_win_ops_with_associated_p", "unified_mpi_window_model_supported", "wait",
    "win_accumulate", "win_accumulate_nonblocking", "win_associated_p", "win_create", "win_free",
    "win_get", "win_get_nonblocking", "win_mutex", "win_ops_with_associated_p", "win_poll",
    "win_put", "win_put_nonblocking", "win_update", "win_update_then_collect", "win_wait",
    "window_names", "window_variable",
    "ReplicaMismatchError", "check_replicas", "replica_spread",
]
__all__ += ["DiLoCo", "LocalSGD", "diagnose", "flight_recorder", "straggler_report"]
__all__ += ["job_page_step", "job_page_url", "serve_job_page", "stop_job_page"]
# Public subpackages, reached as attributes (bf.elastic, bf.keras; bf.util is Horovod's hvd.util).
_SUBPACKAGES = ("elastic", "keras", "util")


def __dir__():
    return sorted(__all__ + list(_SUBPACKAGES))


def __getattr__(name):
    # `bf.keras` (the Keras helpers and callbacks) without importing Keras on
    # `import bluefog.tensorflow`: the subpackage is imported on first access.
    if name == "keras":
        import importlib

        return importlib.import_module("bluefog.tensorflow.keras")
    if name == "SyncBatchNormalization":  # Horovod's hvd.SyncBatchNormalization
        import importlib

        return importlib.import_module("bluefog.tensorflow.keras.layers").SyncBatchNormalization
    raise AttributeError(f"module 'bluefog.tensorflow' has no attribute {name!r}")
