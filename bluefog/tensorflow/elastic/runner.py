"""``@bf.elastic.run``: the training function's side of an elastic job."""

from __future__ import annotations

import functools
import re
import sys
import traceback
from typing import Any, Callable

from bluefog.common import basics, elastic_env, elastic_rounds
from bluefog.common.basics import BluefogInternalError
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

    Under ``bfrun --gloo --min-np`` (in place) the process is never restarted: when a
    collective fails because a rank was lost (``BluefogInternalError``; any error raised while
    bluefog's job has ended counts as one), every survivor restores its last commit
    (``state.restore()``); after that or a ``HostsUpdatedInterrupt``, it calls
    ``bf.shutdown()`` and ``bf.init()``, which joins the job's next round (new ranks and size),
    then ``state.sync()`` (new workers get the state), the reset callbacks and ``func`` again.
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
        if elastic_rounds.active():
            return _run_in_place(func, state, args, kwargs)
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


def _lost_rank(error: BaseException) -> bool:
    """Whether ``error`` came from the job losing a rank: bluefog's job ended under it (a
    failed collective ends it on every survivor), or it says so itself."""
    return isinstance(error, BluefogInternalError) or not basics.is_initialized()


_LEFT = re.compile(r"rank\(s\) [0-9, ]+ left the job")
_RANK_LINE = re.compile(r"\brank \d+: .*")


def _loss_reason(error: BaseException) -> str:
    """The part of a lost rank's error worth one line: which ranks left, else bluefog's own
    line of it (TensorFlow puts its 'Graph execution error:' and the node's traceback first)."""
    text = str(error)
    left = _LEFT.search(text)
    if left:
        return left.group(0)
    line = _RANK_LINE.search(text)
    if line:
        return line.group(0)[:300]
    lines = [s.strip() for s in text.splitlines() if s.strip()]
    return f"{type(error).__name__}: {lines[0][:300] if lines else ''}"


def _run_in_place(func: Callable[..., Any], state: State, args, kwargs) -> Any:
    reset = False
    while True:
        rank = basics.rank()
        try:
            state.sync()
            # A new worker joining a running job resets as much as the others do.
            if reset or state.restored_commit:
                state.on_reset()
            result = func(state, *args, **kwargs)
            elastic_rounds.report_finished()
            return result
        except HostsUpdatedInterrupt as e:
            # commit() raised it on every rank: the state is committed, nothing to restore.
            why = str(e)
        except Exception as e:  # noqa: BLE001 - anything but a lost rank is re-raised
            if not _lost_rank(e):
                raise
            why = f"a rank was lost ({_loss_reason(e)})"
            elastic_rounds.report_failure()
            if state._saved is not None:  # else the sync below starts from rank 0's values
                state.restore()
        print(f"bluefog elastic: worker {elastic_rounds.worker_id()} (rank {rank}): {why}; "
              "re-forming the job in place", file=sys.stderr, flush=True)
        basics.shutdown()
        basics.init()
        reset = True


def _exit(status: int) -> None:
    basics.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    raise SystemExit(status) from None
