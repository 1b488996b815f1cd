"""Asynchronous decentralized training over windows (``bf.win_*``): no rank waits for another.

Both wrap a Keras 3 optimizer (``model.compile``/``model.fit``, custom loops, eager or inside
``tf.function``). After the local step, on every ``num_steps_per_communication``-th step:

* ``DistributedWinPutOptimizer``: puts this rank's weights into its out-neighbours' windows and
  replaces them by the combination of its own weights with whatever its in-neighbours put last
  (``win_update`` with the topology's weights, uniform by default). A slow neighbour's weights are
  used as they are (stale), never waited for. Stale values bias the average slightly; it is
  the fast option for training.
* ``DistributedPushSumOptimizer``: push-sum. Each rank keeps a numerator ``x`` and a weight
  ``p`` (the window's associated weight); it adds shares ``x / (d+1)``, ``p / (d+1)`` to its ``d``
  out-neighbours' buffers, keeps one share, and collects what arrived. Weight is conserved, so
  ``x / p`` (the model's weights) converge to the exact average even on directed graphs and with
  ranks running at different speeds.

Bluefog's per-step knobs: ``opt.dst_weights`` (the out-neighbours this step puts to, a dict
scaling each; both optimizers), ``opt.self_weight`` (the share push-sum keeps) and
``opt.force_barrier`` (a barrier before each exchange), read by the next step, eager or traced.

The trainable variables of one dtype are flattened into one window named
``"<prefix>.<dtype>"`` (prefix: ``name``, default the wrapper name plus the optimizer's name),
created on the first step (collectively, so every rank must build its optimizer the same way).
Windows stay until ``bf.shutdown()`` or ``bf.win_free``. Ranks should start from the same model
(``bf.broadcast_variables``).
"""

from __future__ import annotations

from typing import Dict, List, Optional

import tensorflow as tf

from bluefog.common import basics
from bluefog.tensorflow import decentralized, op_rules, optimizer_knobs, windows
from bluefog.tensorflow.op_library import const_input, name_input, ops

__all__ = ["DistributedWinPutOptimizer", "DistributedPushSumOptimizer"]


def _groups(variables) -> Dict[tf.DType, List[int]]:
    by_dtype: Dict[tf.DType, List[int]] = {}
    for i, v in enumerate(variables):
        # Keras 3 variables give their dtype as a str ("float32"), tf.Variables as a tf.DType.
        dtype = tf.as_dtype(v.dtype)
        if dtype in op_rules.FLOAT_DTYPES:
            by_dtype.setdefault(dtype, []).append(i)
    return by_dtype


def _input(values, dtype):
    """A tensor (a knob's value fed at run time) cast to ``dtype``, or a Python value as a
    constant."""
    if isinstance(values, tf.Tensor):
        return tf.cast(values, dtype)
    return const_input(values if isinstance(values, list) else float(values), dtype)


class _WinKerasOptimizer(decentralized.DecentralizedKerasOptimizer):
    """``apply``: the local step, then the window exchange of ``_bluefog_mode``."""

    def _bluefog_windows(self, variables, groups) -> Dict[tf.DType, str]:
        """Creates this optimizer's windows on first use (eagerly, even while tracing)."""
        names = getattr(self, "_bluefog_window_names", None)
        if names is not None:
            return names
        names = {}
        with tf.init_scope():
            for dtype in sorted(groups, key=lambda d: d.name):
                name = f"{self._bluefog_prefix}.{dtype.name}"
                flat = tf.concat([tf.reshape(decentralized.read(variables[i]), [-1])
                                  for i in groups[dtype]], axis=0)
                windows.win_create(flat, name, zero_init=self._bluefog_mode == "pushsum")
                names[dtype] = name
        object.__setattr__(self, "_bluefog_window_names", names)
        return names

    def _bluefog_put_peers(self, w):
        """(ranks, weights, self_weight) of this step's put into window ``w``, from the knobs
        (``opt.dst_weights``; for push-sum also ``opt.self_weight``)."""
        default = None if self._bluefog_mode == "winput" else 1.0 / (len(w.out_ranks) + 1)
        return optimizer_knobs.runtime_values(
            lambda: optimizer_knobs.window_peers(self._bluefog_what, self._bluefog_knob_values,
                                                 w.out_ranks, default),
            [tf.int32, tf.float64, tf.float64], [[None], [None], []])

    def _bluefog_exchange(self, variables, groups, names, knobs_on: bool):
        flats = {dtype: tf.concat([tf.reshape(decentralized.read(variables[i]), [-1])
                                   for i in idx], axis=0) for dtype, idx in groups.items()}
        order = sorted(flats, key=lambda d: d.name)
        barriered = self._bluefog_barrier([flats[d] for d in order], self._bluefog_prefix)
        flats = dict(zip(order, barriered))
        for dtype, idx in groups.items():
            name = names[dtype]
            w = windows._window(self._bluefog_what, name)
            put = self._bluefog_put_peers(w) if knobs_on else None
            if self._bluefog_mode == "winput":
                mixed = self._win_put_step(name, w, flats[dtype], put)
            else:
                mixed = self._push_sum_step(name, w, flats[dtype], put)
            sizes = [tf.size(variables[i]) for i in idx]
            for i, piece in zip(idx, tf.split(mixed, sizes, axis=0)):
                variables[i].assign(tf.reshape(piece, tf.shape(variables[i])))
        return tf.constant(True)

    @staticmethod
    def _win_put_step(name, w, flat, put=None):
        out, out_weights = ((w.out_ranks, [1.0] * len(w.out_ranks)) if put is None
                            else put[:2])
        handle = ops.bluefog_win_put(flat, name_input(name), _input(out, tf.int32),
                                     _input(out_weights, tf.float64),
                                     const_input(1.0, tf.float64))
        ranks = sorted(w.neighbor_weights)
        mixed = ops.bluefog_win_update(flat, name_input(name),
                                       const_input(w.self_weight, tf.float64),
                                       const_input(ranks, tf.int32),
                                       const_input([w.neighbor_weights[r] for r in ranks],
                                                   tf.float64))
        with tf.control_dependencies([mixed]):
            done = ops.bluefog_win_wait(handle)
        with tf.control_dependencies([done]):
            return tf.identity(mixed)

    @staticmethod
    def _push_sum_step(name, w, flat, put=None):
        if put is None:
            share = 1.0 / (len(w.out_ranks) + 1)
            out, out_weights, keep = w.out_ranks, [share] * len(w.out_ranks), share
        else:
            out, out_weights, keep = put
        p = ops.bluefog_win_associated_p(name_input(name))
        x = flat * tf.cast(p, flat.dtype)  # back from the model's weights to the numerator
        handle = ops.bluefog_win_put(x, name_input(name), _input(out, tf.int32),
                                     _input(out_weights, tf.float64), _input(keep, tf.float64),
                                     accumulate=True, with_p=True)
        with tf.control_dependencies([ops.bluefog_win_wait(handle)]):
            # The weight in x's dtype without a float32 detour (tf.cast of a Python float).
            kept = x * (tf.cast(keep, x.dtype) if isinstance(keep, tf.Tensor)
                        else tf.constant(keep, x.dtype))
        collected = ops.bluefog_win_update(kept, name_input(name), const_input(1.0, tf.float64),
                                           const_input(w.in_ranks, tf.int32),
                                           const_input([1.0] * len(w.in_ranks), tf.float64),
                                           reset=True, with_p=True)
        with tf.control_dependencies([collected]):
            p_new = ops.bluefog_win_associated_p(name_input(name))
        return collected / tf.cast(p_new, collected.dtype)

    @tf.autograph.experimental.do_not_convert
    def apply(self, grads, trainable_variables=None):
        grads = list(grads)
        variables = self._bluefog_variables(grads, trainable_variables)
        # The local step (the base Keras class: the neighbour combination is replaced here).
        result = super(decentralized.DecentralizedKerasOptimizer, self).apply(
            grads, trainable_variables)
        if not grads or variables is None:
            return result
        groups = _groups(variables)
        if not groups or basics.size() == 1:
            return result
        names = self._bluefog_windows(variables, groups)
        communicate = self._bluefog_should_communicate()
        if communicate is False:
            return result

        def exchange():
            if tf.executing_eagerly():
                return self._bluefog_exchange(variables, groups, names,
                                              self._bluefog_knobs_on())
            # Traced: the knobs of each execution when some weight knob is set.
            return tf.cond(self._bluefog_knob_flags[0],
                           lambda: self._bluefog_exchange(variables, groups, names, True),
                           lambda: self._bluefog_exchange(variables, groups, names, False))

        if communicate is True:
            exchange()
        else:
            tf.cond(communicate, exchange, lambda: tf.constant(False))
        return result


def _wrap(optimizer, mode, num_steps_per_communication, name, what):
    new = decentralized.wrap(optimizer, mode, mode, num_steps_per_communication, name, what,
                             mixin=_WinKerasOptimizer)
    object.__setattr__(new, "_bluefog_what", what)
    return new


def _model_or_steps(model, num_steps_per_communication):
    """Bluefog's ``(optimizer, model, num_steps_per_communication)`` order, and the former
    ``(optimizer, num_steps_per_communication)`` one: an int in ``model``'s place is the step
    count."""
    if isinstance(model, int) and not isinstance(model, bool):
        return model
    return num_steps_per_communication


def DistributedWinPutOptimizer(optimizer, model=None, num_steps_per_communication: int = 1,
                               window_prefix: Optional[str] = None, name: Optional[str] = None):
    """Local step, then put the weights to the out-neighbours and combine them with whatever
    the in-neighbours put last, never waiting for a neighbour's step.

    Args:
        optimizer: a Keras 3 optimizer instance (not yet wrapped by bluefog).
        model: Bluefog's argument, accepted for its signature (a Keras model or None; the
            variables exchanged are those ``apply`` receives).
        num_steps_per_communication: communicate on every n-th step only (n >= 1).
        window_prefix: Bluefog's name for ``name``.
        name: prefix of the windows' names; equal on every rank.
    """
    return _wrap(optimizer, "winput", _model_or_steps(model, num_steps_per_communication),
                 name or window_prefix, "DistributedWinPutOptimizer")


def DistributedPushSumOptimizer(optimizer, model=None, num_steps_per_communication: int = 1,
                                name: Optional[str] = None):
    """Local step, then a push-sum exchange over windows (exact averaging on directed graphs
    and with ranks of different speeds). Arguments as for ``DistributedWinPutOptimizer``."""
    return _wrap(optimizer, "pushsum", _model_or_steps(model, num_steps_per_communication),
                 name, "DistributedPushSumOptimizer")
