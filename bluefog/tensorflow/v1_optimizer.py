"""``DistributedOptimizer`` for a ``tf.compat.v1.train.Optimizer`` (graph mode / Session).

``bluefog.tensorflow.keras_optimizer.DistributedOptimizer`` checks the common arguments and
hands a v1 optimizer to ``wrap_v1_optimizer``.
"""

from __future__ import annotations

import tensorflow as tf

from bluefog.tensorflow import averaging

__all__ = ["wrap_v1_optimizer"]


class _DistributedV1Optimizer(tf.compat.v1.train.Optimizer):
    """A ``tf.compat.v1.train.Optimizer`` whose ``compute_gradients`` averages over ranks.

    ``minimize`` (inherited) calls ``compute_gradients`` then ``apply_gradients``, so it trains
    on averaged gradients too. Everything else is the wrapped optimizer's.
    """

    def __init__(self, optimizer, name: str, use_locking: bool, how: averaging.Averaging):
        super().__init__(use_locking=use_locking, name=name)
        self._optimizer = optimizer
        self._bluefog_how = how

    def compute_gradients(self, *args, **kwargs):
        grads_and_vars = list(self._optimizer.compute_gradients(*args, **kwargs))
        grads = averaging.average_gradients([g for g, _ in grads_and_vars], self._name,
                                            self._bluefog_how)
        return [(g, v) for g, (_, v) in zip(grads, grads_and_vars)]

    def apply_gradients(self, *args, **kwargs):
        return self._optimizer.apply_gradients(*args, **kwargs)

    def get_slot(self, *args, **kwargs):
        return self._optimizer.get_slot(*args, **kwargs)

    def get_slot_names(self, *args, **kwargs):
        return self._optimizer.get_slot_names(*args, **kwargs)

    def variables(self, *args, **kwargs):
        return self._optimizer.variables(*args, **kwargs)


def wrap_v1_optimizer(optimizer: tf.compat.v1.train.Optimizer, name: str, use_locking: bool,
                      how: averaging.Averaging,
                      backward_passes_per_step: int) -> tf.compat.v1.train.Optimizer:
    """The v1 optimizer that averages ``optimizer``'s gradients, requests named ``name``.

    The other arguments are already checked by ``DistributedOptimizer``. Raises ValueError for
    ``backward_passes_per_step > 1`` (Keras only), an optimizer that is already distributed,
    or before ``bf.init()``.
    """
    if backward_passes_per_step > 1:
        raise ValueError("bluefog DistributedOptimizer: backward_passes_per_step > 1 needs a "
                         "Keras optimizer (it uses Keras' gradient accumulation)")
    if isinstance(optimizer, _DistributedV1Optimizer):
        raise ValueError("bluefog DistributedOptimizer: this optimizer is already "
                         "distributed; wrap the optimizer only once")
    averaging.check_initialized("DistributedOptimizer")
    return _DistributedV1Optimizer(optimizer, name, use_locking, how)
