"""The compiled TensorFlow ops and what every Python wrapper needs to call them.

``ops`` is the loaded ``libbluefog_tf.so`` (``ops.bluefog_allreduce``, ...). The helpers give
every request a name that matches across ranks and turn names and small lists into op inputs
cheaply. ``mpi_ops``, ``neighbor_ops`` and ``objects`` build on this module.
"""

from __future__ import annotations

import collections
import contextlib
import threading
from typing import Optional

import tensorflow as tf

from bluefog.common import basics, library
from bluefog.common.process_sets import ProcessSet, global_process_set, process_set_by_id
from bluefog.tensorflow import compat, op_rules

__all__ = ["ops", "request_name", "name_input", "const_input", "forward_name", "device_scope",
           "process_set_attrs", "set_size", "set_rank"]

# Checked against the installed TensorFlow first: a build for another release fails clearly.
ops = compat.load_ops(library.library_dir())


def _allow_concurrent_collectives_in_functions() -> None:
    """Lets tf.function run independent collectives concurrently.

    The ops are stateful (so grappler never constant-folds or merges them), and tf.function
    chains stateful ops in program order, which would run a step's gradient allreduces one at a
    time and defeat fusion. The runtime matches requests by name, so their order does not matter:
    declare them order-insensitive, as TensorFlow does for its own collectives.
    """
    # TensorFlow's only hook for this is a private module's set; nothing else in bluefog
    # touches TensorFlow internals of this kind.
    from tensorflow.python.framework import auto_control_deps

    # "Must run, order-insensitive": not chained to other stateful ops, but still run even when
    # nothing consumes the result (another rank may be waiting for this collective).
    must_run = getattr(auto_control_deps, "MUST_RUN_ORDER_INSENSITIVE_STATEFUL_OPS", None)
    if isinstance(must_run, frozenset):
        auto_control_deps.MUST_RUN_ORDER_INSENSITIVE_STATEFUL_OPS = (
            must_run | op_rules.tf_op_types())


_allow_concurrent_collectives_in_functions()

_lock = threading.Lock()
# Names held by non-blocking handles from their call until their synchronize (program order,
# the same on every rank, unlike when each rank's collective finishes), with what holds them.
# Only the thread issuing that handle's collective (`_issuing.name`) may use a held name.
_reserved: dict = {}
_issuing = threading.local()


def reserve_name(name: str, holder: str, error_prefix: str) -> None:
    """Holds `name` for a non-blocking handle (described by `holder`) until `release_name`:
    ValueError (after `error_prefix`) when another handle holds it, which every rank issuing
    the same calls in the same order raises alike."""
    with _lock:
        if name in _reserved:
            raise ValueError(f"{error_prefix}: {_reserved[name]} has this name and is not yet "
                             "synchronized; synchronize it first or give this collective "
                             "another name")
        _reserved[name] = holder
        _name_tensors.pop(name, None)  # so that the lean eager path checks the name too


def release_name(name: str) -> None:
    with _lock:
        _reserved.pop(name, None)
_name_counters: dict = {}


def _forget_counters() -> None:
    # A new job (elastic reset): every rank, old or new, numbers its unnamed requests from 0.
    with _lock:
        _name_counters.clear()


basics.register_reinit_hook(_forget_counters)


def request_name(op: str, name: Optional[str]) -> str:
    """The name every rank uses to match this request of ``op``.

    A given ``name`` must be a non-empty str without NUL characters (ValueError otherwise) and
    is returned as is.
    Without a name, the n-th unnamed call of ``op`` in this process is called "op.noname.n": it
    matches across ranks as long as every rank issues its unnamed collectives in one order.
    """
    if name is not None:
        if not isinstance(name, str) or not name:
            raise ValueError(f"{op_rules.op_error_prefix(op)}: name must be a non-empty str or "
                             f"None, got {name!r}")
        if "\0" in name:
            shown = name.replace("\0", "\\0")
            raise ValueError(f"{op_rules.op_error_prefix(op, shown)}: the name contains a NUL "
                             "character, where a C string would end; pass a name without \\0")
        if name in _reserved and getattr(_issuing, "name", None) != name:
            raise ValueError(f"{op_rules.op_error_prefix(op, name)}: {_reserved[name]} has this "
                             "name and is not yet synchronized; synchronize it first or give "
                             "this collective another name")
        return name
    with _lock:
        n = _name_counters.get(op, 0)
        _name_counters[op] = n + 1
    return f"{op}.noname.{n}"


def check_not_xla(name: str) -> None:
    """Raises, at trace time, when a collective is being traced into a function that XLA
    compiles (``tf.function(jit_compile=True)``, ``model.compile(jit_compile=True)``): XLA
    cannot compile bluefog's ops, and TensorFlow would fail later with an error deep inside."""
    if not _in_xla_context():
        return
    raise ValueError(
        f"rank {_rank_or_unknown()}: bluefog request '{name}' is inside a function compiled by "
        f"XLA (tf.function(jit_compile=True) or model.compile(jit_compile=True)), which cannot "
        f"compile bluefog's collectives. Run the collective outside the compiled function: "
        f"for Keras, model.compile(..., jit_compile=False) with bf.DistributedOptimizer; for a "
        f"custom loop, jit-compile only the forward/backward computation and call "
        f"DistributedGradientTape.gradient / the collective / optimizer.apply_gradients in a "
        f"plain tf.function around it.")


def _in_xla_context() -> bool:
    try:
        from tensorflow.python.framework import ops as tf_ops
        from tensorflow.python.ops import control_flow_util
    except ImportError:  # pragma: no cover - private modules present in TF 2.16-2.21
        return False
    return control_flow_util.GraphOrParentsInXlaContext(tf_ops.get_default_graph())


def _rank_or_unknown():
    return basics.rank() if basics.is_initialized() else "?"


_name_tensors: collections.OrderedDict[str, tf.Tensor] = collections.OrderedDict()
_CACHE_SIZE = 4096


def name_input(name: str):
    """The op's name input. In eager mode a ready string tensor: handing the generated op a
    Python str makes TensorFlow take its slow dispatch path (~50 us more per call)."""
    if not tf.executing_eagerly():
        check_not_xla(name)
        return name
    with _lock:
        t = _name_tensors.get(name)
        if t is not None:
            _name_tensors.move_to_end(name)
            return t
    t = tf.constant(name)
    if ".noname." not in name and name not in _reserved:  # unnamed calls never repeat a name
        with _lock:
            _name_tensors[name] = t
            if len(_name_tensors) > _CACHE_SIZE:
                _name_tensors.popitem(last=False)
    return t


_consts: collections.OrderedDict[tuple, tf.Tensor] = collections.OrderedDict()


# Eager allreduce/allgather/broadcast over every rank may run on the calling thread (the core
# decides: BLUEFOG_EAGER_INLINE, docs/env.md); graph ops join one round at most
# (BLUEFOG_GRAPH_JOIN_WAIT).
_INLINE_ATTRS = {"eager_inline": True}
_NO_ATTRS: dict = {}


try:  # the type of eager tensors; a private name, so the lean path below is optional
    from tensorflow.python.framework.ops import EagerTensor as _EagerTensor
except ImportError:  # pragma: no cover - every TensorFlow 2.16-2.21 has it
    _EagerTensor = None

def eager_name(tensor, name, op: str):
    """For the lean path of an eager call with every other argument at its default: the name
    input cached for ``name`` (by an earlier call through the full path), when ``tensor`` is an
    eager tensor of a dtype ``op`` accepts, the call is eager and may run inline. Otherwise
    None, and the caller takes its full path, which checks everything and reports what is wrong.

    The checks the full path makes are each cheap, but together they cost about 8 us of an eager
    call's 26 us above TensorFlow's own dispatch (measured on the development VM; see
    docs/benchmarks.md). The cache's order is not refreshed here: a name used often is then
    made again after 4096 others, which costs one call through the full path.
    """
    if type(tensor) is not _EagerTensor or type(name) is not str:
        return None
    t = _name_tensors.get(name)
    if t is None or name in _reserved:
        return None
    if tensor.dtype not in op_rules.accepted_dtypes(op) or not tf.executing_eagerly():
        return None
    return t


def eager_inline_attrs() -> dict:
    """``{"eager_inline": True}`` when executing eagerly (the caller waits for the result, so
    it may run the collective itself), else nothing: graph ops keep the attr's default."""
    return _INLINE_ATTRS if tf.executing_eagerly() else _NO_ATTRS


def one_device(device, device_dense, device_sparse, prefix: str) -> str:
    """One device from bluefog's ``device`` and Horovod's ``device_dense``/``device_sparse``
    (None counts as ''). bluefog places a call's dense and sparse reductions together, so those
    given must agree: ValueError when they do not, TypeError for a non-str. ``prefix`` starts the
    messages."""
    given = (("device", device), ("device_dense", device_dense), ("device_sparse", device_sparse))
    for label, value in given:
        if value is not None and not isinstance(value, str):
            raise TypeError(f"{prefix}: {label} must be a str such as '' or '/cpu:0', got "
                            f"{value!r}")
    chosen = {label: value for label, value in given if value}
    if len(set(chosen.values())) > 1:
        raise ValueError(f"{prefix}: {', '.join(f'{k}={v!r}' for k, v in chosen.items())}: "
                         "bluefog places a call's dense and sparse reductions on one device; "
                         "pass one of them")
    return next(iter(chosen.values()), "")


def const_input(values, dtype: tf.DType):
    """A small constant op input: a float scalar or a 1-D list (ranks, weights).

    Cached in eager mode, where the same topology lists repeat every step and building a
    tensor costs more than the collective.
    """
    shape = None if isinstance(values, float) else [len(values)]
    if not tf.executing_eagerly():
        return tf.constant(values, dtype, shape=shape)
    key = (dtype, values if isinstance(values, float) else tuple(values))
    with _lock:
        t = _consts.get(key)
        if t is not None:
            return t
    t = tf.constant(values, dtype, shape=shape)
    with _lock:
        _consts[key] = t
        if len(_consts) > _CACHE_SIZE:
            _consts.popitem(last=False)
    return t


def forward_name(op, index: int = -1) -> Optional[str]:
    """The backward request's name: the forward request's (op input ``index``) + ".grad".

    None when the forward name is not known while tracing (the gradient then gets an unnamed
    request).
    """
    value = tf.get_static_value(op.inputs[index])
    if value is None:
        return None
    if hasattr(value, "item"):  # a numpy scalar or 0-d array
        value = value.item()
    return (value.decode() if isinstance(value, bytes) else str(value)) + ".grad"


def _as_set(process_set) -> ProcessSet:
    return process_set_by_id(process_set) if isinstance(process_set, int) else process_set


def process_set_attrs(process_set, what: str) -> dict:
    """The op attributes that run a collective on ``process_set`` (a ProcessSet or its id):
    none for the global set. Raises ValueError for a set that is not registered or that this
    rank is not in (``what`` starts the message)."""
    if process_set is None or process_set is global_process_set or process_set == 0:
        return {}
    if not isinstance(process_set, ProcessSet):
        raise TypeError(f"{what}: process_set must be a bf.ProcessSet, got {process_set!r}")
    if process_set.process_set_id is None:
        raise ValueError(f"{what}: {process_set} is not registered; call "
                         "bf.add_process_set on every rank first")
    if not process_set.included():
        raise ValueError(f"{what}: rank {basics.rank()} is not in {process_set}; only its ranks "
                         "may call its collectives")
    return {"process_set_id": process_set.process_set_id}


def set_size(process_set) -> int:
    """The number of ranks of ``process_set`` (a ProcessSet, its id, or None: every rank)."""
    if process_set is None:
        return basics.size()
    return _as_set(process_set).size()


def set_rank(process_set) -> int:
    """This rank's index in ``process_set`` (as for ``set_size``)."""
    if process_set is None:
        return basics.rank()
    return _as_set(process_set).rank()


def device_scope(device: str):
    """``tf.device(device)``, or no scope for ``''`` (default placement)."""
    return tf.device(device) if device else contextlib.nullcontext()
