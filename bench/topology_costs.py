"""Decentralized averaging vs allreduce across hosts, next to the cost model's predictions.

Calibrates the cost model (bluefog.tensorflow.calibrate) on the running job, then times one
step of every method on a float32 tensor of --mib MiB, each inside a tf.function, the methods
interleaved within each round; reports the slowest rank's median per method, the model's
prediction and their ratio, and the speed of the model's recommended decentralized method
against allreduce (the floor of issue 17: >= 1.4x at 2 hosts x 4 ranks, 16 MiB).

    BF_NETNS_PREFIX=bftp BF_NETNS_NET=10.214.77 bench/netns/hosts.sh up 2 1gbit
    BF_NETNS_PREFIX=bftp mpirun --bind-to none -x BF_NETNS_PREFIX -np 8 \\
        -H 10.214.77.1:4,10.214.77.2:4 --mca plm_rsh_agent $PWD/bench/netns/rsh.sh \\
        --mca btl self,vader,tcp --mca btl_tcp_if_include 10.214.77.0/24 \\
        --mca oob_tcp_if_include 10.214.77.0/24 .venv/bin/python bench/topology_costs.py
    BF_NETNS_PREFIX=bftp bench/netns/hosts.sh down 2

(as root; -x PATH etc. as needed). Timings on a shared 2-core machine are noisy: compare
ratios within one run.
"""

import argparse
import os
import statistics
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np
import tensorflow as tf

tf.config.threading.set_intra_op_parallelism_threads(1)
tf.config.threading.set_inter_op_parallelism_threads(2)

import bluefog.tensorflow as bf  # noqa: E402
from bluefog.common import cost_model  # noqa: E402
from bluefog.common import topology_util as tu  # noqa: E402
from bluefog.tensorflow import calibrate, neighbor_ops  # noqa: E402

SPEC = [tf.TensorSpec([None], tf.int32), tf.TensorSpec([None], tf.int32),
        tf.TensorSpec([], tf.float64), tf.TensorSpec([None], tf.float64)]


def static_lists(graph, rank):
    self_w, recv = tu.GetRecvWeights(graph, rank)
    send = sorted(v for v in graph.successors(rank) if v != rank)
    return send, sorted(recv), self_w, [recv[r] for r in sorted(recv)]


def uniform(step):
    send, recv = step
    w = 1.0 / (len(recv) + 1)
    return sorted(send), sorted(recv), w, [w] * len(recv)


def methods(x, rank, size, local):
    """name -> step function (each call runs one step, advancing its schedule)."""
    out = {}

    @tf.function
    def allreduce(t):
        return bf.allreduce(t, average=True, name="tc.allreduce")

    out["allreduce (hierarchical)" if size > local > 1 else "allreduce (flat ring)"] = \
        lambda: allreduce(x)

    def rank_level(name, gen):
        fn = tf.function(lambda t, s, r, w, ws: neighbor_ops.neighbor_allreduce_op(
            t, f"tc.{name}", s, r, w, ws, []), input_signature=[x_spec] + SPEC)
        return lambda: fn(x, *[tf.constant(v) for v in _typed(next(gen))])

    def machine_level(name, gen):
        fn = tf.function(lambda t, s, r, w, ws: neighbor_ops.hierarchical_exchange(
            t, f"tc.{name}", local, bf.local_rank(), s, r, w, ws), input_signature=[x_spec] + SPEC)
        return lambda: fn(x, *[tf.constant(v) for v in _typed(next(gen))])

    x_spec = tf.TensorSpec(x.shape, x.dtype)

    def repeat(lists):
        while True:
            yield lists

    def static(graph):
        send, recv, w, ws = static_lists(graph, rank)
        while True:
            yield send, recv, w, ws

    def uniform_gen(gen):
        while True:
            yield uniform(next(gen))

    out["neighbor, ExponentialGraph"] = rank_level("exp", static(tu.ExponentialGraph(size)))
    out["neighbor, HierarchicalExponentialGraph"] = rank_level(
        "hexp", static(tu.HierarchicalExponentialGraph(size, local)))
    out["neighbor, RingGraph"] = rank_level("ring", static(tu.RingGraph(size)))
    out["neighbor, one-peer exponential"] = rank_level("onepeer", uniform_gen(
        tu.GetDynamicOnePeerSendRecvRanks(tu.ExponentialGraph(size), rank)))
    n = size // local
    machine_graph = tu.ExponentialGraph(n)
    send_m, recv_m, w_m, ws_m = static_lists(machine_graph, rank // local)
    out["hierarchical, ExponentialGraph of machines"] = machine_level(
        "hier", repeat((send_m, recv_m, w_m, ws_m)))
    out["hierarchical, one-peer exponential of machines"] = machine_level("hier1", uniform_gen(
        tu.GetExp2DynamicSendRecvMachineRanks(size, local, rank, bf.local_rank())))
    out["hierarchical, one-peer machines every 2nd step"] = machine_level("hierio", uniform_gen(
        tu.GetInnerOuterExp2DynamicSendRecvMachineRanks(size, local, rank, bf.local_rank())))
    return out


def _typed(lists):
    send, recv, w, ws = lists
    return (np.array(send, np.int32), np.array(recv, np.int32), np.float64(w),
            np.array(ws, np.float64))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--mib", type=float, default=16.0)
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--steps", type=int, default=2, help="steps per method per round")
    p.add_argument("--calibration-mib", type=float, default=16.0)
    args = p.parse_args()
    bf.init()
    rank, size, local = bf.rank(), bf.size(), bf.local_size()
    if not bf.is_homogeneous():
        raise SystemExit("needs the same number of ranks on every host, in blocks")
    costs = calibrate.calibrate(int(args.calibration_mib * 2**20), reps=5)
    nbytes = int(args.mib * 2**20)
    x = tf.constant(np.ones(nbytes // 4, np.float32))
    steps = methods(x, rank, size, local)
    for fn in steps.values():  # trace and warm up
        fn().numpy()
    times = {k: [] for k in steps}
    for _ in range(args.rounds):
        for name, fn in steps.items():
            bf.allreduce(tf.constant([0.0]), name="tc.barrier")
            t0 = time.perf_counter()
            for _ in range(args.steps):
                fn().numpy()
            times[name].append((time.perf_counter() - t0) / args.steps)
    measured = {}
    for i, (name, ts) in enumerate(times.items()):
        mine = tf.constant([statistics.median(ts)], tf.float64)
        measured[name] = float(bf.allreduce(mine, op=bf.Max, name=f"tc.max.{i}").numpy()[0])
    predicted = cost_model.predict(costs, size, local, nbytes)
    if rank != 0:
        return
    print(f"{size} ranks, {local} per host, {args.mib:g} MiB float32; {args.rounds} rounds x "
          f"{args.steps} steps, slowest rank's median")
    print(calibrate.describe(costs))
    print("| method | measured ms | predicted ms | measured / predicted |")
    print("|---|---|---|---|")
    for name, t in measured.items():
        print(f"| {name} | {t * 1e3:.1f} | {predicted[name] * 1e3:.1f} | "
              f"{t / predicted[name]:.2f} |")
    # The model's fastest decentralized method (recommend() with margin 0 never picks allreduce).
    best, how, _ = cost_model.recommend(costs, size, local, nbytes, margin=0.0)
    allreduce = next(k for k in measured if k.startswith("allreduce"))
    speedup = measured[allreduce] / measured[best]
    print(f"recommended decentralized: {best} ({how})")
    print(f"{'PASS' if speedup >= 1.4 else 'FAIL'}: {best} {speedup:.2f}x faster per step than "
          f"{allreduce} (floor 1.4x)")
    print("predicted table, 8 ranks per host:")
    print(cost_model.format_table(costs, [64, 128, 256, 512, 1024], 8, nbytes))


if __name__ == "__main__":
    main()
