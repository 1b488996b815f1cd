"""ElasticRayExecutor: in-place elastic training on Ray actors (Gloo backend).

The driver of ``bfrun --gloo --min-np`` (bluefog/run/gloo_elastic.py) with Ray actors for
worker processes and Ray's node list for host discovery: each alive node offers
``CPU // cpus_per_worker`` slots. The store is served from the process that calls ``run()``.
A worker whose actor dies (its process killed, its node lost) leaves the job; the others carry
on in place (``bf.elastic.run``); new nodes get workers that join at the next commit.
"""

from __future__ import annotations

import argparse
import os
import signal
import time
from typing import Any, Callable, Dict, List, Optional, Sequence

from bluefog.run import elastic_hosts as eh
from bluefog.run.gloo_elastic import GlooElasticDriver

try:
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
except ImportError as e:  # pragma: no cover - exercised only without Ray
    raise ImportError("bluefog.ray needs Ray: pip install 'bluefog-tf[ray]' (or pip install ray)"
                      ) from e

_LAUNCHER_PREFIXES = ("OMPI_", "PMIX_", "PMI_", "OPAL_", "PRTE_")
_RENDEZVOUS = ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK",
               "LOCAL_WORLD_SIZE", "TF_CONFIG", "BLUEFOG_JOB_TOKEN")


class _ElasticWorker:
    def run(self, env: Dict[str, str], fn: Callable, args: Sequence, kwargs: Dict) -> Any:
        for key in list(os.environ):
            if key.startswith(_LAUNCHER_PREFIXES) or key in _RENDEZVOUS:
                del os.environ[key]
        os.environ.update(env)
        return fn(*args, **kwargs)


class _ActorProcess:
    """A worker actor seen as the driver sees a process: poll(), returncode, wait(), stop()."""

    def __init__(self, actor, ref):
        self.actor = actor
        self.ref = ref
        self.returncode: Optional[int] = None
        self.result: Any = None
        self.error: Optional[BaseException] = None

    def poll(self) -> Optional[int]:
        if self.returncode is None:
            ready, _ = ray.wait([self.ref], timeout=0)
            if ready:
                try:
                    self.result = ray.get(self.ref)
                    self.returncode = 0
                except ray.exceptions.RayActorError as e:
                    self.error, self.returncode = e, -int(signal.SIGKILL)
                except Exception as e:  # noqa: BLE001 - the function raised: reported by run()
                    self.error, self.returncode = e, 1
        return self.returncode

    def wait(self, timeout: Optional[float] = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                import subprocess

                raise subprocess.TimeoutExpired("ray actor", timeout)
            time.sleep(0.02)
        return self.returncode

    def stop(self) -> None:
        ray.kill(self.actor, no_restart=True)


class _RayDriver(GlooElasticDriver):
    def __init__(self, args, cpus_per_worker: float, fn, fn_args, fn_kwargs, env):
        super().__init__(args, env, [], lambda env, extra: [])
        self.cpus_per_worker = cpus_per_worker
        self.fn, self.fn_args, self.fn_kwargs = fn, fn_args, fn_kwargs
        self.actor_class = ray.remote(num_cpus=cpus_per_worker)(_ElasticWorker)

    def hosts(self) -> Optional[eh.Hosts]:
        hosts = []
        for node in ray.nodes():
            slots = int(node.get("Resources", {}).get("CPU", 0) // self.cpus_per_worker)
            if node.get("Alive") and slots > 0:
                hosts.append((node["NodeID"], slots))
        return hosts

    def listen(self, hosts: eh.Hosts) -> str:
        self.addr = ray.util.get_node_ip_address()
        return ""

    def spawn(self, wid: str, host: str):
        actor = self.actor_class.options(
            scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=host, soft=False)).remote()
        env = dict(self.env)
        env.update(self.worker_env(wid))
        return _ActorProcess(actor, actor.run.remote(env, self.fn, self.fn_args, self.fn_kwargs))


class ElasticRayExecutor:
    """Runs an elastic training function on Ray, as Horovod's ``ElasticRayExecutor``::

        from bluefog.ray import ElasticRayExecutor

        def train():
            import bluefog.tensorflow as bf
            bf.init()
            state = bf.elastic.KerasState(model, optimizer, epoch=0)
            @bf.elastic.run
            def loop(state): ...
            loop(state)
            return bf.rank(), ...

        ray.init(address="auto")
        executor = ElasticRayExecutor(ElasticRayExecutor.create_settings(), min_workers=2,
                                      max_workers=8, cpus_per_worker=1)
        executor.start()
        results = executor.run(train)   # the last round's workers' results, in rank order

    Every alive Ray node offers ``CPU // cpus_per_worker`` slots (looked at every
    ``discovery_interval`` seconds); the job starts on up to ``max_workers`` of them. Fewer
    than ``min_workers`` left: ``run()`` raises RuntimeError naming the workers lost.
    """

    @staticmethod
    def create_settings(timeout_s: int = 300, discovery_interval: float = 1.0
                        ) -> Dict[str, float]:
        """``timeout_s``: the workers' BLUEFOG_GLOO_TIMEOUT; ``discovery_interval``: seconds
        between two looks at Ray's node list."""
        return {"timeout_s": timeout_s, "discovery_interval": discovery_interval}

    def __init__(self, settings: Optional[Dict[str, float]] = None, min_workers: int = 1,
                 max_workers: Optional[int] = None, cpus_per_worker: float = 1,
                 override_discovery: bool = True, env: Optional[Dict[str, str]] = None):
        if min_workers < 1 or (max_workers is not None and max_workers < min_workers):
            raise ValueError(f"ElasticRayExecutor: need 1 <= min_workers <= max_workers, got "
                             f"{min_workers} and {max_workers}")
        del override_discovery  # Horovod's; Ray's node list is always the discovery here
        self.settings = settings or self.create_settings()
        self.min_workers = min_workers
        self.max_workers = max_workers
        self.cpus_per_worker = cpus_per_worker
        self.env = dict(env or {})
        self.env.setdefault("BLUEFOG_GLOO_TIMEOUT", str(self.settings["timeout_s"]))
        self.started = False

    def start(self) -> None:
        """Checks that Ray is initialized (``ray.init()``)."""
        if not ray.is_initialized():
            raise RuntimeError("ElasticRayExecutor: call ray.init() first")
        self.started = True

    def run(self, fn: Callable, args: Sequence = (), kwargs: Optional[Dict] = None) -> List[Any]:
        """Runs ``fn(*args, **kwargs)`` on every worker, as an elastic job; returns the results of
        the workers of its last round, in rank order."""
        if not self.started:
            raise RuntimeError("ElasticRayExecutor: call start() first")
        args_ns = argparse.Namespace(
            hosts=None, host_discovery_script="(ray)", max_np=self.max_workers, np=None,
            min_np=self.min_workers, discovery_interval=self.settings["discovery_interval"],
            discovery_timeout=30.0, rsh_agent=None, gloo_port=None, command=[])
        driver = _RayDriver(args_ns, self.cpus_per_worker, fn, list(args), dict(kwargs or {}),
                            self.env)
        code = driver.run()
        if code != 0:
            errors = {w.wid: w.proc.error for w in driver.workers.values()
                      if getattr(w.proc, "error", None) is not None}
            raise RuntimeError(f"ElasticRayExecutor: the job failed (lost: "
                               f"{'; '.join(driver.lost) or 'none'}); errors: {errors}")
        return [driver.workers[w].proc.result for w in driver.members]

    def shutdown(self) -> None:
        self.started = False
