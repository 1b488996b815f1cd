"""Worker-local variables: gradients that are not averaged over ranks (Horovod's partial API).

A model may hold variables that each rank trains on its own data only: personalized heads,
per-rank experts, local embeddings. Their gradients must not be averaged, and
``BroadcastGlobalVariablesCallback(root_rank, local_variables=...)`` must not overwrite them.

* ``tape.register_local_source(v)`` on a ``DistributedGradientTape`` and
  ``optimizer.register_local_var(v)`` on a Keras ``DistributedOptimizer``: ``v``'s gradient is
  the local one, divided by ``size()`` when ``scale_local_gradients=True`` (Horovod's default,
  so that a local head gets the same step size as if its gradient had been averaged with
  zeros: the loss of the job is the mean of the ranks' losses).
* ``PartialDistributedGradientTape(tape, local_layers=...)`` and
  ``PartialDistributedOptimizer(optimizer, local_layers=...)``: the same, registering every
  trainable weight of the given Keras layers.

Every rank must register the same number of variables at the same positions: the averaged
gradients of one call go out as one grouped request whose structure ranks must agree on.
"""

from __future__ import annotations

import tensorflow as tf

from bluefog.tensorflow.gradient_tape import DistributedGradientTape
from bluefog.tensorflow.keras_optimizer import DistributedOptimizer
from bluefog.tensorflow.local_sources import LocalSources, source_key

__all__ = ["LocalSources", "PartialDistributedGradientTape", "PartialDistributedOptimizer",
           "local_layer_variables", "source_key"]


def local_layer_variables(local_layers, what: str) -> list:
    """The trainable weights of ``local_layers`` (a Keras layer, a list of them, or None).

    Raises ValueError for an entry that is not a ``keras.layers.Layer`` (as Horovod).
    """
    import keras

    if local_layers is None:
        return []
    if isinstance(local_layers, keras.layers.Layer):
        local_layers = [local_layers]
    try:
        layers = list(local_layers)
    except TypeError:
        raise ValueError(f"bluefog {what}: local_layers must be a keras.layers.Layer or a list of "
                         f"them, got {type(local_layers).__name__}") from None
    for j, layer in enumerate(layers):
        if not isinstance(layer, keras.layers.Layer):
            raise ValueError(f"bluefog {what}: local_layers[{j}] is a {type(layer).__name__}, "
                             "not a keras.layers.Layer")
    return [v for layer in layers for v in layer.trainable_weights]


def PartialDistributedGradientTape(gradtape: tf.GradientTape, local_layers=None,
                                   **kwargs) -> tf.GradientTape:
    """A ``DistributedGradientTape`` that does not average the gradients of ``local_layers``.

    ``local_layers``: a Keras layer or a list of them; their trainable weights are registered
    with ``register_local_source`` (more sources can be registered later). Other keyword
    arguments (``device``, ``compression``, ``sparse_as_dense``, ``op``,
    ``gradient_predivide_factor``, ``scale_local_gradients``) are ``DistributedGradientTape``'s.
    Without ``local_layers`` it is a plain ``DistributedGradientTape``.
    """
    local_vars = local_layer_variables(local_layers, "PartialDistributedGradientTape")
    tape = DistributedGradientTape(gradtape, **kwargs)
    for v in local_vars:
        tape.register_local_source(v)
    return tape


def PartialDistributedOptimizer(optimizer, name=None, local_layers=None, **kwargs):
    """A Keras ``DistributedOptimizer`` that does not average the gradients of ``local_layers``.

    ``local_layers``: a Keras layer or a list of them; their trainable weights are registered
    with ``register_local_var`` (more can be registered later). Other arguments are
    ``DistributedOptimizer``'s. Raises ValueError for a ``tf.compat.v1`` optimizer.
    """
    if isinstance(optimizer, tf.compat.v1.train.Optimizer):
        raise ValueError("bluefog PartialDistributedOptimizer: needs a Keras optimizer, not a "
                         "tf.compat.v1.train.Optimizer")
    local_vars = local_layer_variables(local_layers, "PartialDistributedOptimizer")
    new = DistributedOptimizer(optimizer, name=name, **kwargs)
    for v in local_vars:
        new.register_local_var(v)
    return new
