"""Committed training state: what survives a lost host (Horovod's elastic ``State`` API).

``commit()`` copies the state's variables and attributes to memory and to this host's disk
(store.py), then checks for host updates. ``sync()`` makes every rank hold the newest commit
that any rank has, in memory or on its host's disk (or rank 0's current values when there is
none), which is how a new launch picks up where the last one committed and how new hosts get
the state before their first step.
"""

from __future__ import annotations

import copy
from typing import Any, Callable, Dict, Iterable, List, Optional, Tuple

import numpy as np
import tensorflow as tf

from bluefog.common import basics, elastic_env, elastic_rounds
from bluefog.tensorflow import mpi_ops, objects
from bluefog.tensorflow import variables as bf_variables
from bluefog.tensorflow.elastic import interrupts
from bluefog.tensorflow.elastic.store import CommitStore

_RESERVED = frozenset(["commit", "save", "restore", "sync", "check_host_updates", "on_reset",
                       "register_reset_callbacks", "commits", "restored_commit"])

Snapshot = Tuple[int, List[np.ndarray], Dict[str, Any]]  # (commit id, values, attributes)

_collectives = 0  # per-process counter for the names of the state's collectives


def _forget_counter() -> None:
    global _collectives
    _collectives = 0  # a new job: its ranks (some new) number the state's collectives alike


basics.register_reinit_hook(_forget_counter)


def _name(what: str) -> str:
    global _collectives
    _collectives += 1
    return f"bluefog.elastic.{what}.{_collectives}"


def _check_initialized(what: str) -> None:
    if not basics.is_initialized():
        raise ValueError(f"bluefog elastic {what}: bluefog is not initialized; call bf.init() "
                         "first")


class State:
    """Base of the elastic states: user attributes (``epoch=0, batch=0, ...``) plus, in the
    subclasses, variables. Every rank must create the same state with the same attributes and
    call ``commit()`` / ``sync()`` at the same points.

    Attributes passed to the constructor are committed with the state (deep copies, so they
    must be picklable); attributes added later are not.
    """

    def __init__(self, **kwargs: Any):
        bad = sorted(_RESERVED.intersection(kwargs))
        if bad:
            raise ValueError(f"bluefog elastic State: attribute name(s) {bad} are method names "
                             "of the state; choose other names")
        self._attr_names = list(kwargs)
        for name, value in kwargs.items():
            setattr(self, name, value)
        self._reset_callbacks: List[Callable[[], None]] = []
        self._commit_id = -1
        self._saved: Optional[Snapshot] = None
        folder = elastic_env.state_dir()
        self._store = CommitStore(folder) if folder else None
        self.restored_commit = False  # set by sync(): whether it took a commit not its own

    # -- what the subclasses define ------------------------------------------------------------

    def _variables(self) -> List[Any]:
        """The variables committed with the state (tf.Variable or keras.Variable)."""
        return []

    # -- Horovod's API -------------------------------------------------------------------------

    @property
    def commits(self) -> int:
        """How many commits this job has made (across launches; 0 before the first)."""
        return self._commit_id + 1

    def register_reset_callbacks(self, callbacks: Iterable[Callable[[], None]]) -> None:
        """Functions called (without arguments) after the job was relaunched with a new set of
        ranks, once the state is restored: e.g. to rescale the learning rate to ``bf.size()``."""
        callbacks = list(callbacks)
        for cb in callbacks:
            if not callable(cb):
                raise TypeError(f"bluefog elastic register_reset_callbacks: {cb!r} is not "
                                "callable")
        self._reset_callbacks += callbacks

    def on_reset(self) -> None:
        for cb in self._reset_callbacks:
            cb()

    def save(self) -> None:
        """Copies the current values to memory (this rank only; no communication)."""
        self._saved = (self._commit_id, self._values(), self._attrs())

    def restore(self) -> None:
        """Sets the variables and attributes back to the last ``save()``/``commit()``."""
        if self._saved is None:
            raise ValueError("bluefog elastic restore: nothing was saved or committed yet")
        self._load(self._saved)

    def commit(self) -> None:
        """Saves the state (memory, and this host's disk under an elastic bfrun), then checks
        for host updates (may raise ``HostsUpdatedInterrupt``). Every rank must call it at the
        same point: it contains one allreduce."""
        _check_initialized("commit")
        self._commit_id += 1
        self.save()
        if self._store is not None and basics.local_rank() == 0:
            self._store.write(*self._saved, names=[_var_name(v) for v in self._variables()])
        self.check_host_updates()

    def check_host_updates(self) -> None:
        """Raises ``HostsUpdatedInterrupt`` on every rank when any rank got the driver's
        notice that hosts were added or removed. One allreduce: every rank must call it."""
        _check_initialized("check_host_updates")
        if elastic_rounds.active():  # bfrun --gloo --min-np: a newer round waits in the store
            mine = 1 if elastic_rounds.hosts_updated() is not None else 0
        else:
            mine = 1 if interrupts.pending() else 0
        total = mpi_ops.allreduce(tf.constant(mine, tf.int32), average=False,
                                  name=_name("hosts_updated"))
        if int(total) > 0:
            interrupts.clear()
            raise HostsUpdatedInterrupt(
                f"hosts were added or removed (noticed by {int(total)} rank(s)); the state is "
                f"committed (commit {self.commits})")

    def sync(self) -> None:
        """Every rank takes the newest commit any rank holds (in memory or on its host's disk);
        with no commit anywhere, rank 0's current values. Collective: every rank must call it.
        Afterwards ``restore()`` returns to the synced values."""
        _check_initialized("sync")
        variables = self._variables()
        best = self._saved if self._saved is not None and self._saved[0] >= 0 else None
        problem = ""
        try:
            found = self._store.read() if self._store is not None else None
        except ValueError as e:  # malformed: every rank must hear of it, in the allgather
            found, problem = None, str(e)
        if found is not None:
            disk = (int(found["commit"]), list(found["values"]), dict(found["attrs"]))
            problem = self._mismatch(disk, variables, found.get("names"))
            if not problem and (best is None or disk[0] > best[0]):
                best = disk
        my_id = -2 if problem else (best[0] if best is not None else -1)
        held = self._saved[0] if self._saved is not None else -1
        gathered = mpi_ops.allgather(tf.constant([[my_id, held]], tf.int64),
                                     name=_name("sync.ids")).numpy()
        ids = gathered[:, 0]
        if (ids == -2).any():  # every rank sees it: each raises the first bad rank's reason
            bad = [int(r) for r in np.flatnonzero(ids == -2)]
            reasons = objects.allgather_object(problem, name=_name("sync.problems"))
            raise ValueError(f"bluefog elastic sync: the commit on the host(s) of rank(s) {bad} "
                             f"does not fit this state: rank {bad[0]}: {reasons[bad[0]]}. "
                             "Delete the state folder to start afresh.")
        newest = int(ids.max())
        root = int(np.flatnonzero(ids == newest)[0]) if newest >= 0 else 0
        # The root alone loads; if that fails, the others must not wait for its broadcasts.
        failure = ""
        if basics.rank() == root and newest >= 0:
            try:
                self._load(best)
            except Exception as e:  # noqa: BLE001 - reported on every rank just below
                failure = f"{type(e).__name__}: {e}"
        if basics.size() > 1:
            failure = objects.broadcast_object(failure if basics.rank() == root else None,
                                               root_rank=root, name=_name("sync.loaded"))
        if failure:
            raise ValueError(f"bluefog elastic sync: rank {root} could not load commit "
                             f"{newest}, the newest, so no rank took it: {failure}. Delete the "
                             "state folder to start afresh.")
        if variables and basics.size() > 1:
            bf_variables.broadcast_variables(variables, root_rank=root)
        attrs = objects.broadcast_object(self._attrs() if basics.rank() == root else None,
                                         root_rank=root, name=_name("sync.attrs"))
        for name, value in attrs.items():
            setattr(self, name, value)
        self._commit_id = max(newest, -1)
        # From an earlier launch (or another rank), not this process's own last commit: the
        # same answer on every rank, since it is computed from the gathered numbers.
        self.restored_commit = newest > int(gathered[:, 1].min())
        self.save()

    # -- internals -----------------------------------------------------------------------------

    def _attrs(self) -> Dict[str, Any]:
        return {name: copy.deepcopy(getattr(self, name)) for name in self._attr_names}

    def _values(self) -> List[np.ndarray]:
        return [np.array(v.numpy(), copy=True) for v in self._variables()]

    def _mismatch(self, snapshot: Snapshot, variables: List[Any],
                  names: Optional[List[str]] = None) -> str:
        """Why ``snapshot`` cannot be loaded into ``variables`` without changing a value, or
        "" when it can: a cast (an int committed into a float variable) would not be noticed
        later, so dtypes must match exactly, like counts and shapes."""
        _, values, attrs = snapshot
        if len(values) != len(variables):
            return f"it holds {len(values)} variables, the state has {len(variables)}"
        for j, (value, v) in enumerate(zip(values, variables)):
            committed = f" (committed as {names[j]})" if names else ""
            if tuple(value.shape) != tuple(v.shape):
                return (f"variable {j} ({_var_name(v)}) has shape {tuple(v.shape)}, the "
                        f"commit {tuple(value.shape)}{committed}")
            if _dtype_name(value.dtype) != _dtype_name(v.dtype):
                return (f"variable {j} ({_var_name(v)}) has dtype {_dtype_name(v.dtype)}, the "
                        f"commit {_dtype_name(value.dtype)}{committed}")
        if sorted(attrs) != sorted(self._attr_names):
            return f"it has attributes {sorted(attrs)}, the state {sorted(self._attr_names)}"
        return ""

    def _load(self, snapshot: Snapshot) -> None:
        commit_id, values, attrs = snapshot
        variables = self._variables()
        problem = self._mismatch(snapshot, variables)
        if problem:
            raise ValueError(f"bluefog elastic: cannot restore the commit: {problem}")
        for v, value in zip(variables, values):
            v.assign(value)
        for name, value in attrs.items():
            setattr(self, name, copy.deepcopy(value))
        self._commit_id = commit_id


HostsUpdatedInterrupt = interrupts.HostsUpdatedInterrupt


def _var_name(v: Any) -> str:
    return str(getattr(v, "path", getattr(v, "name", "?")))


def _dtype_name(dtype: Any) -> str:
    try:
        return tf.as_dtype(dtype).name
    except TypeError:  # a numpy dtype TensorFlow has no name for (object, say)
        return str(dtype)


class ObjectState(State):
    """Only Python attributes: ``ObjectState(epoch=0, batch=0, best=None)``."""


class TensorFlowState(State):
    """``tf.Variable`` / ``keras.Variable`` values plus attributes:
    ``TensorFlowState(model.weights + opt.variables, epoch=0, batch=0)``. Every rank must pass
    the same variables in the same order."""

    def __init__(self, variables: Optional[Iterable[Any]] = None, **kwargs: Any):
        super().__init__(**kwargs)
        self._vars = list(variables) if variables is not None else []
        for j, v in enumerate(self._vars):
            if not bf_variables._is_variable(v):
                raise TypeError(f"bluefog elastic TensorFlowState: element {j} is a "
                                f"{type(v).__name__}, not a tf.Variable or keras.Variable")

    def _variables(self) -> List[Any]:
        return self._vars


class KerasState(State):
    """A Keras model's weights and its optimizer's variables (slots, iteration count, learning
    rate) plus attributes: ``KerasState(model, optimizer, epoch=0, batch=0)``. ``optimizer``
    defaults to ``model.optimizer``; it is built on the model's trainable variables if it was
    not yet. The model must be built (``keras.Input`` first, or ``model.build``)."""

    def __init__(self, model, optimizer=None, **kwargs: Any):
        import keras

        if not isinstance(model, keras.Model):
            raise TypeError(f"bluefog elastic KerasState: expected a keras.Model, got "
                            f"{type(model).__name__}")
        if optimizer is not None and not isinstance(optimizer, keras.optimizers.Optimizer):
            raise TypeError(f"bluefog elastic KerasState: optimizer must be a Keras optimizer, "
                            f"got {type(optimizer).__name__}")
        super().__init__(**kwargs)
        self.model = model
        self.optimizer = optimizer

    def _variables(self) -> List[Any]:
        if not self.model.weights:
            raise ValueError("bluefog elastic KerasState: the model has no weights yet; build "
                             "it first (keras.Input(...) as its first layer, or model.build)")
        optimizer = self.optimizer if self.optimizer is not None else getattr(
            self.model, "optimizer", None)
        if optimizer is None:
            return list(self.model.weights)
        if not optimizer.built:
            optimizer.build(self.model.trainable_variables)
        return list(self.model.weights) + list(optimizer.variables)


TensorFlowKerasState = KerasState
"""Horovod's name for ``KerasState`` (its TensorFlow 2 elastic examples use it)."""
