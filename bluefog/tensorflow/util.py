"""Horovod's ``horovod.tensorflow.util`` helpers that ported scripts and tests call as
``hvd.util._executing_eagerly()`` or ``hvd._executing_eagerly()``."""

from __future__ import annotations

import tensorflow as tf


def _executing_eagerly() -> bool:
    """Whether TensorFlow runs eagerly here (``tf.executing_eagerly()``), as Horovod's helper of
    the same name."""
    return tf.executing_eagerly()
