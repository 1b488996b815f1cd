"""``import bluefog.tensorflow.keras as bfk``: bluefog for Keras 3 users.

The same functions as ``bluefog.tensorflow`` (init, rank, size, collectives,
``DistributedOptimizer``, ``broadcast_variables``...), plus the callbacks (``bfk.callbacks.X``,
also as ``bfk.X`` and ``bf.keras.X``), the layers (``bfk.layers.SyncBatchNormalization``) and
``bfk.load_model``.
"""

from __future__ import annotations

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
from bluefog.common.hosts import cross_rank, cross_size  # noqa: F401
from bluefog.common.timeline import (  # noqa: F401
    start_timeline,
    stop_timeline,
    timeline_context,
    timeline_end_activity,
    timeline_start_activity,
)
from bluefog.tensorflow import elastic  # noqa: F401
from bluefog.tensorflow.compression import Compression  # noqa: F401
from bluefog.tensorflow.gradient_tape import DistributedGradientTape  # noqa: F401
from bluefog.tensorflow.keras import callbacks, layers  # noqa: F401
from bluefog.tensorflow.keras.callbacks import (  # noqa: F401
    BestModelCheckpoint,
    BroadcastGlobalVariablesCallback,
    LearningRateScheduleCallback,
    LearningRateWarmupCallback,
    MetricAverageCallback,
)
from bluefog.tensorflow.keras.layers import SyncBatchNormalization  # noqa: F401
from bluefog.tensorflow.keras_optimizer import DistributedOptimizer
from bluefog.tensorflow.mpi_ops import (  # noqa: F401
    Adasum,
    Average,
    Max,
    Min,
    Product,
    Sum,
    allgather,
    allreduce,
    barrier,
    broadcast,
)
from bluefog.tensorflow.partial import (  # noqa: F401
    PartialDistributedGradientTape,
    PartialDistributedOptimizer,
)
from bluefog.tensorflow.scatter_ops import reducescatter  # noqa: F401
from bluefog.tensorflow.variables import broadcast_variables  # noqa: F401


def load_model(filepath, custom_objects=None, compile: bool = True, **kwargs):
    """``keras.models.load_model`` whose optimizer comes back wrapped in ``DistributedOptimizer``.

    A model saved with a ``DistributedOptimizer`` is stored with the plain optimizer (so it
    loads anywhere); this re-wraps it, keeping the saved optimizer state, so that training can
    resume on N ranks. Every rank may load the file, or rank 0 only followed by
    ``BroadcastGlobalVariablesCallback(0)`` in ``fit`` (the other ranks then build the same
    model another way). Extra keyword arguments go to ``keras.models.load_model``.
    """
    import keras

    model = keras.models.load_model(filepath, custom_objects=custom_objects, compile=compile,
                                    **kwargs)
    optimizer = getattr(model, "optimizer", None)
    if compile and optimizer is not None:
        from bluefog.tensorflow.keras_optimizer import is_distributed

        if not is_distributed(optimizer):
            model.optimizer = DistributedOptimizer(optimizer)
            # Functions traced with the old optimizer must not be reused.
            model.train_function = None
    return model
