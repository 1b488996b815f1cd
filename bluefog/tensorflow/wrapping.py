"""Wrapping a Keras 3 optimizer in a bluefog optimizer that communicates.

``DistributedOptimizer`` (gradient averaging) and the decentralized optimizers (model
combination) wrap a Keras optimizer the same way: a mixin is put in front of the optimizer's
own class (``derived_class``) and a new instance is made from the original's configuration
and state (``copy_optimizer``). The derived class keeps the base class's name and module, so
Keras serializes a wrapped optimizer as the plain one: a model saved with it loads anywhere.

Every mixin derives from ``BluefogKerasOptimizer``, so that any wrapper can refuse an optimizer
that some bluefog wrapper already made communicate.

This module is the one place that reads Keras optimizer internals (``_trainable_variables``
and ``_learning_rate``): Keras 3 offers no public way to copy a built optimizer.
"""

from __future__ import annotations

import threading
import types
import warnings
from typing import Any, Dict, Optional, Tuple

from bluefog.tensorflow import compat

__all__ = ["BluefogKerasOptimizer", "import_keras", "derived_class", "copy_optimizer",
           "trainable_variables", "collective_prefix"]


def import_keras() -> types.ModuleType:
    """The ``keras`` module, imported on first use only: ``import bluefog.tensorflow`` stays
    light."""
    import keras as keras_module

    return keras_module


class BluefogKerasOptimizer:
    """Base of every bluefog mixin placed in front of a Keras optimizer class.

    ``isinstance(optimizer, BluefogKerasOptimizer)``: the optimizer already communicates.
    """


_lock = threading.Lock()
_classes: Dict[Tuple[type, type, Tuple[Tuple[str, Any], ...]], type] = {}
_prefixes: Dict[str, int] = {}


def collective_prefix(base: str) -> str:
    """The prefix of the collectives of the next wrapper called ``base`` made in this process:
    ``base`` for the first, then ``base.1``, ``base.2``, ...

    Counted by bluefog, not taken from the optimizer's Keras name: Keras numbers every optimizer
    a process makes (``sgd``, ``sgd_1``, ...), so one extra plain optimizer on some ranks (a
    metric, a test, a loss-scale wrapper) would give the ranks different names for the same
    collective and stall the job. Ranks must still make their bluefog wrappers in one order.
    """
    with _lock:
        count = _prefixes.get(base, 0)
        _prefixes[base] = count + 1
    return base if count == 0 else f"{base}.{count}"


def check_plain_optimizer(optimizer, what: str, argument: str = "the optimizer") -> None:
    """ValueError naming ``what`` and ``argument`` unless ``optimizer`` is a Keras optimizer
    instance that no bluefog wrapper has wrapped yet."""
    keras = import_keras()
    if isinstance(optimizer, type):
        raise ValueError(f"bluefog {what}: {argument} must be an optimizer instance such as "
                         f"keras.optimizers.SGD(0.1), not the class {optimizer.__name__}")
    if not isinstance(optimizer, keras.optimizers.Optimizer):
        raise ValueError(f"bluefog {what}: {argument} must be a keras.optimizers.Optimizer "
                         f"instance, got {type(optimizer).__name__}")
    if isinstance(optimizer, BluefogKerasOptimizer):
        raise ValueError(f"bluefog {what}: {argument} already communicates (it is a bluefog "
                         "distributed optimizer); pass the plain Keras optimizer")


def derived_class(mixin: type, base: type, attributes: Optional[Dict[str, Any]] = None) -> type:
    """The subclass of ``base`` with ``mixin`` in front of it and ``attributes`` set on it.

    One class per (mixin, base, attributes), so that repeated wrapping does not create new
    classes. It carries the base's name, qualified name, module and docstring, so that Keras
    serializes it as the base class.
    """
    extra = dict(attributes or {})
    key = (mixin, base, tuple(sorted(extra.items())))
    with _lock:
        cls = _classes.get(key)
        if cls is None:
            namespace = {"__module__": base.__module__,
                         "__qualname__": getattr(base, "__qualname__", base.__name__),
                         "__doc__": base.__doc__}
            namespace.update(extra)
            cls = type(base.__name__, (mixin, base), namespace)
            _classes[key] = cls
    return cls


def trainable_variables(optimizer) -> list:
    """The variables a built Keras optimizer was built for (Keras keeps them privately)."""
    return list(optimizer._trainable_variables)


def copy_optimizer(optimizer, cls: type, what: str, overrides: Optional[Dict[str, Any]] = None):
    """A new instance of ``cls`` with the configuration (and state, if built) of ``optimizer``.

    ``overrides`` are applied to the configuration. A learning-rate schedule or callable is
    passed on as the very object. Raises ValueError (naming the wrapper ``what``) when the
    optimizer cannot be re-created from its ``get_config()`` or its state cannot be copied.
    """
    keras_module = import_keras()
    with warnings.catch_warnings():
        # A callable learning rate warns when serialized; it is passed on as is below.
        warnings.simplefilter("ignore")
        config = optimizer.get_config()
    config.update(overrides or {})
    lr = getattr(optimizer, "_learning_rate", None)
    if ("learning_rate" in config and lr is not None
            and not compat.is_keras_variable(lr)):
        # A schedule or callable: keep the very object (no serialization round trip).
        config["learning_rate"] = lr
    try:
        new = cls.from_config(config)
    except Exception as e:  # a user optimizer whose config does not round-trip
        raise ValueError(
            f"bluefog {what}: cannot re-create {type(optimizer).__name__} from its get_config() "
            f"({type(e).__name__}: {e}); the optimizer's get_config() must return every "
            "constructor argument") from e
    if optimizer.built:
        with keras_module.name_scope(new.name, caller=new):
            new.build(trainable_variables(optimizer))
        new.built = True
        old_vars, new_vars = optimizer.variables, new.variables
        if len(old_vars) != len(new_vars):
            raise ValueError(
                f"bluefog {what}: the built {type(optimizer).__name__} has {len(old_vars)} "
                f"variables but its copy has {len(new_vars)}; wrap the optimizer before it is "
                "built (before compile/fit or the first apply)")
        for src, dst in zip(old_vars, new_vars):
            dst.assign(src)
    return new
