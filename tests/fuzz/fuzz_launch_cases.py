"""The cases of the launch fuzzer (tests/fuzz/fuzz_launch.py): random launch configurations.

A case is 2 or 3 processes started one of four ways, then mutated:

* ``env``: each process started by hand with torchrun's variables (MASTER_ADDR, MASTER_PORT,
  RANK, WORLD_SIZE, often LOCAL_RANK and LOCAL_WORLD_SIZE), as a scheduler without MPI does;
* ``tf_config``: each process with a TF_CONFIG listing the cluster (with or without a chief);
* ``bfrun``: ``bfrun --gloo -np N`` with horovodrun's and bfrun's options;
* ``mpirun``: ``bfrun -np N`` (through mpirun) with the same options.

Mutations draw bad and odd values for those variables (duplicates, out of range, wrapping at
2^32, not numbers, one process disagreeing), ``BLUEFOG_*`` and ``HOROVOD_*`` settings and
bfrun's options. Each case knows the job its configuration asks for where that is plain
(``expected``: per process (rank, size), or None when a mutation makes it unclear): a process
that reports another rank or size has joined a wrong job.
"""

from __future__ import annotations

import dataclasses
import json
import random
import re
from typing import Callable, Dict, List, Optional, Tuple

WRAP = 2**32
# Values of a numeric variable that are not what a rank, size or port can be.
BAD_NUMBERS = ["-1", "abc", "", " ", "1.0", "0x1", "1e3", str(WRAP + 1), "99999999999999999999",
               "٣", "1_0", "nan"]
# Settings with their odd values: some valid, most not. Timeouts stay short or invalid so that
# a case that waits for a rank that never comes ends within its own timeout.
SETTINGS: Dict[str, List[str]] = {
    "BLUEFOG_GLOO_TIMEOUT": ["inf", "-1", "0", "abc", "1e10", "9.3e15", "nan", "1e-9", "2.5"],
    "HOROVOD_GLOO_TIMEOUT_SECONDS": ["inf", "-3", "x", "2", "1e300"],
    "BLUEFOG_BACKEND": ["gloo", "GLOO", "tcp", "", "nccl", "mpi"],
    "HOROVOD_CONTROLLER": ["gloo", "mpi", "ring"],
    "BLUEFOG_LOG_LEVEL": ["trace", "debug", "warning", "loud", "", "5"],
    "HOROVOD_LOG_LEVEL": ["TRACE", "error", "verbose"],
    "BLUEFOG_FUSION_THRESHOLD": ["0", "-1", "abc", "67108864", "1e30", "1", "18446744073709551617"],
    "HOROVOD_FUSION_THRESHOLD": ["0", "-5", "x", "1048576"],
    "BLUEFOG_CYCLE_TIME": ["0", "-1", "nan", "0.5", "5", "inf", "abc"],
    "HOROVOD_CYCLE_TIME": ["1", "-2", "zz"],
    "BLUEFOG_CACHE_CAPACITY": ["0", "-1", "1", "abc", "1024", str(WRAP)],
    "HOROVOD_CACHE_CAPACITY": ["0", "x"],
    "BLUEFOG_STALL_CHECK_TIME": ["0", "-1", "abc", "1", "inf"],
    "BLUEFOG_STALL_SHUTDOWN_TIME": ["0", "-1", "abc", "2"],
    "HOROVOD_STALL_CHECK_TIME_SECONDS": ["5", "x"],
    "BLUEFOG_HIERARCHICAL_ALLREDUCE": ["0", "1", "yes", "2"],
    "HOROVOD_HIERARCHICAL_ALLREDUCE": ["1", "true"],
    "BLUEFOG_RING_THRESHOLD": ["0", "-1", "x", "1"],
    "BLUEFOG_LOCAL_ROUNDS": ["0", "1", "x"],
    "BLUEFOG_EAGER_C_API": ["0", "1", "maybe"],
    "BLUEFOG_JOB_TOKEN": ["", "secret", "x" * 300],
    "HOROVOD_TIMELINE": ["", "/nonexistent/dir/tl.json"],
    "HOROVOD_AUTOTUNE": ["1"],
    "HOROVOD_RANK": ["0", "1", "7"],
    "HOROVOD_SIZE": ["2", "9"],
}


@dataclasses.dataclass
class Case:
    index: int
    mode: str
    nprocs: int
    envs: List[Dict[str, str]]  # per process (env, tf_config); one entry for bfrun, mpirun
    args: List[str]  # bfrun's options (bfrun, mpirun)
    count: int  # allreduce elements
    changes: List[str] = dataclasses.field(default_factory=list)
    # Per process (env, tf_config): the (rank, size) it was configured for; None where a
    # mutation leaves that unsaid, and a rank of None where only the size is said.
    expected: Optional[List[Optional[Tuple[Optional[int], int]]]] = None
    timeout: float = 40.0

    def describe(self) -> str:
        return (f"case {self.index} [{self.mode}, {self.nprocs} processes, {self.count} elements]"
                f": {'; '.join(self.changes) or 'no mutation'}")


def _int(value: Optional[str]) -> Optional[int]:
    """The value as a launcher means it: plain decimal digits (spaces around allowed)."""
    if value is None or not re.fullmatch(r"\s*\+?[0-9]+\s*", value):
        return None
    return int(value)


# -- torchrun's variables -----------------------------------------------------------------------

def _env_case(case: Case, rng: random.Random, port: int) -> None:
    n = case.nprocs
    local = rng.random() < 0.5
    for i in range(n):
        env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": str(i),
               "WORLD_SIZE": str(n)}
        if local:
            env.update(LOCAL_RANK=str(i), LOCAL_WORLD_SIZE=str(n))
        case.envs.append(env)
    for _ in range(rng.choice([0, 1, 1, 2, 2, 3])):
        rng.choice(_ENV_MUTATIONS)(case, rng)


def _some(case: Case, rng: random.Random) -> Tuple[List[int], str]:
    """Every process, or one of them."""
    if rng.random() < 0.5:
        return list(range(case.nprocs)), "all"
    i = rng.randrange(case.nprocs)
    return [i], f"process {i}"


def _set(case: Case, rng: random.Random, name: str, values: List[str]) -> None:
    who, where = _some(case, rng)
    value = rng.choice(values)
    for i in who:
        case.envs[i][name] = value
    case.changes.append(f"{name}={value!r} on {where}")


def _unset(case: Case, rng: random.Random, name: str) -> None:
    who, where = _some(case, rng)
    for i in who:
        case.envs[i].pop(name, None)
    case.changes.append(f"no {name} on {where}")


def _rank(case: Case, rng: random.Random) -> None:
    n = case.nprocs
    kind = rng.choice(["dup", "range", "bad", "wrap", "unset"])
    if kind == "dup":
        i, j = rng.sample(range(n), 2)
        case.envs[i]["RANK"] = case.envs[j].get("RANK", str(j))
        case.changes.append(f"RANK of process {i} = that of process {j}")
    elif kind == "range":
        _set(case, rng, "RANK", [str(n), str(n + 5), "-1"])
    elif kind == "wrap":
        i = rng.randrange(n)
        case.envs[i]["RANK"] = str(WRAP + (_int(case.envs[i].get("RANK")) or 0))
        case.changes.append(f"RANK of process {i} wrapped at 2^32")
    elif kind == "bad":
        _set(case, rng, "RANK", BAD_NUMBERS)
    else:
        _unset(case, rng, "RANK")


def _world(case: Case, rng: random.Random) -> None:
    n = case.nprocs
    values = [str(n + 1), str(n - 1), "0", "1", str(WRAP + n), str(n) + " "] + BAD_NUMBERS
    if rng.random() < 0.2:
        _unset(case, rng, "WORLD_SIZE")
    else:
        _set(case, rng, "WORLD_SIZE", values)


def _port(case: Case, rng: random.Random) -> None:
    port = int(case.envs[0].get("MASTER_PORT", "")) if _int(
        case.envs[0].get("MASTER_PORT")) is not None else 29500
    _set(case, rng, "MASTER_PORT", ["0", "65536", "70000", str(WRAP + port), str(port + 1),
                                    "-1", "port"] + BAD_NUMBERS[:4])


def _addr(case: Case, rng: random.Random) -> None:
    _set(case, rng, "MASTER_ADDR", ["", "no-such-host.invalid", "256.1.1.1", "localhost",
                                    "127.0.0.2", "::1", "[::1]", "127.0.0.1:29500", " "])


def _local(case: Case, rng: random.Random) -> None:
    n = case.nprocs
    name = rng.choice(["LOCAL_RANK", "LOCAL_WORLD_SIZE"])
    _set(case, rng, name, ["-1", str(n + 3), "0", str(WRAP), "x", "", "1"])


def _setting(case: Case, rng: random.Random) -> None:
    name = rng.choice(sorted(SETTINGS))
    _set(case, rng, name, SETTINGS[name])


def _launcher(case: Case, rng: random.Random) -> None:
    """A variable an MPI launcher (or mpi4py's singleton init) would set."""
    name = rng.choice(["OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_SIZE", "OMPI_COMM_WORLD_RANK"])
    _set(case, rng, name, ["0", "1", "2"])


def _tf_config_too(case: Case, rng: random.Random) -> None:
    """A TF_CONFIG beside torchrun's variables (they win), or one that disagrees."""
    cluster = {"worker": [f"127.0.0.1:{1000 + i}" for i in range(case.nprocs + 1)]}
    for i, env in enumerate(case.envs):
        env["TF_CONFIG"] = json.dumps({"cluster": cluster, "task": {"type": "worker",
                                                                    "index": i}})
    case.changes.append("TF_CONFIG beside torchrun's variables")


_ENV_MUTATIONS: List[Callable[[Case, random.Random], None]] = [
    _rank, _rank, _world, _world, _port, _addr, _local, _setting, _setting, _setting, _launcher,
    _tf_config_too]


def _env_expected(case: Case) -> None:
    case.expected = []
    for env in case.envs:
        backend = env.get("BLUEFOG_BACKEND", env.get("HOROVOD_CONTROLLER", ""))
        if any(k.startswith(("OMPI_", "PMIX_", "PMI_")) for k in env):
            # An MPI launcher's variables: the job is MPI's, of the size the launcher states.
            sizes = [_int(env.get(k)) for k in ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE")]
            size = next((v for v in sizes if v), None)
            case.expected.append((None, size) if size and backend != "gloo" else None)
            continue
        if backend == "mpi":  # torchrun's variables ignored: a process of its own
            case.expected.append((0, 1))
            continue
        rank, size = _int(env.get("RANK")), _int(env.get("WORLD_SIZE"))
        case.expected.append((rank, size) if rank is not None and size is not None else None)


# -- TF_CONFIG ----------------------------------------------------------------------------------

def _tf_case(case: Case, rng: random.Random, port: int) -> None:
    n = case.nprocs
    chief = rng.random() < 0.5
    addrs = [f"127.0.0.1:{port + i}" for i in range(n)]
    cluster = {"chief": addrs[:1], "worker": addrs[1:]} if chief else {"worker": addrs}
    tasks = [("chief", 0)] + [("worker", i) for i in range(n - 1)] if chief else \
        [("worker", i) for i in range(n)]
    configs = [{"cluster": json.loads(json.dumps(cluster)), "task": {"type": t, "index": i}}
               for t, i in tasks]
    case.expected = [(r, n) for r in range(n)]
    for _ in range(rng.choice([0, 1, 1, 2])):
        who = rng.randrange(n)
        kind = rng.choice(["index", "dup", "type", "ps", "cluster", "task", "port", "json"])
        c = configs[who]
        if not isinstance(c, dict) or not isinstance(c.get("task"), dict):
            continue
        if kind == "index":
            c["task"]["index"] = rng.choice([n, -1, "1", 1.5, None, WRAP])
        elif kind == "dup":
            other = configs[(who + 1) % n]
            if isinstance(other, dict) and isinstance(other.get("task"), dict):
                c["task"] = dict(other["task"])
        elif kind == "type":
            c["task"]["type"] = rng.choice(["ps", "evaluator", "Worker", "master", "", 3])
        elif kind == "ps":
            for cfg in configs:
                if isinstance(cfg, dict) and isinstance(cfg["cluster"], dict):
                    cfg["cluster"]["ps"] = ["127.0.0.1:1"]
        elif kind == "cluster":
            c["cluster"] = rng.choice([[], "worker", {"worker": "127.0.0.1:1"},
                                       {"worker": [1, 2]}, {}, {"chief": addrs}])
        elif kind == "task":
            c["task"] = rng.choice([[], "worker", {}, {"type": "worker"}])
        elif kind == "port":
            bad = rng.choice(["127.0.0.1:abc", "127.0.0.1", "127.0.0.1:70000", ":1", "host:-1"])
            for cfg in configs:
                if not isinstance(cfg, dict) or not isinstance(cfg["cluster"], dict):
                    continue
                first = "chief" if "chief" in cfg["cluster"] else "worker"
                if isinstance(cfg["cluster"].get(first), list) and cfg["cluster"][first]:
                    cfg["cluster"][first][0] = bad
        elif kind == "json":
            case.changes.append(f"TF_CONFIG of process {who} not JSON")
            configs[who] = "{not json"
            case.expected = None
            continue
        case.changes.append(f"TF_CONFIG {kind} on process {who}: {json.dumps(configs[who])}")
        case.expected = None
    for c in configs:
        case.envs.append({"TF_CONFIG": c if isinstance(c, str) else json.dumps(c)})
    if rng.random() < 0.3:
        _setting(case, rng)
    if rng.random() < 0.15:
        _set(case, rng, "RANK", ["0", "1", "5"])
        case.expected = None


# -- bfrun --------------------------------------------------------------------------------------

BFRUN_OPTIONS: List[Callable[[int, random.Random], List[str]]] = [
    lambda n, r: ["--gloo-timeout-seconds", r.choice(["2", "0", "-1", "inf", "nan", "1e10"])],
    lambda n, r: ["--fusion-threshold-mb", r.choice(["0", "1", "-1", "64", "1e9", "nan"])],
    lambda n, r: ["--cycle-time-ms", r.choice(["0", "0.5", "-1", "5", "nan", "inf"])],
    lambda n, r: ["--log-level", r.choice(["DEBUG", "trace", "FATAL", "nonsense"])],
    lambda n, r: ["--cache-capacity", r.choice(["0", "1", "-1", "1024"])],
    lambda n, r: ["--disable-cache"],
    lambda n, r: ["--no-stall-check"],
    lambda n, r: ["--stall-check-warning-time-seconds", r.choice(["1", "0", "-1"])],
    lambda n, r: ["--stall-check-shutdown-time-seconds", r.choice(["3", "0", "-2"])],
    lambda n, r: ["--hierarchical-allreduce"],
    lambda n, r: ["-H", r.choice([f"localhost:{n}", "localhost:1", f"localhost:{n + 1}",
                                  "localhost:x", "localhost:0", "localhost:-1", "",
                                  f"127.0.0.1:{n}", f"localhost:{WRAP + n}"])],
    lambda n, r: ["--gloo-port", r.choice(["0", "70000", "-1", "1", str(WRAP + 40000)])],
    lambda n, r: ["-x", r.choice(["BLUEFOG_LOG_LEVEL=debug", "NOT_SET_ANYWHERE", "A=1",
                                  "BLUEFOG_GLOO_TIMEOUT=abc", "=x"])],
    lambda n, r: ["--no-tag-output"],
    lambda n, r: ["--prefix-output-with-timestamp"],
    lambda n, r: ["--verbose"],
    lambda n, r: ["-p", r.choice(["22", "0", "70000"])],
    lambda n, r: ["--network-interface", r.choice(["lo", "nosuch0"])],
    lambda n, r: ["--timeline-filename", r.choice(["/nonexistent/dir/tl", ""])],
    lambda n, r: ["--output-filename", r.choice(["/nonexistent/dir/out"])],
]


def _bfrun_case(case: Case, rng: random.Random) -> None:
    n = case.nprocs
    np_ = rng.choice([str(n)] * 8 + ["0", "-1", str(WRAP + n), "x"])
    case.args = ["-np", np_] if rng.random() < 0.9 else []
    if not case.args:
        case.args = ["-H", f"localhost:{n}"]
    case.changes.append(" ".join(case.args))
    for _ in range(rng.choice([0, 1, 1, 2, 3])):
        opt = rng.choice(BFRUN_OPTIONS)(n, rng)
        case.args += opt
        case.changes.append(" ".join(repr(a) if not a or " " in a else a for a in opt))
    case.envs.append({})
    if rng.random() < 0.3:
        name = rng.choice(sorted(SETTINGS))
        value = rng.choice(SETTINGS[name])
        case.envs[0][name] = value
        case.changes.append(f"{name}={value!r} in bfrun's environment")
    if rng.random() < 0.1:
        name = rng.choice(["RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "TF_CONFIG"])
        case.envs[0][name] = rng.choice(["7", "localhost", "{}", "1"])
        case.changes.append(f"{name} left in bfrun's environment")


def make_case(index: int, rng: random.Random, port: int, modes: List[str]) -> Case:
    mode = rng.choice(modes)
    case = Case(index=index, mode=mode, nprocs=rng.choice([2, 3]), envs=[], args=[],
                count=rng.choice([1, 5, 5, 4099, 70000]))
    if mode == "env":
        _env_case(case, rng, port)
        _env_expected(case)
    elif mode == "tf_config":
        _tf_case(case, rng, port)
    else:
        _bfrun_case(case, rng)
    for env in case.envs:
        env["LAUNCH_FUZZ_COUNT"] = str(case.count)
    return case
