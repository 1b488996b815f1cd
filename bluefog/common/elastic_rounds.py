"""The rounds of an in-place elastic job (``bfrun --gloo --min-np``), as a worker sees them.

bfrun serves the Gloo store (bluefog/common/gloo_store.py) and stays alive for the whole job;
each worker process keeps running across the job's changes. The job is a series of *rounds*:
a round is a list of workers (their ids, in rank order) with a key prefix of its own in the
store, so that a round's rendezvous never reads an older round's keys. The driver
(bluefog/run/gloo_elastic.py) publishes a new round when a worker died or when new workers
are ready to join; the workers of the old round notice (a failed collective, or ``commit()``
seeing the newer round) and call ``bf.init()`` again, which joins the newest round that
includes them. No TensorFlow here: the driver imports this module too.

Keys in the store (besides the Gloo rendezvous' own, under ``r<N>/``):

* ``elastic/round``: the newest round's number; ``elastic/round/<N>``: its JSON record
  ``{"round": N, "workers": [id, ...], "hosts": [host, ...]}`` (rank r is ``workers[r]``);
* ``elastic/waiting/<id>``: set by a worker when it first waits for a round (a new worker
  is ready: the driver adds it at the next round);
* ``elastic/alive/<id>``: a count a worker raises every ``HEARTBEAT_S`` from its first
  round on, from a thread of its own: the driver takes a worker whose count stops for a stopped
  or frozen process, and kills it (the others would wait for it without an error);
* ``elastic/failed/<id>``: the round a worker left because a collective failed;
* ``elastic/finished/<id>``: the round a worker was in when its training function returned;
* ``r<N>/bluefog/abort``: set by the driver when round N is given up before it formed.
"""

from __future__ import annotations

import json
import os
import threading
import time
from typing import Dict, List, Optional, Tuple

ENV_WORKER = "BLUEFOG_ELASTIC_WORKER"  # this worker's id, set by the elastic bfrun --gloo
ROUND_KEY = "elastic/round"
# How long a worker waits for a round that includes it (a new worker waits for the others to
# reach their next commit).
JOIN_TIMEOUT_S = 600.0

HEARTBEAT_S = 1.0

_client = None
_last_round = [-1]
_heartbeat: List[threading.Thread] = []


def active() -> bool:
    """Whether this process is a worker of an in-place elastic job."""
    return bool(os.environ.get(ENV_WORKER))


def worker_id() -> str:
    return os.environ[ENV_WORKER]


def round_key(n: int) -> str:
    return f"{ROUND_KEY}/{n}"


def prefix(n: int) -> str:
    return f"r{n}/"


def record(n: int, workers: List[str], hosts: List[str]) -> bytes:
    return json.dumps({"round": n, "workers": workers, "hosts": hosts}).encode()


def layout(rec: Dict, wid: str) -> Dict[str, str]:
    """The rendezvous variables of worker ``wid`` in round record ``rec``."""
    rank = rec["workers"].index(wid)
    hosts = rec["hosts"]
    return {"RANK": str(rank), "WORLD_SIZE": str(len(hosts)),
            "LOCAL_RANK": str(sum(1 for h in hosts[:rank] if h == hosts[rank])),
            "LOCAL_WORLD_SIZE": str(hosts.count(hosts[rank])),
            "BLUEFOG_GLOO_PREFIX": prefix(rec["round"])}


def _store():
    global _client
    if _client is None:
        from bluefog.common import gloo_store

        _client = gloo_store.StoreClient(os.environ["MASTER_ADDR"],
                                         int(os.environ["MASTER_PORT"]),
                                         gloo_store.job_token(os.environ["BLUEFOG_JOB_TOKEN"]))
    return _client


def newest_round() -> int:
    value = _store().get(ROUND_KEY)
    return int(value) if value is not None else -1


def current_round() -> int:
    """The round this worker joined last (-1: none yet)."""
    return _last_round[0]


def join_next_round(timeout: float = JOIN_TIMEOUT_S) -> Tuple[int, Dict[str, str]]:
    """Waits for a round newer than this worker's last one that includes it; returns its
    number and the variables bf.init() needs. Raises RuntimeError when the driver left this
    worker out of the job, or none comes within ``timeout``."""
    store = _store()
    wid = worker_id()
    if _last_round[0] < 0:
        store.set(f"elastic/waiting/{wid}", b"1")
        _start_heartbeat(store, wid)
    deadline = time.monotonic() + timeout
    while True:
        newest = newest_round()
        if newest > _last_round[0]:
            rec = json.loads(store.get(round_key(newest)))
            if wid in rec["workers"]:
                _last_round[0] = newest
                return newest, layout(rec, wid)
            if _last_round[0] >= 0:
                raise RuntimeError(f"bluefog elastic: worker {wid} was left out of round "
                                   f"{newest} of the job by bfrun; it ends")
        if time.monotonic() > deadline:
            raise RuntimeError(f"bluefog elastic: worker {wid} waited {timeout:g} s for a round "
                               "of the job that includes it")
        time.sleep(0.02)


def _start_heartbeat(store, wid: str) -> None:
    """Raises ``elastic/alive/<wid>`` every HEARTBEAT_S while this process runs (a daemon
    thread; the client's lock keeps its requests whole beside the training thread's)."""
    if _heartbeat:
        return

    def beat() -> None:
        count = 0
        while True:
            count += 1
            try:
                store.set(f"elastic/alive/{wid}", str(count).encode())
            except (OSError, ValueError):
                return  # the driver is gone: nothing to tell
            time.sleep(HEARTBEAT_S)

    _heartbeat.append(threading.Thread(target=beat, name="bluefog-elastic-heartbeat",
                                       daemon=True))
    _heartbeat[0].start()


def superseded(n: int) -> bool:
    """Whether the driver has published a round newer than ``n`` (waiting up to 5 s for it:
    it may not have noticed the death that broke round n yet)."""
    deadline = time.monotonic() + 5.0
    while time.monotonic() < deadline:
        if newest_round() > n:
            return True
        time.sleep(0.05)
    return False


def report_failure() -> None:
    """Tells the driver this worker left its round because a collective failed."""
    _store().set(f"elastic/failed/{worker_id()}", str(_last_round[0]).encode())


def report_finished() -> None:
    """Tells the driver this worker's training function returned: the job is ending, and the
    others must not wait for this worker in a new round."""
    _store().set(f"elastic/finished/{worker_id()}", str(_last_round[0]).encode())


def hosts_updated() -> Optional[int]:
    """The newest round's number when it is newer than this worker's (the job is changing:
    new workers wait to join, or a worker was lost), else None."""
    newest = newest_round()
    return newest if newest > _last_round[0] else None
