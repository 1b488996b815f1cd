"""Elastic training on a real local Ray cluster (a head node with 2 logical CPUs and a worker
node with 1, on this machine): 3 workers train the digits with a KerasState committed every
few steps; at step KILL_AT the worker of rank 2 ends its own process with SIGKILL (with
ray.kill on its own actor in the horovod_028 case). Prints one
JSON line ("CASE {...}") per case, read by tests/python/test_ray_elastic.py.

    python tests/ray/ray_elastic_case.py [elastic_executor|horovod_028|raises]
"""

import json
import sys
import time

import ray
from ray.cluster_utils import Cluster

from bluefog.ray import ElasticRayExecutor, RayExecutor

STEPS = 150
KILL_AT = 30
COMMIT_EVERY = 5
QUIET = {"TF_CPP_MIN_LOG_LEVEL": "3", "TF_NUM_INTEROP_THREADS": "1",
         "TF_NUM_INTRAOP_THREADS": "1"}


def train():
    import hashlib
    import os
    import signal
    import time

    import keras
    import numpy as np
    import tensorflow as tf
    from sklearn.datasets import load_digits

    import bluefog.tensorflow as bf

    bf.init()
    started_pid = os.getpid()
    x, y = load_digits(return_X_y=True)
    x = (x / 16.0).astype("float32")
    keras.utils.set_random_seed(bf.rank())  # different starting weights: sync() aligns them
    model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(32, activation="relu"),
                              keras.layers.Dense(10)])
    opt = keras.optimizers.SGD(0.1)
    opt.build(model.trainable_variables)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    @tf.function
    def step(xb, yb):
        with tf.GradientTape() as tape:
            loss = loss_fn(yb, model(xb, training=True))
        tape = bf.DistributedGradientTape(tape)
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    state = bf.elastic.KerasState(model, opt, batch=0)
    sizes = [bf.size()]
    state.register_reset_callbacks([lambda: sizes.append(bf.size())])

    @bf.elastic.run
    def loop(state):
        while state.batch < STEPS:
            if bf.size() == 3 and bf.rank() == 2 and state.batch == KILL_AT:
                if os.environ.get("KILL_WITH") == "ray.kill":
                    import ray

                    ray.kill(ray.get_runtime_context().current_actor)
                    time.sleep(120)  # the kill arrives while this waits
                os.kill(os.getpid(), signal.SIGKILL)
            i = (state.batch * bf.size() + bf.rank()) * 32 % (len(x) - 32)
            step(x[i:i + 32], y[i:i + 32])
            state.batch += 1
            if state.batch % COMMIT_EVERY == 0:
                state.commit()

    loop(state)
    weights = np.concatenate([v.numpy().ravel() for v in model.weights])
    accuracy = float(np.mean(np.argmax(model(x).numpy(), axis=1) == y))
    return {"rank": bf.rank(), "size": bf.size(), "pid": os.getpid(),
            "started_pid": started_pid, "sizes": sizes, "accuracy": accuracy,
            "weights": hashlib.sha256(weights.tobytes()).hexdigest()}


def bad_data():
    raise ValueError("bad data")


def main():
    case = sys.argv[1] if len(sys.argv) > 1 else "elastic_executor"
    cluster = Cluster(initialize_head=True,
                      head_node_args={"num_cpus": 2, "include_dashboard": False})
    cluster.add_node(num_cpus=1)
    ray.init(address=cluster.address, log_to_driver=True)
    started = time.time()
    try:
        if case == "raises":
            settings = ElasticRayExecutor.create_settings(min_num_proc=2, max_num_proc=3)
            executor = ElasticRayExecutor(settings, env_vars=QUIET)
            executor.start()
            try:
                executor.run(bad_data)
                results, lost = "no error", []
            except RuntimeError as e:
                results, lost = [str(e), isinstance(e.__cause__, ValueError)], executor.lost
        elif case == "horovod_028":
            executor = RayExecutor(RayExecutor.create_settings(timeout_s=60), min_workers=2,
                                   max_workers=3, cpus_per_worker=1)
            executor.start(extra_env_vars={**QUIET, "KILL_WITH": "ray.kill"})
            results = executor.run(train)
            lost = executor._elastic.lost
        else:
            settings = ElasticRayExecutor.create_settings(min_num_proc=2, max_num_proc=3,
                                                          timeout_s=60)
            executor = ElasticRayExecutor(settings, cpus_per_slot=1, env_vars=QUIET)
            executor.start()
            results = executor.run(train)
            lost = executor.lost
        print("CASE " + json.dumps({"case": case, "results": results, "lost": lost,
                                    "seconds": round(time.time() - started, 1)}), flush=True)
    except Exception as e:  # noqa: BLE001 - reported, the test fails on it
        print("CASE " + json.dumps({"case": case, "error": f"{type(e).__name__}: {e}"}),
              flush=True)
    finally:
        ray.shutdown()
        cluster.shutdown()


if __name__ == "__main__":
    main()
