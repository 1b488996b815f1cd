"""Step time of neighbor_allreduce vs allreduce for one large float32 tensor.

    python bench/neighbor_vs_allreduce.py                  # 2, 4 and 8 ranks, 16 MiB
    python bench/neighbor_vs_allreduce.py --ranks 2 4 --mib 4

Launches ``mpirun`` once per rank count (oversubscribed: ranks may outnumber cores) and runs
itself as the worker on every rank. A "step" is one call from Python of the collective on the
tensor, inside a ``tf.function`` (as in a training step); its time is the slowest rank's, the
median over repetitions. Compared:

* ``allreduce``: the mean over all ranks (``bf.allreduce``);
* ``neighbor (exp)``: ``bf.neighbor_allreduce`` over the default exponential graph (each rank
  receives from log2(N) ranks);
* ``neighbor (ring)``: ``bf.neighbor_allreduce`` over the bidirectional ring (2 in-neighbours).

Extra ``mpirun`` arguments (transports...) go after ``--mpirun-args``. ``--hosts A,B`` spreads
each run's ranks evenly over those hosts (``--host A:n/2,B:n/2``). For pretend hosts with a
rate-limited link on one machine (network namespaces; needs root), see ``bench/netns/``::

    bench/netns/hosts.sh up 2 1gbit
    python bench/neighbor_vs_allreduce.py --hosts 10.213.77.1,10.213.77.2 --mpirun-args \
        --mca plm_rsh_agent $PWD/bench/netns/rsh.sh --mca btl self,tcp \
        --mca btl_tcp_if_include 10.213.77.0/24 --mca oob_tcp_if_include 10.213.77.0/24
    bench/netns/hosts.sh down 2
"""

import argparse
import json
import os
import shlex
import subprocess
import sys
import time

HERE = os.path.abspath(__file__)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ranks", type=int, nargs="+", default=[2, 4, 8])
    p.add_argument("--mib", type=float, default=16.0, help="tensor size in MiB (float32)")
    p.add_argument("--reps", type=int, default=5, help="timed repetitions (median reported)")
    p.add_argument("--iters", type=int, default=5, help="calls per repetition")
    p.add_argument("--python", default=sys.executable)
    p.add_argument("--mpirun", default="mpirun")
    p.add_argument("--timeout", type=float, default=600, help="seconds per rank count")
    p.add_argument("--hosts", default="", help="comma-separated hosts; ranks spread evenly")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--mpirun-args", nargs=argparse.REMAINDER, default=[])
    return p.parse_args(argv)


# ------------------------------------------------------------------------------------------
# Worker: runs on every rank under mpirun
# ------------------------------------------------------------------------------------------

def worker(args) -> None:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import numpy as np
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(2)
    import bluefog.tensorflow as bf
    from bluefog.common import topology_util

    bf.init()
    n, me = bf.size(), bf.rank()
    elements = int(args.mib * (1 << 20)) // 4
    x = tf.fill([elements], float(me + 1))

    def slowest(seconds: float) -> float:
        rows = bf.allgather(tf.constant([seconds], tf.float64), name="bench.gather")
        return float(rows.numpy().max())

    def timed(fn) -> float:
        fn(x)  # trace and warm up
        fn(x)
        samples = []
        for _ in range(args.reps):
            bf.allreduce(tf.constant(0.0), name="bench.barrier")
            t0 = time.perf_counter()
            for _ in range(args.iters):
                out = fn(x)
            out.numpy()  # the last call has finished (calls run one after another)
            samples.append(slowest((time.perf_counter() - t0) / args.iters))
        return float(np.median(samples))

    results = {"ranks": n, "bytes": elements * 4, "hosts": n // bf.local_size()}

    allreduce = tf.function(lambda t: bf.allreduce(t, average=True, name="bench.allreduce"))
    got = allreduce(x).numpy()
    assert np.allclose(got[:4], (n + 1) / 2.0), "wrong allreduce result"
    results["allreduce"] = timed(allreduce)

    for label, graph in (("neighbor (exp)", topology_util.ExponentialGraph(n)),
                         ("neighbor (ring)", topology_util.RingGraph(n))):
        bf.set_topology(graph)
        sources = bf.in_neighbor_ranks()
        fn = tf.function(lambda t, label=label: bf.neighbor_allreduce(
            t, name="bench." + label.replace(" ", "_")))
        expected = (me + 1 + sum(s + 1 for s in sources)) / (len(sources) + 1)
        assert np.allclose(fn(x).numpy()[:4], expected), f"wrong {label} result"
        results[label] = timed(fn)
        results[label + " in-degree"] = len(sources)
    bf.set_topology()
    if me == 0:
        print("RESULT " + json.dumps(results), flush=True)


# ------------------------------------------------------------------------------------------
# Driver
# ------------------------------------------------------------------------------------------

def run_one(args, ranks: int) -> dict:
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               TF_CPP_MIN_LOG_LEVEL="2")
    hosts = [h for h in args.hosts.split(",") if h]
    placement = []
    if hosts:
        if ranks % len(hosts):
            raise ValueError(f"{ranks} ranks do not spread evenly over {len(hosts)} hosts")
        placement = ["--host", ",".join(f"{h}:{ranks // len(hosts)}" for h in hosts)]
    cmd = [args.mpirun, "--allow-run-as-root", "--oversubscribe", "--bind-to", "none",
           "-np", str(ranks), *placement, *args.mpirun_args, args.python, HERE, "--worker",
           "--mib", str(args.mib), "--reps", str(args.reps), "--iters", str(args.iters)]
    print("$ " + " ".join(shlex.quote(c) for c in cmd), file=sys.stderr, flush=True)
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.timeout)
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-30:])
    raise RuntimeError(f"{ranks} ranks: no result (exit {proc.returncode}):\n{tail}")


def print_table(rows) -> None:
    cols = ["allreduce", "neighbor (exp)", "neighbor (ring)"]
    head = f"{'ranks':>5}  {'hosts':>5}  {'MiB':>5}  " + "  ".join(f"{c + ' ms':>18}" for c in cols)
    head += f"  {'exp/allreduce':>13}  {'ring/allreduce':>14}"
    print(head)
    print("-" * len(head))
    for r in rows:
        cells = "  ".join(f"{r[c] * 1e3:18.1f}" for c in cols)
        print(f"{r['ranks']:>5}  {r['hosts']:>5}  {r['bytes'] / (1 << 20):>5.0f}  {cells}  "
              f"{r['neighbor (exp)'] / r['allreduce']:>13.2f}  "
              f"{r['neighbor (ring)'] / r['allreduce']:>14.2f}")
    print("in-degree (exp graph): " + ", ".join(
        f"{r['ranks']} ranks: {r['neighbor (exp) in-degree']}" for r in rows))


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.worker:
        worker(args)
        return 0
    rows = []
    for n in args.ranks:
        start = time.time()
        rows.append(run_one(args, n))
        print(f"{n} ranks done in {time.time() - start:.0f} s", file=sys.stderr, flush=True)
    print_table(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
