"""The driver's "hosts changed" notice, as seen by a rank.

The elastic driver sends ``HOST_UPDATE_SIGNAL`` (SIGURG) to ``mpirun``, which forwards it to
every rank (the driver asks it to with ``--mca ess_base_forward_signals``). The handler only
counts; the ranks act on it together at the next ``commit()`` (``State.check_host_updates``),
where they agree with one allreduce whether any of them got the notice.
"""

from __future__ import annotations

import signal
import threading

from bluefog.common import elastic_env


class HostsUpdatedInterrupt(RuntimeError):
    """Raised by ``commit()`` / ``check_host_updates()`` on every rank when hosts were added or
    removed: the state was just committed, and ``bf.elastic.run`` ends this launch so that
    ``bfrun`` relaunches the job on the new hosts."""


_updates = 0


def _on_host_update(signum, frame) -> None:
    global _updates
    _updates += 1


def install_handler() -> bool:
    """Counts host-update signals from now on (main thread only). Returns whether it did."""
    if threading.current_thread() is not threading.main_thread():
        return False
    signal.signal(elastic_env.HOST_UPDATE_SIGNAL, _on_host_update)
    return True


def pending() -> int:
    return _updates


def clear() -> None:
    global _updates
    _updates = 0
