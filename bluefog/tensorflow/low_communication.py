"""Training that communicates every ``sync_every`` steps instead of every step.

Both wrap a Keras 3 optimizer (``model.compile``/``model.fit`` and custom loops, eager or inside
``tf.function``). Between syncs every rank steps on its own data with the wrapped optimizer and
sends nothing:

* ``LocalSGD``: every ``H``-th step the model's variables are replaced by their average over the
  ranks.
* ``DiLoCo``: the ranks remember the model of the last sync (the anchor). Every ``H``-th step the
  outer gradient ``anchor - current`` is averaged over the ranks (optionally compressed) and
  applied to the anchor by an outer optimizer (Nesterov SGD by default); the result becomes
  both the new anchor and the model on every rank. Inner optimizer state stays local, outer
  optimizer state is kept on every rank (identical under ``averaging="allreduce"``).

``averaging`` chooses the collective of a sync: ``"allreduce"`` (every rank ends the sync with
the same model), ``"neighbor"`` (``neighbor_allreduce`` over the topology of ``bf.set_topology``)
or ``"hierarchical_neighbor"`` (mean within each machine, neighbour combination between machines;
``bf.set_machine_topology``). With the neighbour kinds the ranks' models differ by design.

At its first step an optimizer checks that every rank chose the same settings (one small
allgather) and sets the synced variables to rank 0's values (one broadcast), so all ranks start
from one model. Only the floating-point variables handed to ``apply`` (in ``model.fit``: the
trainable weights) are synced; non-trainable state such as normalisation statistics stays local.

Naming: the sync's collectives are named ``"<prefix>.<k>"`` (``prefix``: ``name``, default the
wrapper's name plus the Keras optimizer's name), as for the decentralized optimizers; ranks must
build their optimizers in the same order or pass the same ``name``.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional

import numpy as np
import tensorflow as tf

from bluefog.common import basics
from bluefog.tensorflow import averaging as averaging_mod
from bluefog.tensorflow import decentralized, mpi_ops, wrapping
from bluefog.tensorflow import variables as variables_mod
from bluefog.tensorflow.compression import NoneCompressor, ReducingCompressor
from bluefog.tensorflow.compression import check as compression_check
from bluefog.tensorflow.op_rules import rank_str

__all__ = ["AVERAGING", "LocalSGD", "DiLoCo"]

# The averaging kinds, and the decentralized communication type each one runs.
AVERAGING = ("allreduce", "neighbor", "hierarchical_neighbor")
_COMMUNICATION = {"allreduce": "allreduce", "neighbor": "neighbor_allreduce",
                  "hierarchical_neighbor": "hierarchical_neighbor_allreduce"}
_KINDS = ("LocalSGD", "DiLoCo")
# What the ranks must agree on, in the order of the allgathered row.
_SETTINGS = ("optimizer", "sync_every", "averaging", "number of synced variables",
             "number of synced elements")
_AGREE_NAME = "bluefog.low_communication.agree"


def _decode(setting: str, code: int) -> str:
    if setting == "optimizer":
        return _KINDS[code] if 0 <= code < len(_KINDS) else str(code)
    if setting == "averaging":
        return repr(AVERAGING[code]) if 0 <= code < len(AVERAGING) else str(code)
    return str(code)


def _agree(row: List[int], what: str) -> None:
    """Raises ValueError on every rank unless every rank passes the same ``row`` (one
    allgather); the error names the first setting that differs and every rank's value."""
    table = mpi_ops.allgather(tf.constant([row], tf.int64), name=_AGREE_NAME).numpy()
    for j, setting in enumerate(_SETTINGS):
        column = table[:, j]
        if np.any(column != column[0]):
            values = ", ".join(f"rank {r}: {_decode(setting, int(c))}"
                               for r, c in enumerate(column))
            raise ValueError(f"rank {rank_str()}: bluefog {what}: the ranks disagree on "
                             f"{setting} ({values}); every rank must wrap the same model with "
                             "the same settings")


def _payload_bytes(variables, compression) -> int:
    """Bytes this rank hands to one sync's collective: the synced variables after
    ``compression`` (traced on a placeholder in a scratch graph, so nothing runs and no
    compressor state changes). A compressed size unknown before run time counts as the
    uncompressed size, as do compressors with collectives of their own (``int8``, ``topk``...:
    ``bf.compression_stats()`` counts what they send)."""
    total = 0
    for v in variables:
        shape, dtype = tf.TensorShape(v.shape), tf.as_dtype(v.dtype)
        plain = shape.num_elements() * dtype.size
        if compression is NoneCompressor or isinstance(compression, ReducingCompressor):
            total += plain
            continue
        with tf.Graph().as_default():
            sent, _ = compression.compress(tf.zeros(shape, dtype))
        sizes = [(t.shape.num_elements(), t.dtype.size) for t in tf.nest.flatten(sent)]
        total += (plain if any(n is None for n, _ in sizes)
                  else sum(n * itemsize for n, itemsize in sizes))
    return total


def read(variable) -> tf.Tensor:
    return decentralized.read(variable)


class LowCommunicationKerasOptimizer(wrapping.BluefogKerasOptimizer):
    """Mixin in front of a Keras optimizer class: ``apply`` steps locally and syncs every
    ``sync_every`` steps (``_bluefog_kind``: ``"LocalSGD"`` or ``"DiLoCo"``)."""

    _bluefog_kind: str = ""
    # Between syncs the ranks' models differ by design: ReplicaCheckCallback reports their
    # spread instead of raising.
    _bluefog_replicas_differ = True

    @property
    def sync_every(self) -> int:
        """Steps between two syncs."""
        return self._bluefog_every

    @property
    def averaging(self) -> str:
        """The collective of a sync: ``"allreduce"``, ``"neighbor"`` or
        ``"hierarchical_neighbor"``."""
        return self._bluefog_averaging

    @property
    def outer_optimizer(self):
        """DiLoCo's outer optimizer (None for LocalSGD)."""
        return self._bluefog_outer

    def communication_stats(self) -> Dict[str, Any]:
        """What this rank has sent so far: ``steps`` (calls of ``apply``), ``syncs``,
        ``bytes_sent`` (payload handed to the sync collectives, after compression, summed over
        syncs), ``bytes_per_sync``, ``sync_every`` and ``averaging``. One rank sends nothing.
        The first step's agreement check and broadcast are not counted. Call it eagerly
        (between steps or after ``fit``)."""
        return {"steps": int(self._bluefog_steps.numpy()),
                "syncs": int(self._bluefog_syncs.numpy()),
                "bytes_sent": int(self._bluefog_bytes.numpy()),
                "bytes_per_sync": self._bluefog_bytes_per_sync,
                "sync_every": self._bluefog_every,
                "averaging": self._bluefog_averaging}

    def _bluefog_start(self, synced: List) -> None:
        """Once, on the first step (eagerly, even while a step is traced): the agreement
        check, rank 0's model on every rank, DiLoCo's anchor and outer optimizer."""
        if self._bluefog_synced is not None:
            if len(synced) != len(self._bluefog_synced):
                raise ValueError(
                    f"rank {rank_str()}: bluefog {self._bluefog_what}: apply was given "
                    f"{len(synced)} floating-point variables, but {len(self._bluefog_synced)} "
                    "at its first step; one optimizer trains one model")
            return
        with tf.init_scope():
            row = [_KINDS.index(self._bluefog_kind), self._bluefog_every,
                   AVERAGING.index(self._bluefog_averaging), len(synced),
                   sum(int(np.prod(v.shape)) for v in synced)]
            if basics.size() > 1:
                _agree(row, self._bluefog_what)
                variables_mod.broadcast_variables(synced, root_rank=0)
            payload = _payload_bytes(synced, self._bluefog_compression)
            object.__setattr__(self, "_bluefog_bytes_per_sync",
                               payload if basics.size() > 1 else 0)
            if self._bluefog_kind == "DiLoCo":
                keras = wrapping.import_keras()
                anchors = [keras.Variable(read(v), dtype=v.dtype, name=f"diloco_anchor_{i}")
                           for i, v in enumerate(synced)]
                self._bluefog_outer.build(anchors)
                object.__setattr__(self, "_bluefog_anchors", anchors)
        object.__setattr__(self, "_bluefog_synced", list(synced))

    def _bluefog_average(self, values: List[tf.Tensor]) -> List[tf.Tensor]:
        prefix = self._bluefog_prefix
        if self._bluefog_averaging != "allreduce":
            return decentralized._combine(values, _COMMUNICATION[self._bluefog_averaging],
                                          prefix)
        k = averaging_mod.next_graph_index(prefix) if not tf.executing_eagerly() else 0
        return mpi_ops.grouped_allreduce(values, average=True, name=f"{prefix}.{k}",
                                         compression=self._bluefog_compression)

    def _bluefog_sync(self, synced: List) -> tf.Tensor:
        values = [read(v) for v in synced]
        if self._bluefog_kind == "LocalSGD":
            if basics.size() > 1:
                for v, mean in zip(synced, self._bluefog_average(values)):
                    v.assign(mean)
        else:
            anchors = self._bluefog_anchors
            deltas = [read(a) - x for a, x in zip(anchors, values)]
            if basics.size() > 1:
                deltas = self._bluefog_average(deltas)
            self._bluefog_outer.apply(deltas, anchors)
            for v, a in zip(synced, anchors):
                v.assign(read(a))
        self._bluefog_syncs.assign_add(1)
        self._bluefog_bytes.assign_add(self._bluefog_bytes_per_sync)
        return tf.constant(True)

    @tf.autograph.experimental.do_not_convert
    def apply(self, grads, trainable_variables=None):
        grads = list(grads)
        if trainable_variables is not None:
            variables = list(trainable_variables)
        else:
            variables = wrapping.trainable_variables(self) if self.built else None
        if not grads or variables is None:
            return super().apply(grads, trainable_variables)
        synced = [v for v in variables if tf.as_dtype(v.dtype).is_floating]
        self._bluefog_start(synced)
        result = super().apply(grads, trainable_variables)
        step = self._bluefog_steps.assign_add(1)
        if tf.executing_eagerly():
            if int(step) % self._bluefog_every == 0:
                self._bluefog_sync(synced)
        elif self._bluefog_every == 1:
            self._bluefog_sync(synced)
        else:
            due = tf.equal(tf.math.floormod(step, self._bluefog_every), 0)
            tf.cond(due, lambda: self._bluefog_sync(synced), lambda: tf.constant(False))
        return result


def _wrap(optimizer, kind: str, sync_every, averaging, compression, outer, name):
    what = kind
    if isinstance(sync_every, bool) or not isinstance(sync_every, (int, np.integer)) \
            or sync_every < 1:
        raise ValueError(f"rank {rank_str()}: bluefog {what}: sync_every must be an int >= 1 "
                         f"(steps between two syncs), got {sync_every!r}")
    if not isinstance(averaging, str) or averaging not in AVERAGING:
        raise ValueError(f"rank {rank_str()}: bluefog {what}: averaging must be one of "
                         f"{', '.join(repr(a) for a in AVERAGING)}, got {averaging!r}")
    compression = compression_check(compression, f"bluefog {what}")
    if compression is not NoneCompressor and averaging != "allreduce":
        raise ValueError(f"rank {rank_str()}: bluefog {what}: compression works with "
                         f"averaging='allreduce' only, got averaging={averaging!r}")
    averaging_mod.check_name(name, what)
    wrapping.check_plain_optimizer(optimizer, what)
    if outer is not None:
        wrapping.check_plain_optimizer(outer, what, "outer_optimizer")
        if outer is optimizer:
            raise ValueError(f"bluefog {what}: the outer optimizer must be another instance "
                             "than the inner optimizer")
        if outer.built:
            raise ValueError(f"bluefog {what}: outer_optimizer is already built; pass a fresh "
                             "one (DiLoCo builds it on its copy of the model)")
    averaging_mod.check_initialized(what)
    cls = wrapping.derived_class(LowCommunicationKerasOptimizer, type(optimizer),
                                 {"_bluefog_kind": kind})
    new = wrapping.copy_optimizer(optimizer, cls, what)
    with tf.init_scope():
        counters = [tf.Variable(0, dtype=tf.int64, trainable=False,
                                name=f"{new.name}_bluefog_{c}")
                    for c in ("steps", "syncs", "bytes")]
    # Plain attributes, not tracked by Keras: a model saved with this optimizer stores the plain
    # optimizer's state only.
    prefix = name or wrapping.collective_prefix(f"{what}.{type(optimizer).__name__}")
    attributes = {"_bluefog_every": int(sync_every), "_bluefog_averaging": averaging,
                  "_bluefog_compression": compression, "_bluefog_outer": outer,
                  "_bluefog_prefix": prefix, "_bluefog_what": what,
                  "_bluefog_steps": counters[0], "_bluefog_syncs": counters[1],
                  "_bluefog_bytes": counters[2], "_bluefog_bytes_per_sync": 0,
                  "_bluefog_synced": None, "_bluefog_anchors": None}
    for key, value in attributes.items():
        object.__setattr__(new, key, value)
    return new


def LocalSGD(optimizer, sync_every: int, averaging: str = "allreduce",
             name: Optional[str] = None):
    """``optimizer`` stepping locally, with the model averaged over the ranks every
    ``sync_every`` steps.

    Returns a new optimizer of a subclass of ``optimizer``'s class with the same configuration
    (and state, when built), for ``model.compile`` or ``apply_gradients``. Every rank must pass
    the same ``sync_every`` and ``averaging`` (checked at the first step).

    Args:
        optimizer: a Keras 3 optimizer instance (not yet wrapped by bluefog).
        sync_every: steps between two syncs (H >= 1; 1 averages the model every step).
        averaging: ``"allreduce"``, ``"neighbor"`` or ``"hierarchical_neighbor"``.
        name: prefix of the collective requests' names; equal on every rank.

    Raises:
        ValueError: for ``sync_every`` < 1, an unknown ``averaging``, something that is not a
            Keras optimizer instance or one already wrapped by bluefog; at the first step, on
            every rank, when the ranks disagree on a setting.
    """
    return _wrap(optimizer, "LocalSGD", sync_every, averaging, None, None, name)


def DiLoCo(inner_optimizer, outer_optimizer=None, *, sync_every: int,
           averaging: str = "allreduce", compression=None, name: Optional[str] = None):
    """``inner_optimizer`` stepping locally; every ``sync_every`` steps an outer step of
    ``outer_optimizer`` on the averaged change since the last sync.

    At a sync, the outer gradient ``anchor - current`` (``anchor``: the model of the last sync)
    is averaged over the ranks, ``outer_optimizer`` applies it to the anchor, and the new
    anchor is the model on every rank. With ``sync_every=1``, an inner ``SGD(lr)`` and an outer
    ``SGD(1.0)`` this is data-parallel SGD. Returns the wrapped inner optimizer (as
    ``LocalSGD``); its ``outer_optimizer`` attribute is the outer one.

    Args:
        inner_optimizer: a Keras 3 optimizer instance (not yet wrapped by bluefog).
        outer_optimizer: a fresh Keras 3 optimizer instance; default
            ``keras.optimizers.SGD(learning_rate=0.7, momentum=0.9, nesterov=True)``.
        sync_every: steps between two syncs (H >= 1).
        averaging: ``"allreduce"``, ``"neighbor"`` or ``"hierarchical_neighbor"``.
        compression: None or a compressor (``bf.Compression.fp16``, ``.bf16``, or any object
            with ``compress``/``decompress``) for the outer gradient's allreduce
            (``averaging="allreduce"`` only).
        name: prefix of the collective requests' names; equal on every rank.

    Raises:
        ValueError: as ``LocalSGD``, and for an outer optimizer that is already built, is the
            inner one, or goes with compression over a neighbour averaging.
        TypeError: for an object that cannot compress.
    """
    if outer_optimizer is None:
        keras = wrapping.import_keras()
        outer_optimizer = keras.optimizers.SGD(learning_rate=0.7, momentum=0.9, nesterov=True)
    return _wrap(inner_optimizer, "DiLoCo", sync_every, averaging, compression,
                 outer_optimizer, name)
