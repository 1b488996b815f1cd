"""``bf.elastic``: training that survives lost hosts and takes in new ones (under
``bfrun --min-np``). Horovod's elastic API: ``run``, ``State``, ``ObjectState``,
``TensorFlowState``, ``KerasState`` (also as ``TensorFlowKerasState``),
``HostsUpdatedInterrupt``, ``BluefogInternalError`` (also as ``HorovodInternalError``) and the
Keras callbacks.
docs/elastic.md shows how to use it and, under "How it works", why it is built so."""

from bluefog.common import elastic_env as _env
from bluefog.common.basics import BluefogInternalError, HorovodInternalError  # noqa: F401
from bluefog.tensorflow.elastic.interrupts import HostsUpdatedInterrupt  # noqa: F401
from bluefog.tensorflow.elastic.interrupts import install_handler as _install_handler
from bluefog.tensorflow.elastic.runner import run  # noqa: F401
from bluefog.tensorflow.elastic.state import (  # noqa: F401
    KerasState,
    ObjectState,
    State,
    TensorFlowKerasState,
    TensorFlowState,
)

if _env.is_elastic():
    _install_handler()

_CALLBACKS = ("CommitStateCallback", "UpdateBatchStateCallback", "UpdateEpochStateCallback")


def __getattr__(name):
    # The Keras callbacks import Keras, which `import bluefog.tensorflow` does not: on first use.
    if name in _CALLBACKS:
        from bluefog.tensorflow.elastic import callbacks

        return getattr(callbacks, name)
    raise AttributeError(f"module 'bluefog.tensorflow.elastic' has no attribute {name!r}")
