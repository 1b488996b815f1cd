"""Host discovery for both elastic drivers (``elastic_driver.py`` over mpirun,
``gloo_elastic.py`` in place): the script, run on a thread of its own.

Horovod's driver runs its discovery script on a thread too: a script that takes seconds (a
cloud API, a scheduler's query) must not hold back the loop that watches the ranks, so a lost
rank is handled, and Ctrl-C answered, while the script runs.
"""

from __future__ import annotations

import subprocess
import threading
from typing import Callable, Dict, Optional

from bluefog.run import elastic_hosts as eh


def run_script(script: str, timeout: float, env: Dict[str, str]) -> eh.Hosts:
    """The hosts the discovery ``script`` prints (one ``host:slots`` line each). Raises
    ValueError saying what went wrong: it failed, took over ``timeout`` s, or printed no
    host list."""
    try:
        out = subprocess.run(script, shell=True, capture_output=True, text=True,
                             timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        raise ValueError(f"host discovery script {script!r} took over {timeout:g} s") from None
    except OSError as e:
        raise ValueError(f"host discovery script {script!r} could not run: {e}") from None
    if out.returncode != 0:
        raise ValueError(f"host discovery script {script!r} exited with {out.returncode}: "
                         f"{out.stderr.strip()[-300:]}")
    return eh.parse_discovery_output(out.stdout)


class Discovery:
    """Calls ``run()`` (the hosts, or None when the run failed) every ``interval`` seconds on a
    thread of its own; ``take()`` gives the driver's loop the newest result without waiting.
    A run that takes over the script's timeout counts as a failed one (the hosts stay as they
    were)."""

    def __init__(self, run: Callable[[], Optional[eh.Hosts]], interval: float):
        self.run = run
        self.interval = interval
        self.lock = threading.Lock()
        self.latest: Optional[eh.Hosts] = None
        self.fresh = False
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._loop, name="bluefog-discovery",
                                       daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        while not self.stopping.wait(self.interval):
            hosts = self.run()
            if hosts is not None:
                with self.lock:
                    self.latest, self.fresh = hosts, True

    def take(self) -> Optional[eh.Hosts]:
        """The hosts of the last run that succeeded since the last take(), else None."""
        with self.lock:
            hosts, self.fresh = (self.latest if self.fresh else None), False
        return hosts

    def stop(self) -> None:
        self.stopping.set()
