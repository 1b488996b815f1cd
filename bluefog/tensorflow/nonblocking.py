"""Non-blocking collectives with handles (Bluefog's ``*_nonblocking``, ``poll``, ``synchronize``,
``wait``).

A ``*_nonblocking`` call checks its arguments and fixes the request's name on the caller's thread
(unnamed calls get ``"<op>.nonblocking.<n>"``, the n-th unnamed non-blocking call of that op in
this process, so ranks that issue them in one order match), then hands the blocking op to a
waiter thread of its own and returns a ``Handle`` at once. The waiter runs the same TensorFlow
kernel as the blocking op: the kernel enqueues the request to the C++ runtime and the runtime's
own threads negotiate and run the collective; the waiter only blocks, with the GIL released,
until the kernel's ``done`` fires. The caller keeps computing meanwhile; requests are matched
across ranks by name, so any number of handles may be in flight, issued in any order (one
thread per handle in flight: no pool whose size could hold back the collective every rank
waits for).

A handle's name is its own from the call until ``synchronize``: a blocking or non-blocking
collective of that name meanwhile raises ValueError at once. Both events are in program order,
so every rank that issues the same calls decides alike, however far each rank's collective got.

``synchronize(handle)`` (alias ``wait``) returns the result or raises the op's error, prefixed
with the rank, the op, the tensor's name and the handle; a handle is synchronized once. Until
then the module keeps the handle, so a program may hold only its ``int`` id (as Bluefog's
programs do): dropping the ``Handle`` object forgets nothing, and ids are never reused. A
handle still open at interpreter exit is reported with a ``RuntimeWarning`` (shown by default,
unlike a ``ResourceWarning``) naming its rank, op and tensor.

Eager only: inside ``tf.function`` the blocking ops already run asynchronously in TensorFlow's
executor (the kernels are asynchronous), so these calls raise a RuntimeError there that says so.
"""

from __future__ import annotations

import atexit
import concurrent.futures
import itertools
import threading
import warnings
from typing import Dict, Optional, Union

import tensorflow as tf

from bluefog.tensorflow import mpi_ops, neighbor_ops, op_library
from bluefog.tensorflow.op_rules import op_error_prefix, rank_str

__all__ = ["Handle", "allreduce_nonblocking", "allgather_nonblocking", "broadcast_nonblocking",
           "neighbor_allreduce_nonblocking", "neighbor_allgather_nonblocking",
           "hierarchical_neighbor_allreduce_nonblocking", "poll", "synchronize", "wait"]

_lock = threading.Lock()
_ids = itertools.count(1)
_unnamed: Dict[str, itertools.count] = {}
# Handles not yet synchronized, by id. Strong references: an int id is a valid handle until it
# is synchronized, whether or not the program kept the Handle object.
_open: Dict[int, Handle] = {}


class Handle:
    """A non-blocking collective in flight. Pass it to ``bf.poll``, ``bf.synchronize`` or
    ``bf.wait``; ``int(handle)`` is its id (also accepted by those functions)."""

    __slots__ = ("id", "op", "name", "rank", "_future", "_done")

    def __init__(self, op: str, name: str, future: concurrent.futures.Future):
        self.id = next(_ids)
        self.op = op
        self.name = name
        self.rank = rank_str()  # for the report at exit, after bluefog may have shut down
        self._future = future
        self._done = False

    def __int__(self) -> int:
        return self.id

    def __index__(self) -> int:
        return self.id

    def __repr__(self) -> str:
        state = "synchronized" if self._done else ("finished" if self._future.done() else
                                                   "in flight")
        return f"<bluefog Handle {self.id}: {self.op} of tensor '{self.name}', {state}>"


def _warn_unwaited(handle: Handle, when: str) -> None:
    try:
        warnings.warn(f"rank {handle.rank}: bluefog {handle.op} of tensor '{handle.name}' "
                      f"(handle {handle.id}) was {when} without bf.synchronize/bf.wait: its "
                      "result and any error were never read; synchronize every handle",
                      RuntimeWarning, stacklevel=2)
    except Exception:  # noqa: BLE001 - at interpreter exit warnings may be gone
        pass


@atexit.register
def _report_open() -> None:
    with _lock:
        left = list(_open.values())
        _open.clear()
    for handle in left:
        handle._done = True
        op_library.release_name(handle.name)
        _warn_unwaited(handle, "still open at exit")


def _start(op: str, name: Optional[str], run, *args, **kwargs) -> Handle:
    if not tf.executing_eagerly():
        raise RuntimeError(f"{op_error_prefix(op, name)}: non-blocking collectives run eagerly "
                           "only; inside tf.function call the blocking op (its kernel is "
                           "asynchronous, so TensorFlow already overlaps it with other ops)")
    with _lock:
        if name is None:
            name = f"{op}.{next(_unnamed.setdefault(op, itertools.count()))}"
    if not isinstance(name, str) or not name:
        raise ValueError(f"{op_error_prefix(op)}: name must be a non-empty str, got {name!r}")
    future: concurrent.futures.Future = concurrent.futures.Future()
    handle = Handle(op, name, future)
    op_library.reserve_name(name, f"bluefog {op} of tensor '{name}' (handle {handle.id})",
                            op_error_prefix(op, name))

    def waiter():
        op_library._issuing.name = name
        future.set_running_or_notify_cancel()
        try:
            future.set_result(run(*args, name=name, **kwargs))
        except BaseException as error:  # noqa: BLE001 - handed to synchronize
            future.set_exception(error)

    with _lock:
        _open[handle.id] = handle
    try:
        threading.Thread(target=waiter, name=f"bluefog-waiter-{handle.id}", daemon=True).start()
    except BaseException:
        with _lock:
            _open.pop(handle.id, None)
        op_library.release_name(name)
        raise
    return handle


def _lookup(handle, what: str) -> Handle:
    if isinstance(handle, bool) or not isinstance(handle, (Handle, int)):
        raise TypeError(f"rank {rank_str()}: bluefog {what}: expected a handle from a "
                        f"*_nonblocking call, got {type(handle).__name__}")
    key = handle.id if isinstance(handle, Handle) else int(handle)
    with _lock:
        found = _open.get(key)
    if found is None:
        raise ValueError(f"rank {rank_str()}: bluefog {what}: handle {key} is not in flight: "
                         "it was synchronized already or never returned by a *_nonblocking "
                         "call; synchronize each handle exactly once")
    return found


def poll(handle: Union[Handle, int]) -> bool:
    """Whether the operation of ``handle`` has finished, without waiting (Bluefog's ``poll``).
    A finished handle must still be passed to ``synchronize`` for its result."""
    return _lookup(handle, "poll")._future.done()


def synchronize(handle: Union[Handle, int]):
    """Waits for the operation of ``handle`` and returns its result (the tensor the blocking op
    returns), or raises its error, naming rank, op, tensor and handle. Each handle once."""
    found = _lookup(handle, "synchronize")
    with _lock:
        if _open.pop(found.id, None) is None:  # another thread synchronized it meanwhile
            raise ValueError(f"rank {rank_str()}: bluefog synchronize: handle {found.id} was "
                             "synchronized already; synchronize each handle exactly once")
    found._done = True
    try:
        result = found._future.result()
    except Exception as error:  # noqa: BLE001 - re-raised with the handle's context
        prefix = (f"rank {rank_str()}: bluefog {found.op} of tensor '{found.name}' "
                  f"(handle {found.id}) failed: ")
        if isinstance(error, tf.errors.OpError):
            raise type(error)(error.node_def, error.op, prefix + error.message) from error
        try:
            wrapped = type(error)(prefix + str(error))
        except Exception:  # noqa: BLE001 - an exception type with another constructor
            raise RuntimeError(prefix + str(error)) from error
        raise wrapped from error
    finally:
        op_library.release_name(found.name)
    return result


def wait(handle: Union[Handle, int]):
    """Bluefog's other name for ``synchronize``: waits for ``handle`` and returns its result."""
    return synchronize(handle)


def allreduce_nonblocking(tensor, average: bool = True, name: Optional[str] = None,
                          **kwargs) -> Handle:
    """``bf.allreduce`` (same arguments) started without waiting; returns a ``Handle``."""
    return _start("allreduce_nonblocking", name, mpi_ops.allreduce, tensor, average, **kwargs)


def allgather_nonblocking(tensor, name: Optional[str] = None, **kwargs) -> Handle:
    """``bf.allgather`` (same arguments) started without waiting; returns a ``Handle``."""
    return _start("allgather_nonblocking", name, mpi_ops.allgather, tensor, **kwargs)


def broadcast_nonblocking(tensor, root_rank: int, name: Optional[str] = None,
                          **kwargs) -> Handle:
    """``bf.broadcast`` (same arguments) started without waiting; returns a ``Handle``."""
    return _start("broadcast_nonblocking", name, mpi_ops.broadcast, tensor, root_rank, **kwargs)


def neighbor_allreduce_nonblocking(tensor, self_weight: Optional[float] = None,
                                   src_weights: Optional[Dict[int, float]] = None,
                                   dst_weights=None, enable_topo_check: bool = True,
                                   name: Optional[str] = None) -> Handle:
    """``bf.neighbor_allreduce`` (same arguments) started without waiting; returns a
    ``Handle``. The topology and weights are read when the op runs, so do not change the
    topology while a handle is in flight."""
    return _start("neighbor_allreduce_nonblocking", name, neighbor_ops.neighbor_allreduce,
                  tensor, self_weight, src_weights, dst_weights, enable_topo_check)


def neighbor_allgather_nonblocking(tensor, src_ranks=None, dst_ranks=None,
                                   name: Optional[str] = None, **kwargs) -> Handle:
    """``bf.neighbor_allgather`` (same arguments) started without waiting; returns a
    ``Handle``."""
    return _start("neighbor_allgather_nonblocking", name, neighbor_ops.neighbor_allgather,
                  tensor, src_ranks, dst_ranks, **kwargs)


def hierarchical_neighbor_allreduce_nonblocking(tensor, *args, name: Optional[str] = None,
                                                **kwargs) -> Handle:
    """``bf.hierarchical_neighbor_allreduce`` (same arguments) started without waiting;
    returns a ``Handle``."""
    return _start("hierarchical_neighbor_allreduce_nonblocking", name,
                  neighbor_ops.hierarchical_neighbor_allreduce, tensor, *args, **kwargs)
