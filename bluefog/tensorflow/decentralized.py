"""Decentralized training: every rank steps on its own gradient and mixes its model with its
neighbours' models instead of averaging gradients over all ranks.

Two ways of combining the local step with the communication are offered, both as wrappers of a
Keras 3 optimizer (usable in ``model.compile``/``model.fit`` and in custom loops, eager or inside
``tf.function``):

* ``DistributedAdaptThenCombineOptimizer`` (ATC): first the local optimizer step
  ``x' = step(x, g)``, then the variables are replaced by the combination of ``x'`` with the
  neighbours' ``x'``: ``x_new = combine(x')``.
* ``DistributedAdaptWithCombineOptimizer`` (AWC): the combination is taken of the values
  *before* the step (so the exchange can overlap the local step), and the local update is added
  to it: ``x_new = combine(x) + (step(x, g) - x)``.

``combine`` is chosen by ``communication_type``:

* ``"neighbor_allreduce"``: ``bf.neighbor_allreduce`` over the current virtual topology
  (``bf.set_topology``), with its weights;
* ``"hierarchical_neighbor_allreduce"``: mean within each machine, then neighbour combination
  between machines (``bf.set_machine_topology``);
* ``"allreduce"``: the mean over all ranks (every rank ends with the same model);
* ``"empty"``: no communication (independent local training; useful as a baseline).

A dynamic ``schedule`` (an iterator of ``(send, recv)`` pairs, one per communication, such as
``topology_util.GetDynamicOnePeerSendRecvRanks(bf.load_topology(), bf.rank())``, or machine ids
from ``GetExp2DynamicSendRecvMachineRanks`` for ``"hierarchical_neighbor_allreduce"``) replaces
the static topology: each communication sends to that step's ``send`` ranks (machines) only and
averages uniformly over itself and that step's ``recv``. The iterator is advanced in Python
once per communication, also inside a traced train step (through ``tf.py_function``).

Bluefog's per-step knobs (``opt.self_weight``, ``opt.src_weights``, ``opt.dst_weights``,
``opt.src_machine_weights``, ``opt.dst_machine_weights``, ``opt.enable_topo_check``,
``opt.force_barrier``) may be assigned between steps instead; the next communication uses them,
eager or traced (``optimizer_knobs``).

Communication happens on every ``num_steps_per_communication``-th call of ``apply`` (the
``n``-th, ``2n``-th, ... call; a ``tf.Variable`` counts the calls, so the schedule also holds
inside a traced train step). On the other steps the optimizer is just the local optimizer.

Only the variables handed to ``apply`` (in ``model.fit``: the trainable weights) are combined;
non-trainable state such as batch-normalisation statistics and the optimizer's own slots stays
local. Variables whose dtype is not floating point are not combined. Ranks should start from the
same model (``bf.broadcast_variables`` or the ``BroadcastGlobalVariablesCallback``).

Naming: all variables of one dtype are flattened into one buffer and exchanged by a single
collective named ``"<prefix>.<k>.<dtype>"``, where ``prefix`` is ``name`` (default: the wrapper
name plus the Keras optimizer's name, e.g. ``"DistributedAdaptThenCombineOptimizer.adam"``) and
``k`` counts the combinations traced so far in the graph being built (0 in eager mode). Ranks
must therefore build their optimizers in the same order (or pass the same explicit ``name``).
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from typing import Dict, List, Optional

import tensorflow as tf

from bluefog.common import basics
from bluefog.tensorflow import (
    averaging,
    mpi_ops,
    neighbor_ops,
    op_rules,
    optimizer_knobs,
    schedules,
    wrapping,
)
from bluefog.tensorflow.communication_types import (
    COMMUNICATION_TYPES,
    DEFAULT,
    CommunicationType,
    normalize,
    split_model,
)

__all__ = ["CommunicationType", "DistributedAdaptThenCombineOptimizer",
           "DistributedAdaptWithCombineOptimizer",
           "DistributedNeighborAllreduceOptimizer", "COMMUNICATION_TYPES", "wrap", "read",
           "DecentralizedKerasOptimizer"]

def _knob(name: str):
    """A property for Bluefog's per-step knob ``name``: the value assigned last (checked when
    assigned), read by the next communication."""

    def get(self):
        return self._bluefog_knob_values[name]

    def set_(self, value):
        value = optimizer_knobs.check(self._bluefog_what, self._bluefog_communication,
                                      self._bluefog_schedule, name, value)
        self._bluefog_knob_values[name] = value
        self._bluefog_sync_knob_flags()

    return property(get, set_, doc=f"Bluefog's per-step ``{name}`` (default "
                                   f"{optimizer_knobs.KNOBS[name]!r}); see docs/bluefog.md.")


def _next_graph_index(prefix: str) -> int:
    """How many combinations with `prefix` were traced before in the graph being built."""
    if tf.executing_eagerly():
        return 0
    return averaging.next_graph_index(prefix)


def _per_dtype(tensors: List[tf.Tensor], op, prefix: str, k: int) -> List[tf.Tensor]:
    """``op`` over each dtype's tensors flattened into one buffer (same structure back)."""
    out: List[Optional[tf.Tensor]] = list(tensors)
    by_dtype: Dict[tf.DType, List[int]] = {}
    for i, t in enumerate(tensors):
        # Only what the neighbour combination accepts is combined; the rest stays local.
        if t.dtype in op_rules.accepted_dtypes("neighbor_allreduce"):
            by_dtype.setdefault(t.dtype, []).append(i)
    for dtype in sorted(by_dtype, key=lambda d: d.name):
        idx = by_dtype[dtype]
        # One exchange per dtype: flatten, concatenate, combine, split back.
        flat = tf.concat([tf.reshape(tensors[i], [-1]) for i in idx], axis=0)
        mixed = op(flat, name=f"{prefix}.{k}.{dtype.name}")
        sizes = [tf.size(tensors[i]) for i in idx]
        for i, piece in zip(idx, tf.split(mixed, sizes, axis=0)):
            out[i] = tf.reshape(piece, tf.shape(tensors[i]))
    return out


def _peer_op(communication_type: str, send, recv, w, ws, send_ws):
    """The exchange with these neighbours (ranks, or machines for the hierarchical one)."""
    if communication_type == "neighbor_allreduce":
        def op(t, name):
            return neighbor_ops.neighbor_allreduce_op(t, name, send, recv, w, ws, send_ws)
    else:
        def op(t, name):
            return neighbor_ops.hierarchical_exchange(
                t, name, basics.local_size(), basics.local_rank(), send, recv, w, ws)
    return op


_PEER_DTYPES = [tf.int32, tf.int32, tf.float64, tf.float64, tf.float64]
_PEER_SHAPES = [[None], [None], [], [None], [None]]


def _combine(tensors: List[tf.Tensor], communication_type: str, prefix: str,
             schedule: Optional[Iterator] = None, what: str = "",
             knobs=None) -> List[tf.Tensor]:
    """The combination over ranks of every tensor in `tensors` (same structure back).

    ``knobs``: the optimizer whose per-step knobs choose the neighbours and weights (None: the
    topology or the schedule)."""
    if not tensors or (communication_type == "empty" and knobs is None):
        return list(tensors)
    k = _next_graph_index(prefix)
    static = (neighbor_ops.neighbor_allreduce if communication_type == "neighbor_allreduce"
              else neighbor_ops.hierarchical_neighbor_allreduce)

    def body(ts: List[tf.Tensor], use_knobs: bool) -> List[tf.Tensor]:
        if communication_type == "empty":
            return [tf.identity(t) for t in ts]
        if communication_type == "allreduce":
            return mpi_ops.grouped_allreduce(ts, average=True, name=f"{prefix}.{k}")
        if schedule is not None:
            # One step of the schedule for every dtype's exchange of this communication.
            send, recv, w, ws = schedules.scheduled_peers(schedule, communication_type, what)
            return _per_dtype(ts, _peer_op(communication_type, send, recv, w, ws, []),
                              prefix, k)
        if not use_knobs:
            return _per_dtype(ts, static, prefix, k)
        resolve = (optimizer_knobs.neighbor_peers if communication_type == "neighbor_allreduce"
                   else optimizer_knobs.machine_peers)
        # Read when the exchange runs: at every execution of a traced step.
        peers = optimizer_knobs.runtime_values(
            lambda: resolve(what, knobs._bluefog_knob_values), _PEER_DTYPES, _PEER_SHAPES)
        return _per_dtype(ts, _peer_op(communication_type, *peers), prefix, k)

    if knobs is None:
        return body(list(tensors), False)
    if tf.executing_eagerly():
        return body(knobs._bluefog_barrier(list(tensors), f"{prefix}.{k}"),
                    knobs._bluefog_knobs_on())
    # Traced: while no knob is set, the topology's weights as they were at tracing (one cond
    # on the flags); else an optional barrier and the knobs' values of each execution.
    flags = knobs._bluefog_knob_flags

    def with_flags():
        ts = knobs._bluefog_barrier(list(tensors), f"{prefix}.{k}")
        return tf.cond(flags[0], lambda: body(ts, True), lambda: body(ts, False))

    return tf.cond(tf.reduce_any(flags), with_flags, lambda: body(list(tensors), False))


def read(variable) -> tf.Tensor:
    """A snapshot of the variable's current value."""
    return tf.identity(tf.convert_to_tensor(variable))


class DecentralizedKerasOptimizer(wrapping.BluefogKerasOptimizer):
    """Mixin in front of a Keras optimizer class; ``apply`` adds the neighbour combination.

    Keras 3 sends every update through ``apply`` (``apply_gradients`` and ``model.fit`` call
    it), so overriding it alone covers all entry points.
    """

    _bluefog_mode: str = ""  # "atc" or "awc"
    _bluefog_communication: str = "neighbor_allreduce"
    _bluefog_every: int = 1
    _bluefog_prefix: str = ""
    _bluefog_schedule = None
    _bluefog_what: str = ""
    # Each rank keeps its own model between combinations: ReplicaCheckCallback measures the
    # spread instead of requiring equality.
    _bluefog_replicas_differ = True

    self_weight = _knob("self_weight")
    src_weights = _knob("src_weights")
    dst_weights = _knob("dst_weights")
    src_machine_weights = _knob("src_machine_weights")
    dst_machine_weights = _knob("dst_machine_weights")
    enable_topo_check = _knob("enable_topo_check")
    force_barrier = _knob("force_barrier")

    def _bluefog_knobs_on(self) -> bool:
        """True while some weight knob is set (the next communication reads them)."""
        return any(self._bluefog_knob_values[k] is not None
                   for k in optimizer_knobs.WEIGHT_KNOBS)

    def _bluefog_sync_knob_flags(self):
        """Mirrors (weights set, force_barrier) into the flags a traced step reads."""
        if not tf.executing_eagerly():
            raise ValueError(
                f"rank {op_rules.rank_str()}: bluefog {self._bluefog_what}: the per-step "
                "knobs are assigned while a tf.function is being traced, so the assignment "
                "would run once at tracing only; assign them outside the traced step (between "
                "calls, or in a Keras callback's on_train_batch_begin)")
        flags = (self._bluefog_knobs_on(), self._bluefog_knob_values["force_barrier"])
        if flags != self._bluefog_knob_mirror:
            self._bluefog_knob_flags.assign(list(flags))
            object.__setattr__(self, "_bluefog_knob_mirror", flags)

    def _bluefog_barrier(self, tensors: List[tf.Tensor], name: str) -> List[tf.Tensor]:
        """``tensors``, after a barrier over all ranks when ``force_barrier`` is set."""
        def barrier():
            return mpi_ops.allreduce(tf.zeros([1], tf.float32), average=False,
                                     name=f"{name}.barrier")

        if tf.executing_eagerly():
            if self._bluefog_knob_values["force_barrier"]:
                barrier()
            return tensors
        done = tf.cond(self._bluefog_knob_flags[1], barrier, lambda: tf.zeros([1], tf.float32))
        with tf.control_dependencies([done]):
            return [tf.identity(t) for t in tensors]

    @property
    def communication_type(self) -> str:
        """The combination of the next communication; assignable between eager steps (Bluefog's
        examples switch to ``CommunicationType.allreduce`` for a step now and then)."""
        return self._bluefog_communication

    @communication_type.setter
    def communication_type(self, value):
        what = f"rank {op_rules.rank_str()}: bluefog {self._bluefog_what}"
        if self._bluefog_mode not in ("atc", "awc"):
            raise ValueError(f"{what}: communication_type cannot be changed on this optimizer")
        value = normalize(value)
        if not isinstance(value, str) or value not in COMMUNICATION_TYPES:
            raise ValueError(f"{what}: communication_type must be one of "
                             f"{', '.join(repr(c) for c in COMMUNICATION_TYPES)} or a "
                             f"bf.CommunicationType, got {value!r}")
        if value == self._bluefog_communication:
            return
        if getattr(self, "_bluefog_traced", False):
            raise ValueError(
                f"{what}: setting opt.communication_type after a step was traced (tf.function, "
                "model.fit) would be ignored by that traced step, whose exchange is fixed; "
                "change it only in eager loops (model.compile(run_eagerly=True) for fit), or "
                "wrap one optimizer per communication type")
        if self._bluefog_schedule is not None and value not in (
                "neighbor_allreduce", "hierarchical_neighbor_allreduce"):
            raise ValueError(f"{what}: a schedule= needs 'neighbor_allreduce' or "
                             f"'hierarchical_neighbor_allreduce', got {value!r}")
        self._bluefog_communication = value

    @property
    def num_steps_per_communication(self) -> int:
        return self._bluefog_every

    @property
    def schedule(self):
        """The dynamic schedule (an iterator), or None for the static topology."""
        return self._bluefog_schedule

    def _bluefog_variables(self, grads, trainable_variables):
        if trainable_variables is not None:
            return list(trainable_variables)
        if not self.built:
            return None  # the base class raises its own error
        return wrapping.trainable_variables(self)

    def _bluefog_should_communicate(self):
        """True (Python bool or bool tensor) when this call communicates; counts the call."""
        counter = self._bluefog_counter
        step = counter.assign_add(1)
        if self._bluefog_every == 1:
            return True
        if tf.executing_eagerly():
            return int(step) % self._bluefog_every == 0
        return tf.equal(tf.math.floormod(step, self._bluefog_every), 0)

    def _bluefog_combine(self, values: List[tf.Tensor], communicate) -> List[tf.Tensor]:
        """combine(values) when `communicate`, else `values`; `communicate` may be a tensor."""
        def combine():
            return _combine(values, self._bluefog_communication, self._bluefog_prefix,
                            self._bluefog_schedule, self._bluefog_what, knobs=self)

        if communicate is True:
            return combine()
        if communicate is False:
            return values
        return tf.cond(communicate, combine, lambda: [tf.identity(v) for v in values])

    @tf.autograph.experimental.do_not_convert
    def apply(self, grads, trainable_variables=None):
        grads = list(grads)
        variables = self._bluefog_variables(grads, trainable_variables)
        if not grads or variables is None:
            return super().apply(grads, trainable_variables)
        if not tf.executing_eagerly():
            object.__setattr__(self, "_bluefog_traced", True)
        if self._bluefog_mode == "atc":
            result = super().apply(grads, trainable_variables)
            communicate = self._bluefog_should_communicate()
            if communicate is False:
                return result
            combined = self._bluefog_combine([read(v) for v in variables], communicate)
            for v, c in zip(variables, combined):
                v.assign(c)
            return result
        # Adapt-with-combine: combine the pre-step values, add the local update.
        communicate = self._bluefog_should_communicate()
        if communicate is False:
            return super().apply(grads, trainable_variables)
        before = [read(v) for v in variables]
        combined = self._bluefog_combine(before, communicate)
        result = super().apply(grads, trainable_variables)
        for v, b, c in zip(variables, before, combined):
            v.assign_add(c - b)
        return result


def wrap(optimizer, mode: str, communication_type: str, num_steps_per_communication: int,
         name: Optional[str], what: str, mixin: Optional[type] = None, schedule=None):
    """The wrapped copy of ``optimizer``: a subclass with ``mixin`` (default: the neighbour
    combination of this module) in front, after checking every argument."""
    communication_type = normalize(communication_type)
    if mixin is None and (not isinstance(communication_type, str)
                          or communication_type not in COMMUNICATION_TYPES):
        raise ValueError(f"bluefog {what}: communication_type must be one of "
                         f"{', '.join(repr(c) for c in COMMUNICATION_TYPES)}, got "
                         f"{communication_type!r}")
    if (isinstance(num_steps_per_communication, bool)
            or not isinstance(num_steps_per_communication, int)
            or num_steps_per_communication < 1):
        raise ValueError(f"bluefog {what}: num_steps_per_communication must be an int >= 1, got "
                         f"{num_steps_per_communication!r}")
    averaging.check_name(name, what)
    if schedule is not None:
        if communication_type not in ("neighbor_allreduce", "hierarchical_neighbor_allreduce"):
            raise ValueError(f"bluefog {what}: a schedule needs communication_type "
                             "'neighbor_allreduce' or 'hierarchical_neighbor_allreduce', got "
                             f"{communication_type!r}")
        if not isinstance(schedule, Iterator):
            raise ValueError(f"bluefog {what}: schedule must be an iterator of (send, recv) "
                             "pairs, such as topology_util.GetDynamicOnePeerSendRecvRanks("
                             f"bf.load_topology(), bf.rank()), got {type(schedule).__name__}")
    wrapping.check_plain_optimizer(optimizer, what)
    averaging.check_initialized(what)
    cls = wrapping.derived_class(mixin or DecentralizedKerasOptimizer, type(optimizer),
                                 {"_bluefog_mode": mode})
    new = wrapping.copy_optimizer(optimizer, cls, what)
    new._bluefog_communication = communication_type
    new._bluefog_every = num_steps_per_communication
    new._bluefog_prefix = name or wrapping.collective_prefix(
        f"{what}.{type(optimizer).__name__}")
    new._bluefog_what = what
    # Plain attributes, not tracked by Keras: an iterator is no optimizer state.
    object.__setattr__(new, "_bluefog_schedule", schedule)
    with tf.init_scope():
        counter = tf.Variable(0, dtype=tf.int64, trainable=False,
                              name=f"{new.name}_bluefog_steps")
        # (any weight knob set, force_barrier): what a traced step reads of the knobs.
        flags = tf.Variable([False, False], trainable=False,
                            name=f"{new.name}_bluefog_knob_flags")
    # Not tracked: the counter only sets the phase of the schedule, it is no optimizer state;
    # the knobs are set per step by the training loop.
    object.__setattr__(new, "_bluefog_counter", counter)
    object.__setattr__(new, "_bluefog_knob_flags", flags)
    object.__setattr__(new, "_bluefog_knob_values", dict(optimizer_knobs.KNOBS))
    object.__setattr__(new, "_bluefog_knob_mirror", (False, False))
    return new


def DistributedAdaptThenCombineOptimizer(optimizer, model=None, communication_type=DEFAULT,
                                         num_steps_per_communication: int = 1,
                                         name: Optional[str] = None, schedule=None):
    """Local step, then replace the variables by their combination over neighbours.

    ``x_new = combine(step(x, g))``. Returns a new optimizer of a subclass of ``optimizer``'s
    class with the same configuration (and state, when already built).

    Args:
        optimizer: a Keras 3 optimizer instance (not yet wrapped by bluefog).
        model: Bluefog's argument, accepted for its signature (a Keras model or None; the
            variables combined are those ``apply`` receives). A string or
            ``CommunicationType`` in this place is taken as ``communication_type``.
        communication_type: ``"neighbor_allreduce"`` (default),
            ``"hierarchical_neighbor_allreduce"``, ``"allreduce"`` or ``"empty"``, or a
            ``bf.CommunicationType`` member or its value string.
        num_steps_per_communication: communicate on every n-th step only (n >= 1).
        name: prefix of the collective requests' names; must be equal on every rank.
        schedule: None (the static topology) or an endless iterator yielding, per
            communication, ``(send, recv)``: ranks for ``"neighbor_allreduce"``, machines for
            ``"hierarchical_neighbor_allreduce"``, e.g.
            ``topology_util.GetDynamicOnePeerSendRecvRanks(bf.load_topology(), bf.rank())``.
            Each communication averages uniformly over this rank (machine) and ``recv``.

    Raises:
        ValueError: for an unknown communication type, n < 1, something that is not a Keras
            optimizer instance, an optimizer already wrapped by bluefog, or a schedule that is
            not an iterator or goes with another communication type.
    """
    communication_type = split_model(model, communication_type, "neighbor_allreduce")
    return wrap(optimizer, "atc", communication_type, num_steps_per_communication, name,
                "DistributedAdaptThenCombineOptimizer", schedule=schedule)


def DistributedAdaptWithCombineOptimizer(optimizer, model=None, communication_type=DEFAULT,
                                         num_steps_per_communication: int = 1,
                                         name: Optional[str] = None, schedule=None):
    """Combination of the pre-step variables plus the local update.

    ``x_new = combine(x) + (step(x, g) - x)``: the exchange uses the values from before the step,
    so it does not wait for the local update. Arguments and errors as for
    ``DistributedAdaptThenCombineOptimizer``.
    """
    communication_type = split_model(model, communication_type, "neighbor_allreduce")
    return wrap(optimizer, "awc", communication_type, num_steps_per_communication, name,
                "DistributedAdaptWithCombineOptimizer", schedule=schedule)


def DistributedNeighborAllreduceOptimizer(optimizer, num_steps_per_communication: int = 1,
                                          name: Optional[str] = None, schedule=None):
    """``DistributedAdaptThenCombineOptimizer(optimizer, "neighbor_allreduce", ...)``.

    In Bluefog's torch API this name is the deprecated alias of the adapt-*with*-combine
    optimizer; here it is adapt-then-combine, and a UserWarning says so. Call
    ``DistributedAdaptWithCombineOptimizer`` or ``DistributedAdaptThenCombineOptimizer`` to
    choose explicitly.
    """
    warnings.warn("bluefog DistributedNeighborAllreduceOptimizer is adapt-then-combine here "
                  "(Bluefog's torch alias is adapt-with-combine); call "
                  "DistributedAdaptThenCombineOptimizer or DistributedAdaptWithCombineOptimizer "
                  "to choose explicitly", UserWarning, stacklevel=2)
    return wrap(optimizer, "atc", "neighbor_allreduce", num_steps_per_communication, name,
                "DistributedNeighborAllreduceOptimizer", schedule=schedule)
