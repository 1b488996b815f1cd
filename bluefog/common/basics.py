"""Process-level state shared by every front end: init/shutdown, rank, size, process sets.

Thin ctypes bindings over the C API of ``libbluefog_core``; all the work happens in C++.
"""

from __future__ import annotations

import atexit
import ctypes
import faulthandler
import numbers
import os
import signal
import sys
import threading
from typing import Any, Dict, List, Optional, Sequence, Union

from bluefog.common import elastic_rounds, horovod_env, library, mpi4py_interop, tf_config

_atexit_registered = False
_load = library.load


class BluefogError(RuntimeError):
    """Raised when the C++ runtime reports a failure outside of a TensorFlow op."""


class BluefogInternalError(RuntimeError):
    """The job lost a rank (its process died, or its connections broke): every collective
    pending or started on a survivor fails, and ``bf.elastic.run`` turns that failure into this
    error, restores the last commit and re-forms the job with the ranks that remain (an elastic
    ``bfrun --gloo``). Horovod's name for it is ``HorovodInternalError``."""


HorovodInternalError = BluefogInternalError

# Called, without arguments, after init() started a new job in a process that had run one
# before (the Gloo backend, elastic resets): the front ends forget what belonged to the old job.
_reinit_hooks: List = []
_ever_initialized = [False]
# An in-place elastic worker's settings from its environment (HOROVOD_* aliases, TF_CONFIG),
# merged once and handed to every round's init with that round's variables.
_elastic_base: List[Dict[str, str]] = [{}]


def register_reinit_hook(hook) -> None:
    """``hook()`` runs after every init() that follows an earlier job in this process."""
    _reinit_hooks.append(hook)


def _check(code: int) -> None:
    if code != 0:
        raise BluefogError(_load().bluefog_last_error().decode("utf-8", "replace"))


def _init_with(settings: Dict[str, str]) -> int:
    """The core's init with ``settings`` (variable name -> value) taking precedence over the
    process environment's: the configuration flows to C++ as values, and ``os.environ`` is
    left as the launcher set it."""
    keys = (ctypes.c_char_p * len(settings))(*(k.encode() for k in settings))
    values = (ctypes.c_char_p * len(settings))(*(v.encode() for v in settings.values()))
    return _load().bluefog_init_with(keys, values, len(settings))


def _merged_settings() -> Dict[str, str]:
    """What this process's environment means for bluefog beyond its own ``BLUEFOG_*`` names:
    ``HOROVOD_*`` aliases (the notice printed once on rank 0) and ``TF_CONFIG``'s rendezvous.
    Only the values that differ from the environment are returned."""
    merged = dict(os.environ)
    horovod_env.apply_and_announce(merged)
    try:
        rendezvous = tf_config.rendezvous_from_tf_config(merged)
    except ValueError as e:
        raise BluefogError(str(e)) from None
    merged.update(rendezvous or {})
    return {k: v for k, v in merged.items() if os.environ.get(k) != v}


def _tuning(knob: str) -> int:
    """A run-time switch of the core by name, for tests and benchmarks (csrc/c_api.h lists
    them: streaming_stores, shared, shared_calls, inline_threshold, ...)."""
    value = ctypes.c_longlong()
    _check(_load().bluefog_tuning_get(knob.encode(), ctypes.byref(value)))
    return value.value


def _tune(knob: str, value: int) -> int:
    """Sets a run-time switch of the core on this rank from now on; returns the value before."""
    before = ctypes.c_longlong()
    _check(_load().bluefog_tuning_set(knob.encode(), int(value), ctypes.byref(before)))
    return before.value


def _check_init_arguments(process_sets, comm) -> list:
    """The process sets to register, checked before anything starts, so that a mistake leaves
    bluefog uninitialized."""
    if comm is not None and not mpi4py_interop.is_whole_job(comm):
        raise ValueError(
            f"bluefog init: comm= {mpi4py_interop.describe(comm)} is not supported: bluefog "
            "always starts on every rank of the job (MPI_COMM_WORLD; an mpi4py communicator of "
            "all of them is accepted). Launch only the ranks you want, or pass the ranks as a "
            "process set instead: bf.init(process_sets=[bf.ProcessSet(ranks or mpi4py_comm)]) "
            "and process_set= on each collective")
    if process_sets is None or process_sets == "dynamic":
        return []  # "dynamic" (Horovod's): sets are always added with add_process_set here
    if isinstance(process_sets, str) or not isinstance(process_sets, (list, tuple)):
        raise TypeError(f"bluefog init: process_sets must be a list of ProcessSet or rank lists, "
                        f"or \"dynamic\", got {process_sets!r}")
    for p in process_sets:
        ranks = p.ranks if isinstance(p, ProcessSet) else p
        if isinstance(ranks, (str, bytes)) or not all(isinstance(r, int) for r in list(ranks)):
            raise TypeError(f"bluefog init: each process set must be a ProcessSet or a list of "
                            f"int ranks, got {p!r}")
    return list(process_sets)


def init(process_sets=None, comm=None, fault_tolerant: Optional[bool] = None) -> None:
    """Starts bluefog on this process. Every rank must call it; calling it again is a no-op.

    ``HOROVOD_*`` environment variables with a ``BLUEFOG_*`` counterpart are read as aliases
    (``horovod_env.py``; the ``BLUEFOG_`` name wins); rank 0 prints one notice listing them.
    ``process_sets="dynamic"`` (Horovod's) registers nothing: sets are added later with
    ``add_process_set``. ``comm`` (Horovod's): an mpi4py communicator of every process of the
    job (``MPI.COMM_WORLD`` or a duplicate) is accepted, also as the first positional argument
    (``init(MPI.COMM_WORLD, process_sets=...)``, Horovod's order); a communicator of fewer
    processes or a rank list is refused with an error saying what to pass instead (a
    ``ProcessSet``). Arguments are checked before anything starts.

    Starts MPI (unless the application already did) and the background thread that runs every
    collective. ``shutdown()`` runs automatically at interpreter exit. ``process_sets`` (a list
    of ``ProcessSet`` or rank lists, the same on every rank) are registered right away, as
    Horovod's ``init(process_sets=...)`` does.

    Without mpirun, with MASTER_ADDR, MASTER_PORT, RANK and WORLD_SIZE set (or a TF_CONFIG
    that lists the workers), it runs on Gloo instead (docs/launching.md, "Without mpirun").

    ``fault_tolerant=True`` (or ``BLUEFOG_FAULT_TOLERANT=1``; Gloo only) keeps this rank's
    window operations going when a neighbour dies or hangs past ``BLUEFOG_NEIGHBOR_DEADLINE``
    seconds: that neighbour is dropped (docs/windows.md, "Fault-tolerant windows"). Every rank
    should pass the same; ``False`` turns the variable's mode off for this process.
    """
    global _atexit_registered
    if comm is None and mpi4py_interop.communicator(process_sets) is not None:
        comm, process_sets = process_sets, None  # Horovod's init(comm, ...)
    process_sets = _check_init_arguments(process_sets, comm)
    if fault_tolerant is not None and not isinstance(fault_tolerant, bool):
        raise TypeError(f"bluefog init: fault_tolerant must be True, False or None, got "
                        f"{fault_tolerant!r}")
    if comm is not None:
        global_process_set.mpi_comm = comm
    if is_initialized():
        _check(_load().bluefog_init())
    elif elastic_rounds.active():
        _init_elastic_round()
    else:
        settings = _merged_settings()
        if fault_tolerant is not None:
            settings["BLUEFOG_FAULT_TOLERANT"] = "1" if fault_tolerant else "0"
        _check(_init_with(settings))
        _after_new_job()
    if not _atexit_registered:
        atexit.register(shutdown)
        _atexit_registered = True
        if _load().bluefog_flight_dump_installed():
            # SIGUSR1 prints every Python thread's stack too, then the recorder (chained).
            # On the process's own stderr, as the recorder (not a replaced sys.stderr).
            faulthandler.register(signal.SIGUSR1, file=sys.__stderr__ or sys.stderr,
                                  all_threads=True, chain=True)
    if process_sets:
        for process_set in process_sets:
            add_process_set(process_set)


def _init_elastic_round() -> None:
    """Under an elastic ``bfrun --gloo``: joins the driver's newest round that includes this
    worker; when that round's rendezvous fails (a rank of it died meanwhile), the next one."""
    base = _merged_settings() if _ever_initialized[0] is False else _elastic_base[0]
    _elastic_base[0] = base
    while True:
        round_id, variables = elastic_rounds.join_next_round()
        code = _init_with({**base, **variables})
        if code == 0:
            break
        message = _load().bluefog_last_error().decode("utf-8", "replace")
        if not elastic_rounds.superseded(round_id):
            raise BluefogError(message)
    _after_new_job()


def _after_new_job() -> None:
    with _sets_lock:
        sets = [p for i, p in _registered.items() if i != 0]
        for p in sets:
            p.process_set_id = None
        _registered.clear()
        _registered[0] = global_process_set
    if _ever_initialized[0]:
        for hook in _reinit_hooks:
            hook()
    _ever_initialized[0] = True


def shutdown() -> None:
    """Stops bluefog on every rank. Collectives still pending fail with a "shut down" error.

    This rank's windows are closed first: the other ranks' window operations into it fail at
    once. It returns once every rank has joined the shutdown's negotiation round (at its next
    collective or shutdown).

    On the Gloo backend ``init()`` may follow in the same process and starts a new job (what
    elastic resets do): the process sets, the topology and the windows of the old one are gone
    and must be made again. MPI cannot be restarted, so there ``init()`` after ``shutdown()``
    raises.
    """
    lib = library.loaded()
    if lib is not None:
        _check(lib.bluefog_shutdown())


def is_initialized() -> bool:
    """Whether ``init()`` has run and the library has not been shut down."""
    lib = library.loaded()
    return lib is not None and bool(lib.bluefog_is_initialized())


def _query(fn_name: str) -> int:
    value = getattr(_load(), fn_name)() if library.loaded() is not None else -1
    if value < 0:
        raise ValueError(
            f"bluefog is not initialized (or was shut down): call bf.init() before "
            f"bf.{fn_name[len('bluefog_'):]}()")
    return value


def size() -> int:
    """Number of processes (ranks) in the job."""
    return _query("bluefog_size")


def rank() -> int:
    """This process's rank, in ``[0, size())``."""
    return _query("bluefog_rank")


def local_size() -> int:
    """Number of ranks on this machine (ranks sharing memory with this one)."""
    return _query("bluefog_local_size")


def local_rank() -> int:
    """This process's rank among the ranks on its machine."""
    return _query("bluefog_local_rank")


def is_homogeneous() -> bool:
    """Whether every machine runs the same number of ranks, in contiguous blocks.

    True when machine ``m`` holds exactly the ranks ``m * local_size() .. (m + 1) *
    local_size() - 1`` (mpirun's default placement, ``--map-by slot``, with equal slots per
    host). Machine-level operations (``machine_rank()``, ``hierarchical_neighbor_allreduce``)
    need it. Agreed by all ranks at ``init()``, so it is the same on every rank.
    """
    return bool(_query("bluefog_is_homogeneous"))


def backend() -> str:
    """The backend running the job: ``"mpi"`` (started by mpirun, bfrun or srun) or ``"gloo"``
    (started with MASTER_ADDR, MASTER_PORT, RANK and WORLD_SIZE; docs/launching.md)."""
    name = _load().bluefog_backend() if library.loaded() is not None else None
    if name is None:
        raise ValueError("bluefog is not initialized (or was shut down): call bf.init() before "
                         "bf.backend()")
    return name.decode()


def mpi_threads_supported() -> bool:
    """Whether MPI granted MPI_THREAD_MULTIPLE, so other threads may also call MPI directly.
    On the Gloo backend: True (each process set has a Gloo context of its own)."""
    return bool(_query("bluefog_mpi_threads_supported"))


def op_accepts_dtype(op_type: int, dtype: int) -> bool:
    """Whether the C++ core accepts a request of ``op_type`` with ``dtype``.

    Both are the core's enum values (``OpType``: allreduce 0, allgather 1, broadcast 2,
    neighbor_allreduce 3, neighbor_allgather 4, neighbor_allgather gradient 5, alltoall 6,
    reducescatter 7; ``DataType``: uint8 0, int8, uint16, int16, int32, int64, float16,
    bfloat16, float32, float64, bool 10). Needs no ``init()``.
    """
    return _load().bluefog_op_accepts_dtype(op_type, dtype) == 1


# Process sets: the C API's calls, then the Python objects over them.


def add_process_set_ranks(ranks: Sequence[int]) -> int:
    """Registers a process set on every rank (collective); returns its id."""
    array = (ctypes.c_int * len(ranks))(*ranks)
    set_id = _load().bluefog_add_process_set(array, len(ranks))
    if set_id < 0:
        raise BluefogError(_load().bluefog_last_error().decode("utf-8", "replace"))
    return set_id


def remove_process_set_id(set_id: int) -> None:
    """Removes a registered process set on every rank (collective)."""
    _check(_load().bluefog_remove_process_set(set_id))


# The process sets' Python objects (``ProcessSet``), public as bluefog.common.process_sets. They
# live here, below that module, because ``init(process_sets=...)`` registers sets: with them in
# process_sets.py, the two modules would import each other.


def _integer_ranks(ranks) -> List[int]:
    """``ranks`` as Python ints; only Python and numpy integers are ranks (a float or a string
    would be truncated or parsed into some other rank, and a bool is no rank)."""
    where = f"rank {rank()}: " if is_initialized() else ""
    if isinstance(ranks, (str, bytes)) or not hasattr(ranks, "__iter__"):
        raise TypeError(f"{where}bluefog ProcessSet: ranks must be a sequence of integers, got "
                        f"{ranks!r}; pass e.g. [0, 1]")
    values = []
    for r in ranks:
        if isinstance(r, bool) or not isinstance(r, numbers.Integral):
            raise TypeError(f"{where}bluefog ProcessSet: ranks must be integers (Python int or "
                            f"numpy integer), got {r!r} ({type(r).__name__}) in {ranks!r}; "
                            "pass e.g. [0, 1]")
        values.append(int(r))
    return values


class ProcessSet:
    """A set of ranks, given as a list of ranks or as an mpi4py communicator (Horovod's
    ``ProcessSet(comm)``; its processes' ranks, which may differ from rank to rank, as after
    ``MPI.COMM_WORLD.Split``). ``process_set_id`` is None until the set is registered;
    ``mpi_comm`` is the communicator it was made from, else None."""

    def __init__(self, ranks: Union[Sequence[int], Any]):
        self.mpi_comm = mpi4py_interop.communicator(ranks)
        if self.mpi_comm is not None:
            ranks = mpi4py_interop.world_ranks(self.mpi_comm)
        self.ranks: List[int] = sorted(set(_integer_ranks(ranks)))
        self.process_set_id: Optional[int] = None

    def size(self) -> Optional[int]:
        """The number of ranks in the set (None before it is registered)."""
        if self.process_set_id is None:
            return None
        return len(self.ranks)

    def rank(self) -> Optional[int]:
        """This process's index in the set, -1 when it is not in it (None before it is
        registered)."""
        if self.process_set_id is None:
            return None
        # rank() and size() in these methods are this module's: job-wide.
        return self.ranks.index(rank()) if self.included() else -1

    def included(self) -> Optional[bool]:
        """Whether this process is in the set (None before it is registered)."""
        if self.process_set_id is None:
            return None
        return rank() in self.ranks

    def __repr__(self) -> str:
        comm = "" if self.mpi_comm is None else f", mpi_comm={self.mpi_comm!r}"
        return f"ProcessSet(process_set_id={self.process_set_id}, ranks={self.ranks}{comm})"


class _GlobalProcessSet(ProcessSet):
    """Every rank of the job (id 0): the default of every collective."""

    def __init__(self):
        super().__init__([])
        self.process_set_id = 0

    @property
    def ranks(self) -> List[int]:
        return list(range(size())) if is_initialized() else []

    @ranks.setter
    def ranks(self, value) -> None:  # set by ProcessSet.__init__; the ranks come from the job
        pass

    def __repr__(self) -> str:
        comm = "" if self.mpi_comm is None else f", mpi_comm={self.mpi_comm!r}"
        return f"ProcessSet(process_set_id=0, ranks=all{comm})"


global_process_set = _GlobalProcessSet()
"""The process set of every rank (id 0): the default ``process_set=`` of every collective."""
_sets_lock = threading.Lock()
_registered: Dict[int, ProcessSet] = {0: global_process_set}


def add_process_set(process_set: Union[ProcessSet, Sequence[int]]) -> ProcessSet:
    """Registers ``process_set`` (a ProcessSet or a list of ranks) and returns it.

    Collective over every rank of the job: each must call it with the same ranks, in the same
    order of calls. Raises ValueError for ranks outside the job or a set registered already,
    and BluefogError when ranks disagree.
    """
    if not isinstance(process_set, ProcessSet):
        process_set = ProcessSet(process_set)
    if process_set.process_set_id is not None:
        raise ValueError(f"bluefog add_process_set: {process_set} is registered already")
    if not is_initialized():
        raise ValueError("bluefog add_process_set: bluefog is not initialized; call bf.init() "
                         "first")
    bad = [r for r in process_set.ranks if not 0 <= r < size()]
    if bad or not process_set.ranks:
        raise ValueError(f"rank {rank()}: bluefog add_process_set: ranks "
                         f"{process_set.ranks} must be a non-empty list of ranks in "
                         f"[0, {size()})")
    if process_set.mpi_comm is not None:
        return _add_comm_process_set(process_set)
    _register_into(process_set)
    return process_set


def _add_comm_process_set(process_set: ProcessSet) -> ProcessSet:
    """Registers the sets of every rank's communicator (each rank may pass a different one, as
    after ``Split``): the ranks' sets are gathered over MPI_COMM_WORLD with mpi4py, and every
    distinct set is registered on every rank in the order of its lowest rank; this rank's
    ProcessSet gets its own set's id. The other sets stay registered under other objects."""
    from mpi4py import MPI

    if backend() != "mpi":
        raise ValueError(f"rank {rank()}: bluefog add_process_set: a ProcessSet made from an "
                         f"mpi4py communicator needs the MPI backend (this job runs on "
                         f"{backend()}); pass the ranks instead: bf.ProcessSet([...])")
    everyone = MPI.COMM_WORLD.allgather(tuple(process_set.ranks))
    distinct = sorted(set(everyone), key=lambda ranks: (ranks[0], ranks))
    for ranks in distinct:
        if tuple(process_set.ranks) == ranks:
            _register_into(process_set)
        else:
            add_process_set(ProcessSet(list(ranks)))
    return process_set


def _register_into(process_set: ProcessSet) -> None:
    """Registers ``process_set``'s ranks (collective) and records the object under its id."""
    set_id = add_process_set_ranks(process_set.ranks)
    process_set.process_set_id = set_id
    with _sets_lock:
        _registered[set_id] = process_set


def remove_process_set(process_set: ProcessSet) -> bool:
    """Removes a registered set on every rank (collective, like ``add_process_set``).

    Its pending collectives fail; the ProcessSet can be registered again. Returns False for a
    set that is not registered, and refuses the global set (ValueError).
    """
    if process_set is global_process_set or process_set.process_set_id == 0:
        raise ValueError("bluefog remove_process_set: the global process set cannot be removed")
    set_id = process_set.process_set_id
    if set_id is None:
        return False
    remove_process_set_id(set_id)
    with _sets_lock:
        _registered.pop(set_id, None)
    process_set.process_set_id = None
    return True


class ProcessSetNotRegisteredError(ValueError, KeyError):
    """A process set looked up by id is not registered (removed, or never added). A KeyError
    for the lookup, a ValueError as the other "not registered" errors; printed as its
    message, not as a quoted key."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


def process_set_by_id(set_id: int) -> ProcessSet:
    """The registered ProcessSet with this id (0: the global set); raises
    ProcessSetNotRegisteredError (a KeyError) if none."""
    with _sets_lock:
        found = _registered.get(set_id)
    if found is None:
        who = f"rank {rank()}: " if is_initialized() else ""
        raise ProcessSetNotRegisteredError(
            f"{who}bluefog: process set {set_id} is not registered: it was removed with "
            f"remove_process_set (or never added on this rank). An op, a gradient tape or an "
            f"optimizer made with that set cannot run (nor take gradients) after its removal: "
            f"remove the set only once they are done, or add it again with add_process_set and "
            f"record the tape (or make the optimizer) again with the new set")
    return found
