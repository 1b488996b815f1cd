"""What the elastic driver (``bfrun --min-np``) and the ranks it launches agree on.

No TensorFlow here: the driver imports this module too. The protocol has three parts:

* environment variables the driver sets for every rank of every launch (forwarded by ``bfrun``
  with its ``BLUEFOG_`` prefix rule);
* ``HOST_UPDATE_SIGNAL``: the driver sends it to ``mpirun``, which forwards it to every rank
  (``--mca ess_base_forward_signals``), when the set of hosts changed (discovered or removed);
  the ranks act on it at the next ``commit()``. SIGURG, because its default action is to
  ignore it: a process that has no handler yet (mpirun starting, a rank still importing)
  drops it instead of dying, and the driver repeats it until the launch ends;
* ``RESIZE_EXIT_CODE``: every rank exits with it after that commit, which tells the driver to
  relaunch on the new hosts (any other non-zero status is a failure);
* ``GIVE_UP_EXIT_CODE`` and a line with ``RESET_FAILED``: a rank's reset callback raised, a bug
  that every relaunch would repeat; the driver ends the job instead of relaunching.

The driver starts ``mpirun`` so that it gets SIGTERM when the driver dies (Linux's parent-death
signal), and Open MPI then ends every rank: no launch outlives its driver.
"""

from __future__ import annotations

import os
import signal
from typing import Optional

ENV_ELASTIC = "BLUEFOG_ELASTIC"  # "1" under an elastic bfrun
ENV_RESTART = "BLUEFOG_ELASTIC_RESTART"  # how many launches of this job came before this one
ENV_STATE_DIR = "BLUEFOG_ELASTIC_STATE_DIR"  # where each host keeps its last commit

HOST_UPDATE_SIGNAL = signal.SIGURG
HOST_UPDATE_SIGNAL_NAME = "SIGURG"
RESIZE_EXIT_CODE = 75  # EX_TEMPFAIL: "stopped on purpose, relaunch me"
GIVE_UP_EXIT_CODE = 76  # "a relaunch would fail the same way: end the job"
RESET_FAILED = "a reset callback raised"  # in "bluefog elastic: rank R: <this>; ..."


def is_elastic() -> bool:
    """Whether this process was launched by an elastic ``bfrun``."""
    return os.environ.get(ENV_ELASTIC) == "1"


def restart_count() -> int:
    """How many launches of this elastic job came before this one (0: the first)."""
    try:
        return int(os.environ.get(ENV_RESTART, "0"))
    except ValueError:
        return 0


def state_dir() -> Optional[str]:
    """The folder for this host's committed state, or None (commits stay in memory)."""
    return os.environ.get(ENV_STATE_DIR) or None

