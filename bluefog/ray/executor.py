"""RayExecutor: one bluefog job on Ray actors (the Gloo backend, no MPI, no SSH).

How a job forms: ``start()`` reserves one placement-group bundle per worker (or per host),
starts an actor in each, asks every actor where it runs, numbers the actors host by host
(ranks on one node are consecutive, as ``mpirun --map-by slot`` places them), and gives each
the rendezvous of a Gloo job started without a launcher: ``MASTER_ADDR`` (rank 0's node
address), ``MASTER_PORT`` (a port free there), ``RANK``, ``WORLD_SIZE``, a random
``BLUEFOG_JOB_TOKEN`` and ``BLUEFOG_BACKEND=gloo``. The functions run afterwards call
``bf.init()`` themselves, as a training script does.

A function that raises on one worker shuts bluefog down in that worker, so the others, blocked
in a collective with it, fail at once with an error naming it instead of waiting out the
timeout; ``run()`` then raises WorkerFailedError naming every failed rank. bluefog cannot be
initialized twice in one process, so after a failure ``start()`` the executor again (fresh
actors) before running more.
"""

from __future__ import annotations

import dataclasses
import os
import secrets
import socket
import sys
import time
from typing import Any, Callable, Dict, List, Optional

try:
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy
except ImportError as e:  # pragma: no cover - exercised only without Ray
    raise ImportError("bluefog.ray needs Ray: pip install ray"
                      ) from e

from bluefog.ray.common import _LAUNCHER_PREFIXES, _RENDEZVOUS, _plain, _summary

_WAIT_NOTE_S = 5.0  # how often start() says that it still waits for room


def fits(bundles: List[Dict[str, float]], strategy: str,
         nodes: List[Dict[str, float]]) -> bool:
    """Whether the nodes (each one's total resources) could hold the placement group if
    nothing else ran: with PACK the bundles anywhere, with STRICT_SPREAD each on its own node.
    The bundles are alike (one per worker, or one per host)."""
    need = {k: v for k, v in bundles[0].items() if v > 0}

    def per_node(node: Dict[str, float]) -> int:
        return int(min(node.get(k, 0.0) // v for k, v in need.items())) if need else len(bundles)

    counts = [per_node(n) for n in nodes]
    if strategy == "STRICT_SPREAD":
        return sum(1 for c in counts if c >= 1) >= len(bundles)
    return sum(counts) >= len(bundles)


def _node_summary(nodes: List[Dict[str, float]], need: Dict[str, float]) -> str:
    """Each node's amount of the resources a worker needs, e.g. ``2 nodes: {'CPU': 2.0},
    {'CPU': 2.0}``."""
    each = ", ".join(str({k: n.get(k, 0.0) for k in need}) for n in nodes)
    return f"{len(nodes)} node{'s' if len(nodes) != 1 else ''}: {each}" if nodes else "no nodes"


@dataclasses.dataclass
class RaySettings:
    """What RayExecutor needs to know besides the workers' number and size.

    timeout_s: how long the rendezvous waits for every worker and a collective for its peers
        (the workers' ``BLUEFOG_GLOO_TIMEOUT``).
    placement_group_timeout_s: how long ``start()`` waits for Ray to find room for the workers
        (it says so every few seconds while it waits).
    autoscaling: the cluster adds nodes on demand (an autoscaler, KubeRay's included). When
        False, a request that the cluster's nodes could not hold even with nothing else running
        fails at once instead of waiting ``placement_group_timeout_s``.
    failure_grace_s: once a worker failed, how long the others get to end before ``run()``
        reports them as not finished.
    """

    timeout_s: int = 300
    placement_group_timeout_s: int = 100
    failure_grace_s: float = 30.0
    autoscaling: bool = False


class WorkerFailedError(RuntimeError):
    """A function failed on one or more workers (it raised, or the worker's process died).

    ``errors`` maps each failed rank to its exception, ``first`` is the rank that failed first
    (usually the cause: the others' errors often say that it left), ``unfinished``
    lists the ranks still running when ``run()`` gave up waiting for them.
    """

    def __init__(self, what: str, errors: Dict[int, BaseException], first: int,
                 unfinished: List[int], size: int):
        self.errors = errors
        self.first = first
        self.unfinished = unfinished
        lines = [f"bluefog.ray: {what} failed on rank(s) {sorted(errors)} of {size}, "
                 f"first on rank {first}"]
        for rank in [first] + [r for r in sorted(errors) if r != first]:
            lines.append(f"  rank {rank}: {_summary(errors[rank])}")
        if unfinished:
            lines.append(f"rank(s) {unfinished} had not finished when run() stopped waiting "
                         f"(RaySettings.failure_grace_s)")
        lines.append("bluefog cannot start twice in one process: call start() again for fresh "
                     "workers before running more")
        lines.append(f"rank {first}'s error in full:\n{_plain(str(errors[first]))}")
        super().__init__("\n".join(lines))


def _failed_at(error: BaseException) -> float:
    cause = getattr(error, "cause", None)
    return getattr(cause, "bluefog_failed_at", float("inf"))


def _end_bluefog() -> None:
    """Shuts bluefog down in this worker if the failed function had started it: the other
    ranks' pending collectives then fail naming this rank, at once."""
    bf = sys.modules.get("bluefog.common.basics")
    if bf is None:
        return
    try:
        if bf.is_initialized():
            bf.shutdown()
    except Exception:  # noqa: BLE001 - the function's own error is what gets reported
        pass


class _Worker:
    """One rank: a Ray actor holding the rank's environment and optional executable object."""

    def __init__(self):
        self.executable = None

    def where(self):
        return (ray.util.get_node_ip_address(), ray.get_runtime_context().get_node_id(),
                socket.gethostname(), os.getpid())

    def free_port(self, host: str) -> int:
        with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
            s.bind((host, 0))
            return s.getsockname()[1]

    def setup(self, env: Dict[str, str]) -> None:
        for key in list(os.environ):
            if key.startswith(_LAUNCHER_PREFIXES) or key in _RENDEZVOUS:
                del os.environ[key]
        os.environ.update(env)

    def start_executable(self, cls, args, kwargs) -> None:
        self.executable = cls(*args, **kwargs) if cls is not None else None

    def call(self, fn, args, kwargs, with_executable: bool):
        try:
            return fn(self.executable) if with_executable else fn(*args, **kwargs)
        except BaseException as e:
            # When it failed (wall clock): the earliest failure is usually the cause.
            e.bluefog_failed_at = time.time()
            _end_bluefog()
            raise


class RayExecutor:
    """Runs functions on ``num_workers`` Ray actors that form one bluefog job (Gloo backend).

    As Horovod's ``horovod.ray.RayExecutor``::

        import ray
        from bluefog.ray import RayExecutor

        def train(epochs):
            import bluefog.tensorflow as bf
            bf.init()
            ...                      # any bluefog training code
            return bf.rank(), accuracy

        ray.init()                   # or ray.init(address="auto") on a cluster
        executor = RayExecutor(RayExecutor.create_settings(timeout_s=60), num_workers=4,
                               cpus_per_worker=2)
        executor.start()
        results = executor.run(train, args=[5])   # one result per rank, in rank order
        executor.shutdown()

    Give either ``num_workers`` (packed onto as few nodes as fit) or ``num_hosts`` and
    ``num_workers_per_host`` (one group of workers on each of that many distinct nodes).
    ``use_gpu``/``gpus_per_worker`` reserve GPUs for the actors; bluefog's collectives run on
    the CPU.
    """

    @classmethod
    def create_settings(cls, timeout_s: int = 300, ssh_identity_file: Optional[str] = None,
                        ssh_str: Optional[str] = None, placement_group_timeout_s: int = 100,
                        failure_grace_s: float = 30.0,
                        autoscaling: bool = False) -> RaySettings:
        """Settings for the executor (their meaning: RaySettings). ``ssh_identity_file`` and
        ``ssh_str`` are accepted for Horovod's signature and unused: the workers connect over
        Gloo, without SSH."""
        del ssh_identity_file, ssh_str
        return RaySettings(timeout_s=timeout_s,
                           placement_group_timeout_s=placement_group_timeout_s,
                           failure_grace_s=failure_grace_s, autoscaling=autoscaling)

    def __init__(self, settings: Optional[RaySettings] = None,
                 num_workers: Optional[int] = None, num_hosts: Optional[int] = None,
                 num_workers_per_host: Optional[int] = None, cpus_per_worker: float = 1,
                 use_gpu: bool = False, gpus_per_worker: Optional[float] = None,
                 use_current_placement_group: bool = True, min_workers: Optional[int] = None,
                 max_workers: Optional[int] = None, reset_limit: Optional[int] = None,
                 cooldown_range: Optional[List[int]] = None, elastic_timeout: int = 600,
                 override_discovery: bool = True):
        del use_current_placement_group
        self._elastic = None
        if min_workers is not None or max_workers is not None:
            self._elastic = self._elastic_executor(
                settings, num_workers, num_hosts, num_workers_per_host, cpus_per_worker,
                use_gpu, gpus_per_worker, min_workers, max_workers, reset_limit,
                cooldown_range, elastic_timeout, override_discovery)
            self.settings = settings or RaySettings()
            self.workers = []
            self._placement = None
            self._broken = None
            return
        if num_workers is not None and (num_hosts is not None or num_workers_per_host):
            raise ValueError("RayExecutor: give num_workers, or num_hosts and "
                             "num_workers_per_host, not both")
        if num_workers is None:
            if not num_hosts or not num_workers_per_host:
                raise ValueError("RayExecutor: give num_workers, or num_hosts and "
                                 "num_workers_per_host (each at least 1)")
            if num_hosts < 1 or num_workers_per_host < 1:
                raise ValueError(f"RayExecutor: num_hosts={num_hosts} and num_workers_per_host="
                                 f"{num_workers_per_host} must each be at least 1")
        elif not isinstance(num_workers, int) or num_workers < 1:
            raise ValueError(f"RayExecutor: num_workers={num_workers!r} must be an int >= 1")
        if cpus_per_worker <= 0:
            raise ValueError(f"RayExecutor: cpus_per_worker={cpus_per_worker} must be above 0")
        if gpus_per_worker and not use_gpu:
            raise ValueError("RayExecutor: gpus_per_worker is set but use_gpu is False")
        self.settings = settings or RaySettings()
        self.num_hosts = num_hosts
        self.num_workers_per_host = num_workers_per_host
        self.num_workers = num_workers if num_workers is not None else (
            num_hosts * num_workers_per_host)
        self.cpus_per_worker = cpus_per_worker
        self.gpus_per_worker = (gpus_per_worker or 1) if use_gpu else 0
        self.workers: List[Any] = []  # actor handles, in rank order
        self._placement = None
        self._broken: Optional[str] = None

    @staticmethod
    def _elastic_executor(settings, num_workers, num_hosts, num_workers_per_host,
                          cpus_per_worker, use_gpu, gpus_per_worker, min_workers, max_workers,
                          reset_limit, cooldown_range, elastic_timeout, override_discovery):
        """Horovod 0.28's elastic mode: ``min_workers`` given, the job runs on an
        ElasticRayExecutor (bluefog/ray/elastic.py)."""
        from bluefog.ray.elastic import ElasticRayExecutor

        if not min_workers or min_workers < 1:
            raise ValueError("RayExecutor: max_workers given without a positive min_workers; "
                             "an elastic job needs min_workers >= 1")
        if num_workers is not None or num_hosts is not None:
            raise ValueError("RayExecutor: give num_workers (or num_hosts) for a fixed job or "
                             "min_workers/max_workers for an elastic one, not both")
        if cooldown_range is not None:
            raise ValueError("RayExecutor: cooldown_range is not supported: a lost worker's "
                             "slot is not used again")
        timeout_s = settings.timeout_s if settings is not None else 30
        elastic = ElasticRayExecutor.create_settings(
            min_num_proc=min_workers, max_num_proc=max_workers, reset_limit=reset_limit,
            elastic_timeout=elastic_timeout, timeout_s=timeout_s)
        return ElasticRayExecutor(elastic, use_gpu=use_gpu, cpus_per_slot=cpus_per_worker,
                                  gpus_per_slot=gpus_per_worker,
                                  override_discovery=override_discovery)

    # -- starting --------------------------------------------------------------------------

    def _reserve(self):
        """A placement group with room for every worker; raises when Ray finds none in time."""
        per_worker = {"CPU": self.cpus_per_worker}
        if self.gpus_per_worker:
            per_worker["GPU"] = self.gpus_per_worker
        if self.num_hosts:
            bundles = [{k: v * self.num_workers_per_host for k, v in per_worker.items()}
                       for _ in range(self.num_hosts)]
            strategy = "STRICT_SPREAD"
        else:
            bundles = [dict(per_worker) for _ in range(self.num_workers)]
            strategy = "PACK"
        what = f"{self.num_workers} workers ({per_worker} each, {strategy})"
        nodes = [n["Resources"] for n in ray.nodes() if n.get("Alive")]
        if not self.settings.autoscaling and not fits(bundles, strategy, nodes):
            raise RuntimeError(
                f"bluefog.ray: Ray has no room for {what}, and never will: its nodes have "
                f"{_node_summary(nodes, per_worker)}. Ask for fewer or smaller workers, or add "
                f"nodes; if the cluster adds nodes itself (an autoscaler), pass "
                f"create_settings(autoscaling=True) and start() waits for them")
        group = placement_group(bundles, strategy=strategy)
        limit = self.settings.placement_group_timeout_s
        started = time.monotonic()
        ready: List[Any] = []
        while not ready:
            waited = time.monotonic() - started
            if waited >= limit:
                break
            ready, _ = ray.wait([group.ready()], timeout=min(_WAIT_NOTE_S, limit - waited))
            if not ready and time.monotonic() - started < limit:
                print(f"bluefog.ray: waiting for Ray to find room for {what} "
                      f"({time.monotonic() - started:.0f} s of {limit}); free now: "
                      f"{ray.available_resources()}", file=sys.stderr, flush=True)
        if not ready:
            remove_placement_group(group)
            raise RuntimeError(
                f"bluefog.ray: Ray found no room for {what} within {limit} s; the cluster has "
                f"{ray.cluster_resources()}, of which {ray.available_resources()} is free. "
                f"Ask for fewer or smaller workers, end what holds the rest, or raise "
                f"placement_group_timeout_s")
        return group

    def start(self, executable_cls: Optional[type] = None,
              executable_args: Optional[List] = None,
              executable_kwargs: Optional[Dict] = None,
              extra_env_vars: Optional[Dict[str, str]] = None) -> None:
        """Starts the workers and gives them the job's rendezvous. ``executable_cls``, when
        given, is instantiated in every worker (with the args and kwargs) for ``execute()``;
        ``extra_env_vars`` are set in every worker before that. Calling it again replaces the
        workers with fresh ones."""
        if self._elastic is not None:
            if executable_cls is not None:
                raise ValueError("RayExecutor (elastic): executable_cls is not supported; "
                                 "run a function instead")
            self._elastic.env_vars.update({k: str(v) for k, v in
                                           (extra_env_vars or {}).items()})
            self._elastic.start()
            return
        if self.workers:
            self.shutdown()
        if not ray.is_initialized():
            ray.init()
        self._placement = self._reserve()
        actor_cls = ray.remote(_Worker)
        actors = []
        for i in range(self.num_workers):
            bundle = i // self.num_workers_per_host if self.num_hosts else i
            actors.append(actor_cls.options(
                num_cpus=self.cpus_per_worker, num_gpus=self.gpus_per_worker,
                scheduling_strategy=PlacementGroupSchedulingStrategy(
                    self._placement, placement_group_bundle_index=bundle)).remote())
        where = ray.get([a.where.remote() for a in actors], timeout=self.settings.timeout_s)
        # Ranks host by host: sorted by node address, then node, then creation order.
        order = sorted(range(len(actors)), key=lambda i: (where[i][0], where[i][1], i))
        self.workers = [actors[i] for i in order]
        master = where[order[0]][0]
        port = ray.get(self.workers[0].free_port.remote(master))
        common = {"MASTER_ADDR": master, "MASTER_PORT": str(port),
                  "WORLD_SIZE": str(self.num_workers), "BLUEFOG_BACKEND": "gloo",
                  "BLUEFOG_JOB_TOKEN": secrets.token_hex(16),
                  "BLUEFOG_GLOO_TIMEOUT": str(self.settings.timeout_s)}
        common.update({k: str(v) for k, v in (extra_env_vars or {}).items()})
        ray.get([w.setup.remote({**common, "RANK": str(rank)})
                 for rank, w in enumerate(self.workers)])
        ray.get([w.start_executable.remote(executable_cls, executable_args or [],
                                           executable_kwargs or {}) for w in self.workers])
        self._broken = None

    # -- running ---------------------------------------------------------------------------

    def _check_started(self, what: str) -> None:
        if self._elastic is not None:
            raise RuntimeError(f"bluefog.ray: {what} is not available in elastic mode "
                               f"(min_workers given): use run()")
        if not self.workers:
            raise RuntimeError(f"bluefog.ray: {what} before start(): call executor.start()")
        if self._broken:
            raise RuntimeError(f"bluefog.ray: {what} after a failed run ({self._broken}); "
                               f"call start() again for fresh workers")

    def run_remote(self, fn: Callable[..., Any], args: Optional[List] = None,
                   kwargs: Optional[Dict] = None) -> List[Any]:
        """Starts ``fn(*args, **kwargs)`` on every worker; returns their Ray object refs in
        rank order (``ray.get`` them)."""
        self._check_started("run_remote()")
        return [w.call.remote(fn, list(args or []), dict(kwargs or {}), False)
                for w in self.workers]

    def run(self, fn: Callable[..., Any], args: Optional[List] = None,
            kwargs: Optional[Dict] = None) -> List[Any]:
        """Runs ``fn(*args, **kwargs)`` on every worker and returns each rank's result, in
        rank order. Raises WorkerFailedError naming the ranks where it failed.

        Elastic (``min_workers`` given): the results of the workers that finished the job,
        in rank order (ElasticRayExecutor.run)."""
        if self._elastic is not None:
            args, kwargs = list(args or []), dict(kwargs or {})
            return self._elastic.run(lambda: fn(*args, **kwargs))
        return self._collect(getattr(fn, "__name__", "the function"),
                             self.run_remote(fn, args, kwargs))

    def execute(self, fn: Callable[[Any], Any]) -> List[Any]:
        """Runs ``fn(executable)`` on every worker, ``executable`` being the worker's instance
        of ``start()``'s ``executable_cls`` (None without one); returns the results in rank
        order."""
        self._check_started("execute()")
        return self._collect(getattr(fn, "__name__", "the function"),
                             [w.call.remote(fn, [], {}, True) for w in self.workers])

    def execute_single(self, fn: Callable[[Any], Any]) -> Any:
        """Runs ``fn(executable)`` on rank 0 only and returns its result."""
        self._check_started("execute_single()")
        return self._collect(getattr(fn, "__name__", "the function"),
                             [self.workers[0].call.remote(fn, [], {}, True)])[0]

    def _collect(self, what: str, refs: List[Any]) -> List[Any]:
        pending = {ref: rank for rank, ref in enumerate(refs)}
        results: List[Any] = [None] * len(refs)
        errors: Dict[int, BaseException] = {}
        deadline = None
        while pending:
            timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
            ready, _ = ray.wait(list(pending), num_returns=1, timeout=timeout)
            if not ready:
                break
            rank = pending.pop(ready[0])
            try:
                results[rank] = ray.get(ready[0])
            except Exception as e:  # noqa: BLE001 - a task error or a dead actor alike
                errors[rank] = e
                if deadline is None:
                    deadline = time.monotonic() + self.settings.failure_grace_s
        if errors:
            first = min(errors, key=lambda r: (_failed_at(errors[r]), r))
            self._broken = f"{what} failed on rank(s) {sorted(errors)}"
            raise WorkerFailedError(what, errors, first, sorted(pending.values()), len(refs))
        return results

    # -- ending ----------------------------------------------------------------------------

    def shutdown(self) -> None:
        """Ends the workers' processes and frees their placement group."""
        for w in self.workers:
            try:
                ray.kill(w)
            except Exception:  # noqa: BLE001 - an actor already gone is fine
                pass
        self.workers = []
        if self._placement is not None:
            try:
                remove_placement_group(self._placement)
            except Exception:  # noqa: BLE001
                pass
            self._placement = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.shutdown()
        return False
