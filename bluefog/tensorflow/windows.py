"""One-sided windows: asynchronous neighbour communication (Bluefog's ``win_*`` API).

A window is created on every rank at once (``win_create``) and then used without the other
ranks' participation: ``win_put`` / ``win_accumulate`` write into the out-neighbours' receive
buffers, ``win_get`` reads the in-neighbours' values, and ``win_update`` combines this rank's
value with whatever its buffers hold now, never waiting for anyone. The buffers live in the C++
core and a thread of the core serves the other ranks' writes while this rank computes
(docs/windows.md explains the protocol, versions, mutexes and push-sum weights).

TensorFlow mapping: Bluefog's torch API updates the registered tensor in place. Here a window
is backed by a ``tf.Variable``: the one passed to ``win_create``, or a new non-trainable one when
a tensor is passed (``window_variable(name)`` returns it). ``win_update`` assigns the result to
that variable (unless ``clone=True``) and returns it; ``win_put(..., self_weight=w)`` assigns
``tensor * w`` to it, as torch scales the tensor in place.

``win_create`` and ``win_free`` are collective set-up steps and run eagerly (outside
``tf.function``; inside a trace they run in the eager context through ``tf.init_scope``). The
other operations work eagerly and inside ``tf.function``, in program order.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import threading
import warnings
import weakref
from typing import Dict, List, Optional, Union

import numpy as np
import tensorflow as tf

from bluefog.common import basics, library, topology, topology_util
from bluefog.tensorflow.op_library import const_input, name_input, ops
from bluefog.tensorflow.op_rules import FLOAT_DTYPES, rank_str

__all__ = ["win_create", "win_free", "win_put", "win_put_nonblocking", "win_accumulate",
           "win_accumulate_nonblocking", "win_get", "win_get_nonblocking", "win_update",
           "win_update_then_collect", "win_wait", "win_poll", "win_mutex", "get_win_version",
           "win_associated_p", "turn_on_win_ops_with_associated_p",
           "turn_off_win_ops_with_associated_p", "win_ops_with_associated_p", "window_variable",
           "window_names"]


@dataclasses.dataclass
class _Window:
    variable: tf.Variable
    in_ranks: List[int]
    out_ranks: List[int]
    # win_update's weights when none are given: the topology's (weighted) or uniform, as of
    # win_create.
    self_weight: float
    neighbor_weights: Dict[int, float]
    # The tf.Tensor the window was made from (weakly): Bluefog's in-place idiom, win_put(x)
    # then win_update(name) in a loop, would keep putting it unchanged; warned once.
    source: Optional[weakref.ref] = None
    updated: bool = False
    warned: bool = False


_lock = threading.Lock()
_windows: Dict[str, _Window] = {}
_with_p = [False]
# Windows of an earlier job of this process (an elastic reset re-formed it): their buffers are
# gone; they must be created again.
_lost: set = set()


def _forget_windows() -> None:
    with _lock:
        _lost.update(_windows)
        _windows.clear()


basics.register_reinit_hook(_forget_windows)


def _topology_guard():
    """Why the topology may not change while windows exist (None when none do)."""
    with _lock:
        names = sorted(_windows)
    if names and basics.is_initialized():
        return (f"windows {', '.join(repr(n) for n in names)} exist and keep the neighbours "
                "they were created with; free them with bf.win_free() on every rank before "
                "changing the topology (and create them again after)")
    return None


topology.register_change_guard(_topology_guard)


def _windows_open() -> bool:
    """Whether this rank's windows take operations: while initialized, and in fault-tolerant
    mode also after a lost rank failed the collectives, until shutdown."""
    lib = library.loaded()
    return lib is not None and bool(lib.bluefog_windows_open())


def _prefix(op: str, name) -> str:
    return f"rank {rank_str()}: bluefog {op} of window {name!r}"


def _window(op: str, name) -> _Window:
    if not isinstance(name, str) or not name:
        raise ValueError(f"{_prefix(op, name)}: the name must be a non-empty str")
    if not basics.is_initialized() and not _windows_open():
        with _lock:
            _windows.clear()  # shutdown() freed them in the core
        raise ValueError(f"{_prefix(op, name)}: bluefog is not initialized (or was shut down, "
                         "which frees every window); call bf.init() and bf.win_create first")
    with _lock:
        w = _windows.get(name)
    if w is None and name in _lost:
        raise ValueError(f"{_prefix(op, name)}: the window belonged to an earlier job of "
                         "this process: bf.init() after a shutdown or a lost rank (an elastic "
                         "reset) started a new job, which has none of the old windows; create "
                         "it again with bf.win_create(tensor, name) on every rank (in an "
                         "elastic reset callback, say)")
    if w is None:
        raise ValueError(f"{_prefix(op, name)}: there is no window of that name; create it with "
                         "bf.win_create(tensor, name) on every rank first")
    return w


def _ranks_weights(op: str, name: str, weights, allowed: List[int], what: str, default):
    """(ranks, weights) from a {rank: weight} dict (None: `default`), checked against `allowed`."""
    if weights is None:
        weights = default
    if not isinstance(weights, dict):
        raise TypeError(f"{_prefix(op, name)}: {what} must be a dict {{rank: weight}}, got "
                        f"{type(weights).__name__}")
    ranks = []
    values = []
    for r in sorted(weights):
        if isinstance(r, bool) or not isinstance(r, int):
            raise TypeError(f"{_prefix(op, name)}: {what} keys must be int ranks, got {r!r}")
        if r not in allowed:
            kind = "out" if what == "dst_weights" else "in"
            raise ValueError(f"{_prefix(op, name)}: {what} names rank {r}, which is not an "
                             f"{kind}-neighbor of rank {rank_str()} in this window ({kind}-"
                             f"neighbors: {allowed}); a window keeps the topology it was "
                             "created with")
        ranks.append(r)
        values.append(_float(op, name, weights[r], f"{what}[{r}]"))
    return ranks, values


def _float(op: str, name: str, value, what: str) -> float:
    if isinstance(value, bool):
        raise TypeError(f"{_prefix(op, name)}: {what} must be a number, got {value!r}")
    try:
        weight = float(value)
    except (TypeError, ValueError):
        raise TypeError(f"{_prefix(op, name)}: {what} must be a number, got {value!r}") from None
    if not math.isfinite(weight):
        raise ValueError(f"{_prefix(op, name)}: {what} is {weight}; weights must be finite "
                         "numbers")
    return weight


def _check_tensor(op: str, name: str, tensor, window: Optional[_Window] = None):
    tensor = tf.convert_to_tensor(tensor)
    if tensor.dtype not in FLOAT_DTYPES:
        raise TypeError(f"{_prefix(op, name)}: dtype {tensor.dtype.name} cannot be averaged with "
                        "weights; windows hold float16, bfloat16, float32 or float64 tensors")
    if window is not None:
        v = window.variable
        if tensor.dtype != v.dtype or not tensor.shape.is_compatible_with(v.shape):
            raise ValueError(f"{_prefix(op, name)}: the tensor is {tensor.dtype.name} of shape "
                             f"{tensor.shape.as_list()}, but the window holds {v.dtype.name} of "
                             f"shape {v.shape.as_list()}; pass a tensor like the one it was "
                             "created with")
    return tensor


def win_create(tensor: Union[tf.Tensor, tf.Variable], name: str, zero_init: bool = False) -> bool:
    """Creates window ``name`` on every rank (collective: every rank calls it, in one order).

    The window holds this rank's value (``tensor``) and one receive buffer per in-neighbour of
    the current topology, which start as a copy of ``tensor`` (or zeros with ``zero_init``). A
    ``tf.Variable`` becomes the window's variable; a tensor is copied into a new one. Ranks must
    pass tensors of the same shape and dtype. Returns True.
    """
    if not isinstance(name, str) or not name:
        raise ValueError(f"{_prefix('win_create', name)}: the name must be a non-empty str")
    if not isinstance(zero_init, bool):
        raise TypeError(f"{_prefix('win_create', name)}: zero_init must be a bool")
    if not basics.is_initialized():
        raise ValueError(f"{_prefix('win_create', name)}: bluefog is not initialized; call "
                         "bf.init() first")
    with _lock:
        if name in _windows:
            raise ValueError(f"{_prefix('win_create', name)}: a window of that name exists "
                             "already; free it with bf.win_free(name) first, or pick another name")
    with tf.init_scope():
        value = _check_tensor("win_create", name, tensor)
        in_ranks = topology.in_neighbor_ranks()
        out_ranks = topology.out_neighbor_ranks()
        if topology.is_topo_weighted():
            self_weight, nw = topology_util.GetRecvWeights(topology.load_topology(),
                                                           basics.rank())
        else:
            self_weight = 1.0 / (len(in_ranks) + 1)
            nw = {r: self_weight for r in in_ranks}
        ops.bluefog_win_create(value, name_input(name), const_input(in_ranks, tf.int32),
                               const_input(out_ranks, tf.int32), zero_init=zero_init)
        source = None
        if isinstance(tensor, tf.Variable):
            variable = tensor
        else:
            variable = tf.Variable(value, trainable=False, name=f"bluefog_window_{name}")
            try:
                source = weakref.ref(tensor)
            except TypeError:  # a numpy array or a list: no object the user could put again
                pass
    with _lock:
        _lost.discard(name)
        _windows[name] = _Window(variable, in_ranks, out_ranks, float(self_weight),
                                 {int(r): float(w) for r, w in nw.items()}, source)
    return True


def win_free(name: Optional[str] = None) -> bool:
    """Frees window ``name`` on every rank (collective), or every window when ``name`` is None.

    Every operation on the window must have finished (``win_wait``) on every rank; otherwise
    every rank gets an error naming the rank that still has some. Returns True.
    """
    with _lock:
        names = sorted(_windows) if name is None else [name]
    if name is not None:
        _window("win_free", name)
    with tf.init_scope():
        for n in names:
            ops.bluefog_win_free(name_input(n))
            with _lock:
                _windows.pop(n, None)
    return True


def window_variable(name: str) -> tf.Variable:
    """The variable that backs window ``name`` (what ``win_update`` assigns)."""
    return _window("window_variable", name).variable


def window_names() -> List[str]:
    """The names of the windows that exist on this rank, sorted."""
    with _lock:
        return sorted(_windows)


def _warn_if_stale(op: str, name: str, w: _Window, tensor) -> None:
    """Warns once per window when `tensor` is the tf.Tensor the window was made from and
    win_update has changed the window since: that tensor still holds the first value."""
    if w.warned or not w.updated or w.source is None or w.source() is not tensor:
        return
    w.warned = True
    warnings.warn(
        f"{_prefix(op, name)}: this is the tf.Tensor the window was made from, and win_update "
        f"cannot change a tensor in place (TensorFlow tensors are immutable): the update went to "
        f"bf.window_variable({name!r}), so this rank keeps putting its first value and never "
        f"mixes. Make the window from a tf.Variable (x = tf.Variable(x) before bf.win_create), "
        f"which win_update updates in place, or put the value win_update returns "
        f"(x = bf.win_update({name!r}))", UserWarning, stacklevel=4)


def _put(tensor, name, self_weight, dst_weights, require_mutex, accumulate):
    op = "win_accumulate" if accumulate else "win_put"
    w = _window(op, name)
    _warn_if_stale(op, name, w, tensor)
    tensor = _check_tensor(op, name, tensor, w)
    ranks, weights = _ranks_weights(op, name, dst_weights, w.out_ranks, "dst_weights",
                                    {r: 1.0 for r in w.out_ranks})
    sw = 1.0 if self_weight is None else _float(op, name, self_weight, "self_weight")
    handle = ops.bluefog_win_put(tensor, name_input(name), const_input(ranks, tf.int32),
                                 const_input(weights, tf.float64), const_input(sw, tf.float64),
                                 accumulate=accumulate, require_mutex=bool(require_mutex),
                                 with_p=_with_p[0])
    if self_weight is not None:
        # torch scales the tensor in place after sending it; here the window's variable takes
        # the scaled value.
        with tf.control_dependencies([handle]):
            # tf.constant, not tf.cast: tf.cast(python float) goes through float32 first, so a
            # float64 variable would hold tensor * float32(w) while the core publishes
            # tensor * w (push-sum then loses mass, ~1e-8 relative per step with w = 1/3).
            w.variable.assign(tensor * tf.constant(sw, tensor.dtype))
    return handle


def win_put_nonblocking(tensor, name: str, self_weight: Optional[float] = None,
                        dst_weights: Optional[Dict[int, float]] = None,
                        require_mutex: bool = False):
    """Starts writing ``tensor * dst_weights[r]`` into this rank's buffer at each out-neighbour
    ``r`` (default: every out-neighbour of the window, weight 1). Returns a handle for
    ``win_wait`` / ``win_poll``; the put is in the targets' buffers once it finished.

    ``tensor`` becomes this rank's published value (what neighbours' ``win_get`` read), scaled by
    ``self_weight``; with ``self_weight`` the window's variable is set to ``tensor * self_weight``.
    With ``require_mutex`` each target's mutex for this window is held during the write.
    """
    return _put(tensor, name, self_weight, dst_weights, require_mutex, False)


def win_put(tensor, name: str, self_weight: Optional[float] = None,
            dst_weights: Optional[Dict[int, float]] = None, require_mutex: bool = False):
    """``win_put_nonblocking`` then ``win_wait``: returns True once the data is in every
    target's buffer."""
    return win_wait(win_put_nonblocking(tensor, name, self_weight, dst_weights, require_mutex))


def win_accumulate_nonblocking(tensor, name: str, self_weight: Optional[float] = None,
                               dst_weights: Optional[Dict[int, float]] = None,
                               require_mutex: bool = False):
    """As ``win_put_nonblocking``, but adds ``tensor * dst_weights[r]`` to the buffers."""
    return _put(tensor, name, self_weight, dst_weights, require_mutex, True)


def win_accumulate(tensor, name: str, self_weight: Optional[float] = None,
                   dst_weights: Optional[Dict[int, float]] = None, require_mutex: bool = False):
    """``win_accumulate_nonblocking`` then ``win_wait``."""
    return win_wait(win_accumulate_nonblocking(tensor, name, self_weight, dst_weights,
                                               require_mutex))


def win_get_nonblocking(name: str, src_weights: Optional[Dict[int, float]] = None,
                        require_mutex: bool = False):
    """Starts reading each in-neighbour ``r``'s published value, times ``src_weights[r]``
    (default: every in-neighbour, weight 1), into this rank's buffer for ``r``. Returns a handle.
    """
    w = _window("win_get", name)
    ranks, weights = _ranks_weights("win_get", name, src_weights, w.in_ranks, "src_weights",
                                    {r: 1.0 for r in w.in_ranks})
    return ops.bluefog_win_get(name_input(name), const_input(ranks, tf.int32),
                               const_input(weights, tf.float64),
                               require_mutex=bool(require_mutex))


def win_get(name: str, src_weights: Optional[Dict[int, float]] = None,
            require_mutex: bool = False):
    """``win_get_nonblocking`` then ``win_wait``."""
    return win_wait(win_get_nonblocking(name, src_weights, require_mutex))


def _as_handle(handle):
    if isinstance(handle, bool) or not isinstance(handle, (int, tf.Tensor)):
        raise TypeError(f"rank {rank_str()}: bluefog win_wait: expected a handle from a "
                        f"*_nonblocking call, got {type(handle).__name__}")
    return tf.convert_to_tensor(handle, tf.int64)


def win_wait(handle):
    """Waits until the operation ``handle`` finished; raises its error if it failed. Returns
    True (a bool tensor inside ``tf.function``). A handle can be waited for once."""
    done = ops.bluefog_win_wait(_as_handle(handle))
    return bool(done) if tf.executing_eagerly() else done


def win_poll(handle):
    """Whether the operation ``handle`` finished (without waiting)."""
    done = ops.bluefog_win_poll(_as_handle(handle))
    return bool(done) if tf.executing_eagerly() else done


def _update(name: str, value, self_weight: float, ranks: List[int], weights: List[float],
            reset: bool, publish: bool):
    # A clone (publish=False) leaves this rank's push-sum weight as it is, like its value.
    return ops.bluefog_win_update(value, name_input(name), const_input(float(self_weight),
                                                                       tf.float64),
                                  const_input(ranks, tf.int32), const_input(weights, tf.float64),
                                  reset=reset, publish=publish, with_p=_with_p[0] and publish)


def win_update(name: str, self_weight: Optional[float] = None,
               neighbor_weights: Optional[Dict[int, float]] = None, reset: bool = False,
               clone: bool = False, require_mutex: bool = False):
    """This rank's value combined with its receive buffers, as they are now.

    ``self_weight * value + sum_r neighbor_weights[r] * buffer[r]``; without weights, the
    topology's weights as of ``win_create`` (uniform ``1/(in-degree+1)`` when it is not
    weighted). ``self_weight`` and ``neighbor_weights`` go together. The buffers read get version
    0; with ``reset`` they become zero (also with ``clone``). The result is assigned to the
    window's variable and published, and the push-sum weight updated, unless ``clone``; it is
    returned. ``require_mutex`` holds this rank's own mutex of
    the window, so no neighbour's ``require_mutex`` put lands in the middle.
    """
    w = _window("win_update", name)
    if (self_weight is None) != (neighbor_weights is None):
        raise ValueError(f"{_prefix('win_update', name)}: self_weight and neighbor_weights must "
                         "be given together (or neither)")
    if self_weight is None:
        self_weight, neighbor_weights = w.self_weight, w.neighbor_weights
    sw = _float("win_update", name, self_weight, "self_weight")
    ranks, weights = _ranks_weights("win_update", name, neighbor_weights, w.in_ranks,
                                    "neighbor_weights", None)
    ctx = win_mutex(name, for_self=True) if require_mutex else contextlib.nullcontext()
    with ctx:
        out = _update(name, w.variable.read_value(), sw, ranks, weights, bool(reset),
                      publish=not clone)
        if not clone:
            w.variable.assign(out)
            w.updated = True
    return out


def win_update_then_collect(name: str, require_mutex: bool = True):
    """The sum of this rank's value and every buffer (all weights 1), with the buffers reset:
    what push-sum collects after ``win_accumulate``."""
    w = _window("win_update_then_collect", name)
    return win_update(name, 1.0, {r: 1.0 for r in w.in_ranks}, reset=True,
                      require_mutex=require_mutex)


@contextlib.contextmanager
def win_mutex(name: str, for_self: bool = False, ranks: Optional[List[int]] = None):
    """Holds the window's mutex on ``ranks`` (default: the out-neighbours; ``for_self``: this
    rank's own) for the body. Ranks are locked one at a time in ascending order, so two callers
    cannot deadlock; puts, accumulates and gets with ``require_mutex`` and updates with
    ``require_mutex`` on those ranks wait while it is held. Asking again for a mutex this rank
    holds (``require_mutex`` inside ``win_mutex`` on the same ranks) is an error, raised before
    anything is locked, not a wait."""
    w = _window("win_mutex", name)
    if for_self:
        ranks = [basics.rank()]
    elif ranks is None:
        ranks = list(w.out_ranks)
    bad = [r for r in ranks if isinstance(r, bool) or not isinstance(r, (int, np.integer))
           or not 0 <= r < basics.size()]
    if bad:
        raise ValueError(f"{_prefix('win_mutex', name)}: ranks must be ints in "
                         f"[0, {basics.size()}), got {bad!r:.80}")
    ranks = sorted(int(r) for r in ranks)
    rank_tensor = const_input(ranks, tf.int32)
    win_wait(ops.bluefog_win_mutex(name_input(name), rank_tensor, lock=True))
    try:
        yield
    finally:
        win_wait(ops.bluefog_win_mutex(name_input(name), rank_tensor, lock=False))


def get_win_version(name: str) -> Dict[int, Union[int, tf.Tensor]]:
    """{in-neighbour: writes into its buffer since this rank last read it with win_update}."""
    w = _window("get_win_version", name)
    ranks, versions = ops.bluefog_win_version(name_input(name))
    if tf.executing_eagerly():
        return {int(r): int(v) for r, v in zip(ranks.numpy(), versions.numpy())}
    return {r: versions[k] for k, r in enumerate(w.in_ranks)}


def win_associated_p(name: str):
    """The push-sum weight associated with this rank's value (1.0 at creation). It changes only
    while ``turn_on_win_ops_with_associated_p()`` is in effect."""
    _window("win_associated_p", name)
    p = ops.bluefog_win_associated_p(name_input(name))
    return float(p) if tf.executing_eagerly() else p


def turn_on_win_ops_with_associated_p() -> None:
    """From now on puts and accumulates carry ``p * weight`` along with the data, and updates
    combine the weights like the values (push-sum). Functions traced before keep their setting."""
    _with_p[0] = True


def turn_off_win_ops_with_associated_p() -> None:
    """Back to plain window operations (the default)."""
    _with_p[0] = False


def win_ops_with_associated_p() -> bool:
    """Whether window operations carry push-sum weights now (after
    ``turn_on_win_ops_with_associated_p``)."""
    return _with_p[0]
