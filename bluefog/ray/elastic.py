"""Elastic training on Ray: workers are Ray actors that re-form the job in place when one is
lost (Horovod's ``horovod.ray.ElasticRayExecutor``, and ``RayExecutor(min_workers=...)``).

The driver (the process that calls ``run``) serves the Gloo rendezvous store and runs the job
as rounds, exactly as ``bfrun --gloo --min-np`` does (bluefog/run/gloo_elastic.py, whose round
logic this reuses): the hosts are Ray's alive nodes, each with as many slots as its CPUs (and
GPUs, with ``use_gpu``) hold workers; a worker is an actor pinned to its node that runs the
function once. An actor that dies (``ray.kill``, ``kill -9`` of its process, its node lost)
leaves the round, the survivors' ``bf.elastic.run`` restores the last commit and the job goes
on with them, in the same processes. A lost worker's slot is not used again (as a failed host
is blacklisted); slots of nodes that join the cluster are, up to ``max_num_proc``.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import time
from typing import Any, Callable, Dict, List, Optional

from bluefog.common import elastic_rounds, gloo_store
from bluefog.run import elastic_hosts as eh
from bluefog.run.gloo_elastic import GlooElasticDriver, Worker, log

try:
    import ray
    from ray.exceptions import RayActorError
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
except ImportError as e:  # pragma: no cover - exercised only without Ray
    raise ImportError("bluefog.ray needs Ray: pip install ray"
                      ) from e

from bluefog.ray.common import _LAUNCHER_PREFIXES, _RENDEZVOUS, _summary


@dataclasses.dataclass
class ElasticRaySettings:
    """What ``ElasticRayExecutor.create_settings`` returns (Horovod's ``ElasticSettings``)."""

    min_num_proc: int = 1
    max_num_proc: Optional[int] = None
    timeout_s: int = 30
    elastic_timeout: int = 600
    discovery_interval: float = 1.0
    reset_limit: Optional[int] = None


class _ElasticWorker:
    """One worker: a Ray actor with the job's rendezvous in its environment."""

    def __init__(self, env: Dict[str, str]):
        for key in list(os.environ):
            if key.startswith(_LAUNCHER_PREFIXES) or key in _RENDEZVOUS:
                del os.environ[key]
        os.environ.update(env)

    def pid(self) -> int:
        return os.getpid()

    def call(self, fn: Callable[[], Any]) -> Any:
        return fn()


class _ActorProcess:
    """The running function of one actor, seen as the driver sees a worker process."""

    def __init__(self, actor, ref):
        self.actor = actor
        self.ref = ref
        self.returncode: Optional[int] = None
        self.result: Any = None
        self.error: Optional[BaseException] = None
        self.stdin = None

    def poll(self) -> Optional[int]:
        if self.returncode is None and ray.wait([self.ref], timeout=0)[0]:
            try:
                self.result = ray.get(self.ref)
                self.returncode = 0
            except RayActorError as e:  # the actor's process is gone
                self.error = e
                self.returncode = -signal.SIGKILL
            except Exception as e:  # noqa: BLE001 - the function raised
                self.error = e
                self.returncode = 1
        return self.returncode

    def terminate(self) -> None:
        try:
            ray.kill(self.actor)
        except Exception:  # noqa: BLE001 - already gone
            pass


class _RayDriver(GlooElasticDriver):
    def __init__(self, fn, settings: ElasticRaySettings, cpus_per_slot: float,
                 gpus_per_slot: float, env_vars: Dict[str, str]):
        from types import SimpleNamespace

        args = SimpleNamespace(hosts=None, max_np=settings.max_num_proc, np=None,
                               min_np=settings.min_num_proc, host_discovery_script="ray",
                               discovery_interval=settings.discovery_interval,
                               reset_limit=settings.reset_limit)
        super().__init__(args, {}, [], None)
        self.fn = fn
        self.settings = settings
        self.cpus_per_slot = cpus_per_slot
        self.gpus_per_slot = gpus_per_slot
        self.env_vars = env_vars
        self.nodes: Dict[str, str] = {}  # host name (ip#node) -> Ray node id
        self.lost_slots: Dict[str, int] = {}
        self._counted: set = set()
        self.lost = _LostList(self)

    def hosts(self) -> Optional[eh.Hosts]:
        found = []
        for node in ray.nodes():
            if not node.get("Alive"):
                continue
            res = node.get("Resources", {})
            slots = int(res.get("CPU", 0) // self.cpus_per_slot) if self.cpus_per_slot else 1 << 30
            if self.gpus_per_slot:
                slots = min(slots, int(res.get("GPU", 0) // self.gpus_per_slot))
            host = f"{node['NodeManagerAddress']}#{node['NodeID'][:8]}"
            self.nodes[host] = node["NodeID"]
            slots -= self.lost_slots.get(host, 0)
            if slots > 0:
                found.append((host, slots))
        return found

    def start_worker(self, host: str) -> str:
        wid = str(self.next_id)
        self.next_id += 1
        env = {"MASTER_ADDR": self.addr, "MASTER_PORT": str(self.port),
               "BLUEFOG_JOB_TOKEN": self.secret, "BLUEFOG_BACKEND": "gloo",
               "BLUEFOG_GLOO_EXTERNAL_STORE": "1", "BLUEFOG_GLOO_TIMEOUT":
               str(self.settings.timeout_s), elastic_rounds.ENV_WORKER: wid}
        env.update({k: str(v) for k, v in self.env_vars.items()})
        actor = ray.remote(_ElasticWorker).options(
            num_cpus=self.cpus_per_slot, num_gpus=self.gpus_per_slot,
            scheduling_strategy=NodeAffinitySchedulingStrategy(self.nodes[host], soft=False)
        ).remote(env)
        self.workers[wid] = Worker(wid, host, _ActorProcess(actor, actor.call.remote(self.fn)))
        return wid

    def end_all(self) -> None:
        for w in self.workers.values():
            w.proc.terminate()

    def run(self) -> int:
        deadline = time.monotonic() + self.settings.elastic_timeout
        while True:
            hosts = self.hosts() or []
            first = eh.total_slots(eh.assign(hosts, self.max_np))
            if first >= self.args.min_np:
                break
            if time.monotonic() > deadline:
                log(f"giving up: {first} slot(s) on the Ray cluster after "
                    f"{self.settings.elastic_timeout} s, below min_num_proc {self.args.min_np}")
                return 1
            time.sleep(1.0)
        self.addr = ray.util.get_node_ip_address()
        # Bound to the address the workers are given, not to every interface.
        self.store = gloo_store.StoreServer(self.addr, 0, gloo_store.job_token(self.secret),
                                            gone_prefix=self._gone_prefix)
        self.port = self.store.port
        members = [self.start_worker(h) for h in eh.rank_hosts(eh.assign(hosts, self.max_np))]
        self.publish(members, "start")
        try:
            return self.loop()
        finally:
            self.end_all()
            self.store.close()

    def _blacklist(self, host: str, now: float) -> None:
        """Ray's nodes are not blacklisted: the lost worker's slot alone goes (_note_lost)."""

    def _note_lost(self) -> None:
        """A lost worker's slot is not used again."""
        for w in self.workers.values():
            if w.ended and w.proc.returncode not in (0, None) and w.wid not in self._counted:
                self._counted.add(w.wid)
                self.lost_slots[w.host] = self.lost_slots.get(w.host, 0) + 1


class _LostList(list):
    """The driver's list of lost workers; each addition takes the worker's slot away."""

    def __init__(self, driver: _RayDriver):
        super().__init__()
        self.driver = driver

    def append(self, what: str) -> None:
        super().append(what)
        self.driver._note_lost()


class ElasticRayExecutor:
    """Runs an elastic training function on Ray actors, as Horovod's
    ``horovod.ray.ElasticRayExecutor``::

        import ray
        from bluefog.ray import ElasticRayExecutor

        def train():
            import bluefog.tensorflow as bf
            bf.init()
            state = bf.elastic.KerasState(model, optimizer, epoch=0, batch=0)

            @bf.elastic.run
            def loop(state):
                ...                  # training steps; state.commit() every few
            loop(state)
            return bf.rank(), ...

        ray.init(address="auto")
        settings = ElasticRayExecutor.create_settings(min_num_proc=2, max_num_proc=8)
        executor = ElasticRayExecutor(settings, cpus_per_slot=2)
        executor.start()
        results = executor.run(train)   # the results of the last round's workers, rank order

    The workers are as many as the alive Ray nodes' resources hold (``cpus_per_slot`` CPUs,
    with ``use_gpu`` also ``gpus_per_slot`` GPUs each), at most ``max_num_proc``. A lost actor
    leaves the job, which goes on with the others from the last commit (``bf.elastic``) as long
    as ``min_num_proc`` remain; new nodes' slots join at the next commit.
    """

    @staticmethod
    def create_settings(min_num_proc: int = 1, max_num_proc: Optional[int] = None,
                        reset_limit: Optional[int] = None, elastic_timeout: int = 600,
                        timeout_s: int = 30, ssh_identity_file: Optional[str] = None,
                        nics: Optional[str] = None, min_np: Optional[int] = None,
                        max_np: Optional[int] = None, **kwargs: Any) -> ElasticRaySettings:
        """Settings for the executor, with Horovod's names: ``min_num_proc`` (the fewest
        workers the job goes on with), ``max_num_proc`` (the most; default: every slot),
        ``elastic_timeout`` (seconds to wait for ``min_num_proc`` slots at the start),
        ``timeout_s`` (seconds the workers wait for each other at a rendezvous); ``min_np``
        and ``max_np`` are the older names. ``ssh_identity_file`` and ``nics`` are accepted
        and unused (the workers connect over Gloo, without SSH). ``reset_limit``: the most
        times the job may re-form (a worker lost, workers joining); the next time ``run``
        raises."""
        del ssh_identity_file, nics, kwargs
        if reset_limit is not None and (not isinstance(reset_limit, int) or reset_limit < 0):
            raise ValueError(f"ElasticRayExecutor: reset_limit={reset_limit!r} must be an int "
                             ">= 0")
        min_num_proc = min_np if min_np is not None else min_num_proc
        max_num_proc = max_np if max_np is not None else max_num_proc
        if not isinstance(min_num_proc, int) or min_num_proc < 1:
            raise ValueError(f"ElasticRayExecutor: min_num_proc={min_num_proc!r} must be an "
                             f"int >= 1")
        if max_num_proc is not None and max_num_proc < min_num_proc:
            raise ValueError(f"ElasticRayExecutor: max_num_proc={max_num_proc} is below "
                             f"min_num_proc={min_num_proc}")
        return ElasticRaySettings(min_num_proc=min_num_proc, max_num_proc=max_num_proc,
                                  timeout_s=timeout_s, elastic_timeout=elastic_timeout,
                                  reset_limit=reset_limit)

    def __init__(self, settings: ElasticRaySettings, use_gpu: bool = False,
                 cpus_per_slot: float = 1, gpus_per_slot: Optional[float] = None,
                 env_vars: Optional[Dict[str, str]] = None, override_discovery: bool = True):
        if gpus_per_slot and not use_gpu:
            raise ValueError("ElasticRayExecutor: gpus_per_slot is set but use_gpu is False")
        if not override_discovery:
            raise ValueError("ElasticRayExecutor: override_discovery=False is not supported: "
                             "the hosts are always Ray's alive nodes")
        self.settings = settings
        self.cpus_per_slot = cpus_per_slot
        self.gpus_per_slot = (gpus_per_slot or 1) if use_gpu else 0
        self.env_vars = dict(env_vars or {})
        self._started = False
        self.lost: List[str] = []

    def start(self) -> None:
        """Connects to Ray (``ray.init()`` if no connection is open). The workers start in
        ``run``."""
        if not ray.is_initialized():
            ray.init()
        self._started = True

    def run(self, worker_fn: Callable[[], Any],
            callbacks: Optional[List[Callable]] = None) -> List[Any]:
        """Runs ``worker_fn()`` on the workers until the job ends; returns the results of the
        workers of its last round, in rank order. A worker whose function raised is lost as a
        dead one is (the others go on, and the driver logs the error); when fewer than
        ``min_num_proc`` workers remain, raises RuntimeError (a raised error its cause).
        ``callbacks`` (Horovod's values logged by rank 0) are not supported."""
        if callbacks:
            raise ValueError("ElasticRayExecutor.run: callbacks are not supported; print or "
                             "return the values instead")
        if not self._started:
            raise RuntimeError("ElasticRayExecutor: run() before start(): call "
                               "executor.start()")
        driver = _RayDriver(worker_fn, self.settings, self.cpus_per_slot, self.gpus_per_slot,
                            self.env_vars)
        code = driver.run()
        self.lost = list(driver.lost)
        raised = [(wid, w.proc.error) for wid, w in driver.workers.items()
                  if w.proc.returncode == 1 and w.proc.error is not None]
        if code != 0:
            if raised:
                wid, error = raised[0]
                raise RuntimeError(f"ElasticRayExecutor: the job failed: worker {wid} raised "
                                   f"{_summary(error)}") from error
            raise RuntimeError(f"ElasticRayExecutor: the job failed: fewer than min_num_proc="
                               f"{self.settings.min_num_proc} workers left. Lost: "
                               f"{'; '.join(driver.lost) or 'none'}")
        for wid, error in raised:  # a lost worker, as a dead one: the job went on without it
            log(f"worker {wid} raised {_summary(error)}; the job went on without it")
        procs = [driver.workers[w].proc for w in driver.members]
        return [p.result for p in procs]

    def shutdown(self) -> None:
        """Nothing to free: the workers end with ``run``."""
        self._started = False
