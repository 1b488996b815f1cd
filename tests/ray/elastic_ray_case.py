"""ElasticRayExecutor against a real local Ray cluster (a head node with 2 CPUs and a worker
node with 1, on this machine): 3 workers train a committed counter; worker 2 kills its own
process at step 8; the other two must finish in place. Prints one "CASE {...}" JSON line, read
by tests/python/test_ray_elastic.py.

    python tests/ray/elastic_ray_case.py
"""

import json
import os
import time

import ray
from ray.cluster_utils import Cluster

from bluefog.ray import ElasticRayExecutor

STEPS = 24


def train():
    import signal

    import tensorflow as tf

    import bluefog.tensorflow as bf

    bf.init()
    me = os.environ["BLUEFOG_ELASTIC_WORKER"]
    pid = os.getpid()
    counter = tf.Variable(0.0)
    state = bf.elastic.TensorFlowState([counter], step=0)

    @bf.elastic.run
    def loop(state):
        while state.step < STEPS:
            bf.allreduce(tf.constant(1.0), average=False)
            counter.assign_add(1.0)
            state.step += 1
            if me == "2" and state.step == 8:
                os.kill(os.getpid(), signal.SIGKILL)
            if state.step % 4 == 0:
                state.commit()
            time.sleep(0.05)

    loop(state)
    return {"worker": me, "rank": bf.rank(), "size": bf.size(), "step": state.step,
            "counter": float(counter.numpy()), "pid": pid, "start_pid": pid}


def main():
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 2})
    cluster.add_node(num_cpus=1)
    ray.init(address=cluster.address)
    started = time.time()
    try:
        executor = ElasticRayExecutor(ElasticRayExecutor.create_settings(timeout_s=120),
                                      min_workers=2, max_workers=3, cpus_per_worker=1,
                                      env={"TF_CPP_MIN_LOG_LEVEL": "3"})
        executor.start()
        results = executor.run(train)
        print("CASE " + json.dumps({"case": "elastic", "results": results,
                                    "seconds": round(time.time() - started, 1)}), flush=True)
    except Exception as e:  # noqa: BLE001 - reported to the test
        print("CASE " + json.dumps({"case": "elastic", "error": repr(e)[:3000]}), flush=True)
    finally:
        ray.shutdown()
        cluster.shutdown()


if __name__ == "__main__":
    main()
