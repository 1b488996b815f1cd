"""The registry of worker-local sources, shared by the tape, the Keras optimizer and the callbacks.

``LocalSources`` holds the variables whose gradients are not averaged over ranks (see
``partial.py``, the public API: ``register_local_source``, ``register_local_var``, the
``Partial*`` wrappers). It sits here, below ``gradient_tape.py`` and ``keras_optimizer.py``,
because ``partial.py`` builds on those two; ``bluefog.tensorflow.partial`` re-exports it.
"""

from __future__ import annotations

from typing import Any, Dict, Hashable, Iterable, List

import tensorflow as tf

__all__ = ["LocalSources", "source_key"]


def source_key(source) -> Hashable:
    """A hashable identity of a variable or tensor: a Keras variable and the ``tf.Variable``
    behind it have the same key."""
    inner = getattr(source, "value", None)
    if isinstance(inner, tf.Variable) and not isinstance(source, tf.Variable):
        source = inner  # a keras.Variable
    try:
        return source.ref()
    except AttributeError:
        return ("id", id(source))


class LocalSources:
    """The set of registered worker-local sources (strong references, keyed by identity)."""

    def __init__(self) -> None:
        self._sources: Dict[Hashable, Any] = {}

    def add(self, source, what: str) -> None:
        """Registers ``source``; TypeError naming ``what`` for something that is not a variable or
        tensor."""
        if not (isinstance(source, (tf.Variable, tf.Tensor)) or isinstance(
                getattr(source, "value", None), tf.Variable)):
            raise TypeError(f"bluefog {what}: expected a variable (tf.Variable or "
                            f"keras.Variable) or tensor, got {type(source).__name__}")
        self._sources[source_key(source)] = source

    def __len__(self) -> int:
        return len(self._sources)

    def __contains__(self, source) -> bool:
        return source_key(source) in self._sources

    def mask(self, sources: Iterable) -> List[bool]:
        """For each of ``sources``, whether it is registered."""
        return [s is not None and source_key(s) in self._sources for s in sources]
