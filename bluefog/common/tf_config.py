"""TF_CONFIG as a Gloo rendezvous: a job that a TensorFlow launcher (a Kubernetes operator,
Vertex AI, a hand-written TF_CONFIG) started gets MASTER_ADDR/MASTER_PORT/RANK/WORLD_SIZE from
it, so ``bf.init()`` runs on Gloo without mpirun (docs/design.md, "Without mpirun").

Every bluefog process is a worker: worker 0's address is the rendezvous, the task index is the
rank, the number of workers the world size. A chief, parameter server or evaluator task has no
place in such a job and is refused with an error that says so.
"""

from __future__ import annotations

import json
from typing import Dict, Mapping, Optional

_RENDEZVOUS = ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE")
_MPI_LAUNCHER = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK")


def _mpi_launched(env: Mapping[str, str]) -> bool:
    """Whether an MPI launcher started the process, as the core decides (Config::mpi_launched):
    a singleton's variables (OMPI_MCA_ess=singleton, inherited from a parent that imported
    mpi4py) are not a launcher's. ``os.environ`` is the environment Python started with, so the
    variables MPI_Init sets inside this process are not in it."""
    return env.get("OMPI_MCA_ess") != "singleton" and any(v in env for v in _MPI_LAUNCHER)


def rendezvous_from_tf_config(env: Mapping[str, str]) -> Optional[Dict[str, str]]:
    """The rendezvous variables TF_CONFIG implies, or None when it does not apply: no TF_CONFIG,
    BLUEFOG_BACKEND=mpi, an MPI launcher started the process, or any of the four variables is
    already set (they win). Raises ValueError naming TF_CONFIG's problem otherwise."""
    text = env.get("TF_CONFIG")
    if not text or env.get("BLUEFOG_BACKEND") == "mpi":
        return None
    if _mpi_launched(env) or any(v in env for v in _RENDEZVOUS):
        return None
    try:
        config = json.loads(text)
        cluster = config.get("cluster") or {}
        task = config.get("task") or {}
    except (ValueError, AttributeError) as e:
        raise ValueError(f"TF_CONFIG is not a JSON object with 'cluster' and 'task': {e}") from e
    kind = task.get("type")
    if kind != "worker":
        raise ValueError(
            f"TF_CONFIG says this process is task type {kind!r}: bluefog runs every process as "
            f"a worker (no chief, parameter servers or evaluator; each rank trains and they "
            f"average among themselves). Start only workers, listed under cluster.worker, or "
            f"set MASTER_ADDR, MASTER_PORT, RANK and WORLD_SIZE yourself")
    workers = cluster.get("worker")
    if not isinstance(workers, list) or not workers:
        raise ValueError("TF_CONFIG has no cluster.worker list (host:port of every worker)")
    duplicates = sorted({str(w) for w in workers if workers.count(w) > 1})
    if duplicates:
        raise ValueError(f"TF_CONFIG lists worker(s) {', '.join(duplicates)} more than once in "
                         f"cluster.worker; each worker needs an address of its own")
    index = task.get("index")
    if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < len(workers):
        raise ValueError(f"TF_CONFIG task.index {index!r} is not a position in cluster.worker "
                         f"({len(workers)} workers)")
    host, sep, port = str(workers[0]).rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ValueError(f"TF_CONFIG cluster.worker[0] = {workers[0]!r} is not host:port; "
                         f"worker 0's address is the rendezvous")
    return {"MASTER_ADDR": host.strip("[]"), "MASTER_PORT": port, "RANK": str(index),
            "WORLD_SIZE": str(len(workers))}
