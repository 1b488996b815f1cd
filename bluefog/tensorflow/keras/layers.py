"""Keras layers that communicate: ``SyncBatchNormalization``.

``bf.keras.layers.SyncBatchNormalization`` is Keras 3's ``BatchNormalization`` whose training-mode
batch statistics are those of the union of all ranks' batches, as Horovod's layer of that name.
"""

from __future__ import annotations

import keras
import tensorflow as tf

from bluefog.common import basics
from bluefog.tensorflow import averaging, mpi_ops

__all__ = ["SyncBatchNormalization"]


@keras.saving.register_keras_serializable(package="bluefog")
class SyncBatchNormalization(keras.layers.BatchNormalization):
    """Batch normalization with batch statistics computed over every rank's batch.

    In training mode (``model.fit``, or ``layer(x, training=True)`` under a ``tf.GradientTape``)
    each call sums, over all ranks, the number of elements, their sum and their sum of squares
    per channel in **one** allreduce (a single float vector), and normalizes with::

        mean = S / N,  variance = Q / N - mean ** 2     (N, S, Q summed over ranks)

    which are exactly the mean and (biased) variance of the concatenation of the ranks'
    batches, also when ranks hold batches of different sizes (a rank may even hold an empty
    batch). The moving mean and variance are updated from these statistics, so they stay
    identical on every rank (once the initial values are; ``BroadcastGlobalVariablesCallback``
    sees to that). Gradients flow through the allreduce: the gradient each rank gets is its part
    of the gradient of the sum of all ranks' losses, as plain ``BatchNormalization`` on the
    concatenated batch gives it. Masks are honoured (masked elements count in no statistic).

    Every argument is ``keras.layers.BatchNormalization``'s; ``synchronized=True`` (the
    ``tf.distribute`` mechanism) is refused. Every rank must call the layer the same number of
    times in the same order (the layers of one model are matched by their Keras names, so build
    models in the same order on every rank). In inference mode nothing is communicated. On one
    rank it computes what ``BatchNormalization`` computes. Saved models reload as this class
    after ``import bluefog.tensorflow.keras`` (registered as ``bluefog>SyncBatchNormalization``).
    Training needs ``bf.init()``; loading and inference do not.
    """

    def __init__(self, **kwargs):
        if kwargs.get("synchronized"):
            raise ValueError("bluefog SyncBatchNormalization: synchronized=True selects "
                             "tf.distribute's synchronization; leave it False (the layer is "
                             "synchronized over bluefog ranks already)")
        if "fused" in kwargs:  # Horovod's layer accepted fused=False only; Keras 3 has no fused
            if kwargs.pop("fused"):
                raise ValueError("bluefog SyncBatchNormalization: fused=True is not supported")
        super().__init__(**kwargs)

    def _moments(self, inputs, mask):
        averaging.check_initialized("SyncBatchNormalization (training mode)")
        if basics.size() == 1:
            return super()._moments(inputs, mask)
        axes = list(self._reduction_axes)
        x = tf.convert_to_tensor(inputs)
        if mask is None:
            count = tf.reshape(tf.cast(tf.reduce_prod(tf.gather(tf.shape(x), axes)), x.dtype),
                               [1])
            total = tf.reduce_sum(x, axes)
            squares = tf.reduce_sum(tf.square(x), axes)
        else:
            weights = tf.cast(tf.broadcast_to(tf.expand_dims(mask, -1), tf.shape(x)), x.dtype)
            count = tf.reshape(tf.reduce_sum(weights, axes), [-1])
            total = tf.reduce_sum(weights * x, axes)
            squares = tf.reduce_sum(weights * tf.square(x), axes)
        channels = tf.shape(total)
        n_count = tf.size(count)
        packed = tf.concat([count, tf.reshape(total, [-1]), tf.reshape(squares, [-1])], 0)
        prefix = f"SyncBatchNormalization.{self.name}"
        name = (prefix if tf.executing_eagerly()
                else f"{prefix}.{averaging.next_graph_index(prefix)}")
        summed = mpi_ops.allreduce(packed, average=False, name=name)
        count = summed[:n_count] if mask is not None else summed[0]
        size = tf.size(total)
        total = summed[n_count:n_count + size]
        squares = summed[n_count + size:]
        mean = tf.math.divide_no_nan(total, count)
        variance = tf.maximum(tf.math.divide_no_nan(squares, count) - tf.square(mean), 0.0)
        return tf.reshape(mean, channels), tf.reshape(variance, channels)
