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

``--netns RATE [RATE ...]`` (root) does that itself: for each RATE it makes 2 pretend hosts
(prefix bfnb, 10.213.81.0/24) whose link is shaped to RATE, spreads the ranks over them and
removes them after. Across hosts a fourth method is timed:

* ``hierarchical neighbor``: ``bf.hierarchical_neighbor_allreduce`` over the default machine
  graph; at 2 hosts each host's mean goes to the other, so it moves the same bytes across the
  link as the hierarchical allreduce and gives the same result;
* ``hierarchical neighbor, not phased``: the same with the MPI backend's phased exchange off
  (each process sends and receives its slice across at once: the ``phased_exchange`` switch of
  csrc/transport/options.h).

``--methods`` picks the methods; within a launch they take turns repetition by repetition, and
``--launches`` repeats each rank count (the table then gives each method's median over the
launches' medians, the range of its ratio to allreduce over the launches and its worst launch).
"""

import argparse
import json
import os
import shlex
import subprocess
import sys
import time

HERE = os.path.abspath(__file__)
NETNS = os.path.join(os.path.dirname(HERE), "netns")
NETNS_ENV = {"BF_NETNS_PREFIX": "bfnb", "BF_NETNS_NET": "10.213.81"}
METHODS = ("allreduce", "neighbor (exp)", "neighbor (ring)", "hierarchical neighbor",
           "hierarchical neighbor, not phased")


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
    p.add_argument("--netns", nargs="+", metavar="RATE", default=[],
                   help="2 pretend hosts for each link RATE (none, 1gbit, 250mbit...); root")
    p.add_argument("--methods", nargs="+", choices=METHODS, default=list(METHODS),
                   metavar="METHOD", help="among: " + ", ".join(METHODS))
    p.add_argument("--launches", type=int, default=1, help="launches per rank count")
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
    from bluefog.common import basics, topology_util

    bf.init()
    n, me = bf.size(), bf.rank()
    elements = int(args.mib * (1 << 20)) // 4
    x = tf.fill([elements], float(me + 1))

    def slowest(seconds: float) -> float:
        rows = bf.allgather(tf.constant([seconds], tf.float64), name="bench.gather")
        return float(rows.numpy().max())

    def one_rep(fn) -> float:
        bf.allreduce(tf.constant(0.0), name="bench.barrier")
        t0 = time.perf_counter()
        for _ in range(args.iters):
            out = fn(x)
        out.numpy()  # the last call has finished (calls run one after another)
        return slowest((time.perf_counter() - t0) / args.iters)

    results = {"ranks": n, "bytes": elements * 4, "hosts": n // bf.local_size()}
    steps = {}  # method -> its step function, checked once
    if "allreduce" in args.methods:
        allreduce = tf.function(lambda t: bf.allreduce(t, average=True, name="bench.allreduce"))
        got = allreduce(x).numpy()
        assert np.allclose(got[:4], (n + 1) / 2.0), "wrong allreduce result"
        steps["allreduce"] = (allreduce, None)
    for label, graph in (("neighbor (exp)", topology_util.ExponentialGraph(n)),
                         ("neighbor (ring)", topology_util.RingGraph(n))):
        if label not in args.methods:
            continue
        sources = [r for r in graph.predecessors(me) if r != me]
        send = sorted(r for r in graph.successors(me) if r != me)
        w = 1.0 / (len(sources) + 1)
        fn = tf.function(lambda t, label=label, sources=sources, send=send, w=w:
                         bf.neighbor_allreduce(t, self_weight=w,
                                               src_weights={s: w for s in sources},
                                               dst_weights=send, enable_topo_check=False,
                                               name="bench." + label.replace(" ", "_")))
        expected = (me + 1 + sum(s + 1 for s in sources)) / (len(sources) + 1)
        assert np.allclose(fn(x).numpy()[:4], expected), f"wrong {label} result"
        steps[label] = (fn, len(sources))
    if any(m.startswith("hierarchical") for m in args.methods) and results["hosts"] > 1:
        fn = tf.function(lambda t: bf.hierarchical_neighbor_allreduce(t, name="bench.hier"))
        local = bf.local_size()
        machine, machines = me // local, n // local
        graph = topology_util.ExponentialGraph(machines)
        srcs = [m for m in graph.predecessors(machine) if m != machine]

        def machine_mean(m):
            return sum(r + 1 for r in range(m * local, (m + 1) * local)) / local

        expected = (machine_mean(machine) + sum(machine_mean(m) for m in srcs)) / (len(srcs) + 1)
        assert np.allclose(fn(x).numpy()[:4], expected), "wrong hierarchical neighbor result"
        steps["hierarchical neighbor"] = (fn, len(srcs))
        if "hierarchical neighbor, not phased" in args.methods:
            steps["hierarchical neighbor, not phased"] = (fn, len(srcs))
    samples = {label: [] for label in steps}
    for fn, _ in steps.values():  # warm up
        fn(x)
        fn(x)
    for rep in range(args.reps):  # the methods take turns, in a rotating order
        order = list(steps)
        order = order[rep % len(order):] + order[:rep % len(order)]
        for label in order:
            basics._tune("phased_exchange", 0 if label.endswith("not phased") else 1)
            samples[label].append(one_rep(steps[label][0]))
    basics._tune("phased_exchange", 1)
    for label, (_, degree) in steps.items():
        results[label] = float(np.median(samples[label]))
        if degree is not None:
            results[label + " in-degree"] = degree
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
    extra = list(args.mpirun_args)
    if args.netns_rate:
        env.update(NETNS_ENV)
        net = NETNS_ENV["BF_NETNS_NET"] + ".0/24"
        extra += ["--mca", "plm_rsh_agent", os.path.join(NETNS, "rsh.sh"), "--mca",
                  "plm_rsh_no_tree_spawn", "1", "--mca", "btl", "self,vader,tcp", "--mca",
                  "btl_tcp_if_include", net, "--mca", "oob_tcp_if_include", net, "-x", "PATH"]
    cmd = [args.mpirun, "--allow-run-as-root", "--oversubscribe", "--bind-to", "none",
           "-np", str(ranks), *placement, *extra, args.python, HERE, "--worker",
           "--mib", str(args.mib), "--reps", str(args.reps), "--iters", str(args.iters),
           "--methods", *args.methods]
    print("$ " + " ".join(shlex.quote(c) for c in cmd), file=sys.stderr, flush=True)
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.timeout)
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-30:])
    raise RuntimeError(f"{ranks} ranks: no result (exit {proc.returncode}):\n{tail}")


def print_table(runs, title) -> None:
    """runs: for each rank count, the results of its launches."""
    import statistics

    print(f"\n{title}")
    cols = [m for m in METHODS if m in runs[0][0]]
    print("| ranks | hosts | MiB | " + " | ".join(f"{c} ms" for c in cols) +
          "".join(f" | {c} / allreduce" for c in cols[1:] if "allreduce" in cols) +
          " | worst launch (" + ", ".join(cols) + ") |")
    print("|---" * (4 + len(cols) + (len(cols) - 1 if "allreduce" in cols else 0)) + "|")
    for launches in runs:
        r = launches[0]
        med = {c: statistics.median(x[c] for x in launches) for c in cols}
        cells = " | ".join(f"{med[c] * 1e3:.0f}" for c in cols)
        ratios = ""
        if "allreduce" in cols:
            for c in cols[1:]:
                each = [x[c] / x["allreduce"] for x in launches]
                ratios += (f" | {med[c] / med['allreduce']:.2f} "
                           f"({min(each):.2f}-{max(each):.2f})")
        worst = ", ".join(f"{max(x[c] for x in launches) * 1e3:.0f}" for c in cols)
        print(f"| {r['ranks']} | {r['hosts']} | {r['bytes'] / (1 << 20):.0f} | {cells}{ratios} | "
              f"{worst} |", flush=True)
    degrees = [f"{c}: {runs[0][0][c + ' in-degree']}" for c in cols
               if c + " in-degree" in runs[0][0]]
    if degrees:
        print(f"in-degree at {runs[0][0]['ranks']} ranks: " + ", ".join(degrees))


def measure(args, title) -> None:
    runs = []
    for n in args.ranks:
        launches = []
        for _ in range(args.launches):
            start = time.time()
            launches.append(run_one(args, n))
            print(f"{n} ranks done in {time.time() - start:.0f} s", file=sys.stderr, flush=True)
        runs.append(launches)
    print_table(runs, title)


def hosts_sh(*args: str) -> None:
    subprocess.run([os.path.join(NETNS, "hosts.sh"), *args], check=True,
                   env=dict(os.environ, **NETNS_ENV))


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.worker:
        worker(args)
        return 0
    args.netns_rate = ""
    if not args.netns:
        measure(args, f"{args.mib:g} MiB, median over {args.launches} launch(es) of the median "
                      f"of {args.reps} x {args.iters} steps")
        return 0
    if os.geteuid() != 0:
        raise SystemExit("neighbor_vs_allreduce.py --netns: needs root (network namespaces)")
    hosts = [f"{NETNS_ENV['BF_NETNS_NET']}.{i}" for i in (1, 2)]
    args.hosts = ",".join(hosts)
    for rate in args.netns:
        args.netns_rate = rate
        hosts_sh("down", "2")  # what an interrupted run left
        hosts_sh("up", "2", rate)
        try:
            measure(args, f"2 pretend hosts, link {rate}, {args.mib:g} MiB, median over "
                          f"{args.launches} launch(es) of the median of {args.reps} x "
                          f"{args.iters} steps")
        finally:
            hosts_sh("down", "2")
    return 0


if __name__ == "__main__":
    sys.exit(main())
