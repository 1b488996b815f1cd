"""``@bf.elastic.run``: the training function's side of an elastic job."""

from __future__ import annotations

import functools
import sys
import traceback
from typing import Any, Callable

from bluefog.common import basics, elastic_env
from bluefog.tensorflow.elastic.interrupts import HostsUpdatedInterrupt
from bluefog.tensorflow.elastic.state import State


def run(func: Callable[..., Any]) -> Callable[..., Any]:
    """Decorates ``func(state, *args, **kwargs)``, the training loop, for elastic training.

    On each call, on every rank: ``state.sync()`` (the newest commit of any rank or host, or
    rank 0's values on a fresh start), then the reset callbacks when the state came from an
    earlier launch (``bf.rank()``/``bf.size()`` are those of this launch), then ``func``.
    A reset callback that raises is a bug that every relaunch would repeat: under an elastic
    ``bfrun`` the rank prints the traceback and exits with the status that makes ``bfrun`` end
    the job (instead of blacklisting the host and relaunching).

    When ``func`` raises ``HostsUpdatedInterrupt`` (from a ``commit()``) under an elastic
    ``bfrun``, the state has just been committed: bluefog shuts down and the process exits
    with the status that makes ``bfrun`` relaunch the job on the new hosts. Without an elastic
    ``bfrun`` the interrupt propagates. Any other error propagates too: under an elastic
    ``bfrun`` the failed launch is relaunched on the hosts that remain.
    """
    if not callable(func):
        raise TypeError(f"bluefog elastic run: expected a function, got {type(func).__name__}")

    @functools.wraps(func)
    def wrapper(state: State, *args: Any, **kwargs: Any) -> Any:
        if not isinstance(state, State):
            raise TypeError(f"bluefog elastic run: the first argument of {func.__name__} must "
                            f"be a bf.elastic State (KerasState, TensorFlowState, ObjectState), "
                            f"got {type(state).__name__}")
        if not basics.is_initialized():
            raise ValueError("bluefog elastic run: bluefog is not initialized; call bf.init() "
                             "before the training function")
        state.sync()
        if state.restored_commit or elastic_env.restart_count() > 0:
            try:
                state.on_reset()
            except Exception:
                if not elastic_env.is_elastic():
                    raise
                print(f"bluefog elastic: rank {basics.rank()}: {elastic_env.RESET_FAILED}; a "
                      "relaunch would raise again, so the job ends. Fix the callback (its "
                      f"traceback follows) and run the job again.\n{traceback.format_exc()}",
                      file=sys.stderr, flush=True)
                _exit(elastic_env.GIVE_UP_EXIT_CODE)
        try:
            result = func(state, *args, **kwargs)
        except HostsUpdatedInterrupt as e:
            if not elastic_env.is_elastic():
                raise
            if basics.rank() == 0:
                print(f"bluefog elastic: {e}; relaunching on the new hosts", file=sys.stderr,
                      flush=True)
            _exit(elastic_env.RESIZE_EXIT_CODE)
        return result

    return wrapper


def _exit(status: int) -> None:
    basics.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    raise SystemExit(status) from None
