"""RayExecutor against a real local Ray cluster: a head node and a worker node on this machine
(ray.cluster_utils.Cluster), each with 2 logical CPUs. Runs every case and prints one JSON line
per case ("CASE {...}"), read by tests/python/test_ray.py.

    python tests/ray/ray_cases.py
"""

import importlib.util
import json
import os
import signal
import sys
import time

import ray
from ray.cluster_utils import Cluster

from bluefog.ray import RayExecutor, WorkerFailedError

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
spec = importlib.util.spec_from_file_location("ray_digits",
                                              os.path.join(REPO, "examples", "ray_digits.py"))
ray_digits = importlib.util.module_from_spec(spec)
spec.loader.exec_module(ray_digits)

QUIET = {"TF_CPP_MIN_LOG_LEVEL": "3", "TF_NUM_INTEROP_THREADS": "1"}


def report(name, **fields):
    print("CASE " + json.dumps({"case": name, **fields}), flush=True)


def digits(workers):
    # 2 workers: one on each node (STRICT_SPREAD), since PACK may put both on one node or not,
    # depending on what Ray still holds from the case before. 3 workers of 1 CPU on two nodes
    # of 2 CPUs (PACK) cannot fit on one node: a node with 2 ranks and one with 1.
    settings = RayExecutor.create_settings(timeout_s=120)
    if workers == 2:
        executor = RayExecutor(settings, num_hosts=2, num_workers_per_host=1)
    else:
        executor = RayExecutor(settings, num_workers=workers)
    executor.start(extra_env_vars=QUIET)
    try:
        started = time.time()
        results = executor.run(ray_digits.train, kwargs={"epochs": 5})
        nodes = {w for w in ray.get([a.where.remote() for a in executor.workers])}
    finally:
        executor.shutdown()
    report(f"digits_{workers}", ranks=[r[0] for r in results], backends=[r[1] for r in results],
           accuracy=results[0][2], identical=len({r[3] for r in results}) == 1,
           nodes=len({n[1] for n in nodes}), seconds=round(time.time() - started, 1))


def rank_sum():
    import tensorflow as tf

    import bluefog.tensorflow as bf

    bf.init()
    total = bf.allreduce(tf.constant([float(bf.rank() + 1)]), op=bf.Sum, name="ray.sum")
    return bf.rank(), bf.size(), float(total.numpy()[0])


def fails_on_rank_1():
    import tensorflow as tf

    import bluefog.tensorflow as bf

    bf.init()
    bf.allreduce(tf.constant([1.0]), name="ray.before")
    if bf.rank() == 1:
        raise ValueError("rank 1 gives up")
    bf.allreduce(tf.constant([1.0]), name="ray.after")  # rank 1 never joins this one
    return bf.rank()


class Counter:
    def __init__(self, start):
        self.value = start

    def bump(self):
        self.value += 1
        return self.value


def failure():
    """Rank 1 raises; ranks 0 and 2 are blocked in a collective with it and must fail at once
    (rank 1 shuts bluefog down), not after the 120 s timeout."""
    executor = RayExecutor(RayExecutor.create_settings(timeout_s=120, failure_grace_s=60),
                           num_workers=3)
    executor.start(extra_env_vars=QUIET)
    started = time.time()
    try:
        executor.run(fails_on_rank_1)
        report("failure", raised=False)
    except WorkerFailedError as e:
        try:
            executor.run(rank_sum)
            again = "ran"
        except RuntimeError as second:
            again = str(second)
        report("failure", raised=True, failed=sorted(e.errors), unfinished=e.unfinished,
               message=str(e), seconds=round(time.time() - started, 1), again=again)
    finally:
        executor.shutdown()


def sums_and_executables():
    executor = RayExecutor(RayExecutor.create_settings(timeout_s=120), num_hosts=2,
                           num_workers_per_host=1)
    executor.start(executable_cls=Counter, executable_args=[10], extra_env_vars=QUIET)
    try:
        sums = executor.run(rank_sum)
        bumps = executor.execute(lambda counter: counter.bump())
        single = executor.execute_single(lambda counter: counter.bump())
        nodes = {n[1] for n in ray.get([a.where.remote() for a in executor.workers])}
    finally:
        executor.shutdown()
    report("sums", sums=sums, bumps=bumps, single=single, nodes=len(nodes))


def no_room():
    # 9 workers of 1 CPU on 2 nodes of 2 CPUs: never, so at once, not after the 60 s.
    executor = RayExecutor(RayExecutor.create_settings(timeout_s=30,
                                                       placement_group_timeout_s=60),
                           num_workers=9)
    started = time.time()
    try:
        executor.start()
        report("no_room", raised=False)
    except RuntimeError as e:
        report("no_room", raised=True, message=str(e), seconds=round(time.time() - started, 1))


def busy():
    # Room for 2 workers exists, but another placement group holds 3 of the 4 CPUs: start()
    # waits, says so, and gives up after its timeout.
    from ray.util.placement_group import placement_group, remove_placement_group

    other = placement_group([{"CPU": 2}, {"CPU": 1}], strategy="PACK")
    ray.get(other.ready(), timeout=60)
    executor = RayExecutor(RayExecutor.create_settings(timeout_s=30,
                                                       placement_group_timeout_s=12),
                           num_workers=2)
    started = time.time()
    try:
        executor.start()
        report("busy", raised=False)
    except RuntimeError as e:
        report("busy", raised=True, message=str(e), seconds=round(time.time() - started, 1))
    finally:
        remove_placement_group(other)


CLUSTER_START_S = 120  # ~8 s measured
CLUSTER_DID_NOT_START = 75  # the exit status that says so (tests/python/test_ray.py retries)


def cluster_did_not_start(*_):
    print(f"# the Ray cluster did not come up within {CLUSTER_START_S} s", flush=True)
    os._exit(CLUSTER_DID_NOT_START)  # Ray's own processes end with this driver (their reaper)


def main():
    started = time.time()
    signal.signal(signal.SIGALRM, cluster_did_not_start)
    signal.alarm(CLUSTER_START_S)
    cluster = Cluster(initialize_head=True,
                      head_node_args={"num_cpus": 2, "include_dashboard": False})
    cluster.add_node(num_cpus=2)
    ray.init(address=cluster.address, log_to_driver=False)
    signal.alarm(0)
    print(f"# cluster of 2 nodes up: {time.time() - started:.1f} s", flush=True)
    cases = [a for a in sys.argv[1:]] or ["sums", "digits_2", "digits_3", "failure", "no_room",
                                          "busy"]
    try:
        for case in cases:
            started = time.time()
            try:
                {"sums": sums_and_executables, "digits_2": lambda: digits(2),
                 "digits_3": lambda: digits(3), "failure": failure, "no_room": no_room,
                 "busy": busy}[case]()
            except Exception as e:  # noqa: BLE001 - reported, the test fails on it
                report(case, error=f"{type(e).__name__}: {e}")
            print(f"# {case}: {time.time() - started:.1f} s", flush=True)
    finally:
        ray.shutdown()
        cluster.shutdown()


if __name__ == "__main__":
    main()
