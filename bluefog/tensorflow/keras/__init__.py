"""``import bluefog.tensorflow.keras as bfk``: bluefog for Keras 3 users.

The same functions as ``bluefog.tensorflow`` (init, rank, size, collectives,
``DistributedOptimizer``, ``broadcast_variables``...), plus the callbacks (``bfk.callbacks.X``,
also as ``bfk.X`` and ``bf.keras.X``), the layers (``bfk.layers.SyncBatchNormalization``) and
``bfk.load_model``.
"""

from __future__ import annotations

from bluefog.common.basics import (  # noqa: F401  # noqa: F401
    BluefogError,
    ProcessSet,
    add_process_set,
    backend,
    global_process_set,
    init,
    is_homogeneous,
    is_initialized,
    local_rank,
    local_size,
    mpi_threads_supported,
    rank,
    remove_process_set,
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
from bluefog.tensorflow.compression import Compression as _Compression
from bluefog.tensorflow.gradient_tape import DistributedGradientTape  # noqa: F401
from bluefog.tensorflow.keras import callbacks, layers  # noqa: F401
from bluefog.tensorflow.keras.callbacks import (  # noqa: F401
    BestModelCheckpoint,
    BroadcastGlobalVariablesCallback,
    JobPageCallback,
    LearningRateScheduleCallback,
    LearningRateWarmupCallback,
    MetricAverageCallback,
    ReplicaCheckCallback,
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
    barrier,
    broadcast,
)
from bluefog.tensorflow.mpi_ops import allreduce as _allreduce
from bluefog.tensorflow.partial import (  # noqa: F401
    PartialDistributedGradientTape,
    PartialDistributedOptimizer,
)
from bluefog.tensorflow.scatter_ops import reducescatter  # noqa: F401
from bluefog.tensorflow.variables import (  # noqa: F401
    broadcast_global_variables,
    broadcast_variables,
)


def allreduce(value, name=None, average=True, prescale_factor: float = 1.0,
              postscale_factor: float = 1.0, op=None, compression=_Compression.none,
              process_set=None):
    """Horovod Keras' ``allreduce(value, name, average, ...)``: ``name`` is the second
    positional argument here (in ``bluefog.tensorflow.allreduce`` it is ``average``). ``value``
    may be a tensor, a variable, a number or an array; returns a tensor."""
    if average is None:
        average = True
    return _allreduce(value, average=average, name=name, op=op, compression=compression,
                      prescale_factor=prescale_factor, postscale_factor=postscale_factor,
                      process_set=process_set)


def load_model(filepath, custom_optimizers=None, custom_objects=None,
               compression=_Compression.none, compile: bool = True, **kwargs):
    """``keras.models.load_model`` whose optimizer comes back wrapped in ``DistributedOptimizer``.

    The arguments are Horovod's, in its order: ``custom_optimizers`` (optimizer classes the
    file may name, added to ``custom_objects`` under their class names), ``custom_objects``,
    ``compression`` (given to ``DistributedOptimizer``).

    A model saved with a ``DistributedOptimizer`` is stored with the plain optimizer (so it
    loads anywhere); this re-wraps it, keeping the saved optimizer state, so that training can
    resume on N ranks. Every rank may load the file, or rank 0 only followed by
    ``BroadcastGlobalVariablesCallback(0)`` in ``fit`` (the other ranks then build the same
    model another way). Extra keyword arguments go to ``keras.models.load_model``.
    """
    import keras

    if custom_optimizers:
        custom_objects = dict(custom_objects or {})
        for cls in custom_optimizers:
            if not isinstance(cls, type):
                raise TypeError(f"bluefog load_model: custom_optimizers must be optimizer "
                                f"classes, got {cls!r}")
            custom_objects.setdefault(cls.__name__, cls)
    model = keras.models.load_model(filepath, custom_objects=custom_objects, compile=compile,
                                    **kwargs)
    optimizer = getattr(model, "optimizer", None)
    if compile and optimizer is not None:
        from bluefog.tensorflow.keras_optimizer import is_distributed

        if not is_distributed(optimizer):
            model.optimizer = DistributedOptimizer(optimizer, compression=compression)
            # Functions traced with the old optimizer must not be reused.
            model.train_function = None
    return model
