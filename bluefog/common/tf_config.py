"""TF_CONFIG as a Gloo rendezvous: a job that a TensorFlow launcher (a Kubernetes operator,
Vertex AI, SageMaker, a hand-written TF_CONFIG) started gets MASTER_ADDR/MASTER_PORT/RANK/WORLD_SIZE
from it, so ``bf.init()`` runs on Gloo without mpirun (docs/launching.md, "Without mpirun").

The ranks follow MultiWorkerMirroredStrategy's order: the chief (when ``cluster.chief`` lists one)
is rank 0 and worker i is rank i + 1; without a chief, worker i is rank i. Rank 0's address is the
rendezvous. A parameter server or evaluator has no place in such a job: a cluster that lists one
is refused on every process, with the same message, so that no subset of it starts a job alone.
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
    for name, value in (("cluster", cluster), ("task", task)):
        if not isinstance(value, dict):
            raise ValueError(f"TF_CONFIG's {name!r} is {_json_kind(value)}, not an object: "
                             f"{_EXAMPLE}")
    others = sorted(str(k) for k, tasks in cluster.items() if k not in _ROLES and tasks)
    if others:
        raise ValueError(
            f"TF_CONFIG's cluster lists {', '.join(repr(k) for k in others)}: bluefog runs every "
            f"process as a chief or worker (no parameter servers or evaluator; each rank trains "
            f"and they average among themselves). Start only a chief and workers, listed under "
            f"cluster.chief and cluster.worker, or set MASTER_ADDR, MASTER_PORT, RANK and "
            f"WORLD_SIZE yourself")
    chiefs = _addresses(cluster, "chief")
    workers = _addresses(cluster, "worker")
    if len(chiefs) > 1:
        raise ValueError(f"TF_CONFIG lists {len(chiefs)} tasks in cluster.chief; there is at "
                         f"most one chief (rank 0), the others belong under cluster.worker")
    ranks = chiefs + workers
    if not ranks:
        raise ValueError("TF_CONFIG has no cluster.worker list (host:port of every worker)")
    duplicates = sorted({str(w) for w in ranks if ranks.count(w) > 1})
    if duplicates:
        raise ValueError(f"TF_CONFIG lists task(s) {', '.join(duplicates)} more than once in "
                         f"cluster.chief and cluster.worker; each task needs an address of its own")
    kind = task.get("type")
    if kind not in _ROLES:
        raise ValueError(
            f"TF_CONFIG says this process is task type {kind!r}: bluefog runs every process as "
            f"a chief or worker (no parameter servers or evaluator; each rank trains and they "
            f"average among themselves). Start only a chief and workers, or set MASTER_ADDR, "
            f"MASTER_PORT, RANK and WORLD_SIZE yourself")
    members = chiefs if kind == "chief" else workers
    index = task.get("index")
    if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < len(members):
        raise ValueError(f"TF_CONFIG task.index {index!r} is not a position in cluster.{kind} "
                         f"({len(members)} {kind}s)")
    rank = index + (len(chiefs) if kind == "worker" else 0)
    first = "chief[0]" if chiefs else "worker[0]"
    host, sep, port = str(ranks[0]).rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ValueError(f"TF_CONFIG cluster.{first} = {ranks[0]!r} is not host:port; "
                         f"rank 0's address is the rendezvous")
    return {"MASTER_ADDR": host.strip("[]"), "MASTER_PORT": port, "RANK": str(rank),
            "WORLD_SIZE": str(len(ranks))}


_ROLES = ("chief", "worker")  # MultiWorkerMirroredStrategy's order: the chief is rank 0
_EXAMPLE = ('TF_CONFIG=\'{"cluster": {"worker": ["host0:2222", "host1:2222"]}, '
            '"task": {"type": "worker", "index": 0}}\'')


def _addresses(cluster: Mapping[str, object], role: str) -> list:
    tasks = cluster.get(role)
    if tasks is None:
        return []
    if not isinstance(tasks, list):
        raise ValueError(f"TF_CONFIG cluster.{role} is {_json_kind(tasks)}, not a list of "
                         f"host:port: {_EXAMPLE}")
    return tasks


def _json_kind(value: object) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean",
            int: "a number", float: "a number", type(None): "null"}.get(type(value), "a value")
