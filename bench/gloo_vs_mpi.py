"""Gloo vs MPI: bf.allreduce of 1-64 MiB float32 at 2 ranks (`make bench-gloo`, `make
bench-gloo-netns`).

The driver launches the same worker alternately with `bfrun --gloo` and `mpirun` (--rounds
times each, interleaved, because these VMs drift by 2-4x within minutes), takes the median
per size over every call of every round, and prints a table with the ratio Gloo / MPI (above 1:
Gloo is slower), the range of the per-round ratios and each backend's worst launch (the median
of its slowest launch). The worker (this file with --worker) times eager calls of one tensor per
size after warm-up; a call's time is the slower rank's.

Without --netns both ranks run on this host. With ``--netns RATE [RATE ...]`` (root) each rank
runs on its own pretend host: two network namespaces made by bench/netns/hosts.sh (prefix bfgv,
10.213.79.0/24, so as not to meet other users of hosts.sh) whose link is shaped to RATE
(``none``: not shaped; ``1gbit``, ``250mbit``: tc tbf), reached through bench/netns/rsh.sh by
both launchers (``bfrun --gloo -H ... --rsh-agent``, ``mpirun -H ... --mca plm_rsh_agent``;
MPI over its TCP transport). The namespaces are made for each RATE and removed after it.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SIZES_MIB = (1, 4, 16, 64)
NETNS = os.path.join(REPO, "bench", "netns")
NETNS_ENV = {"BF_NETNS_PREFIX": "bfgv", "BF_NETNS_NET": "10.213.79"}
NETNS_HOSTS = [f"{NETNS_ENV['BF_NETNS_NET']}.{i}" for i in (1, 2)]


def worker(calls: int) -> None:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import numpy as np
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(2)
    import bluefog.tensorflow as bf

    bf.init()
    out = {}
    for mib in SIZES_MIB:
        t = tf.constant(np.ones(mib * 262144, np.float32))
        name = f"bench_{mib}"
        for _ in range(2):
            bf.allreduce(t, average=False, name=name)
        times = []
        for _ in range(calls):
            bf.barrier()
            start = time.perf_counter()
            bf.allreduce(t, average=False, name=name)
            took = time.perf_counter() - start
            times.append(float(bf.allreduce(tf.constant([took]), op=bf.Max).numpy()[0]))
        out[mib] = times
    import socket

    # Where the ranks ran: one host name per rank (the netns mode checks there are two).
    name = np.frombuffer(socket.gethostname().encode()[:64].ljust(64), np.uint8)
    hosts = bf.allgather(tf.constant(name[None, :])).numpy()
    hosts = sorted({bytes(h).decode().strip() for h in hosts})
    if bf.rank() == 0:
        print("RESULT " + json.dumps({"backend": bf.backend(), "times": out, "hosts": hosts,
                                      "local_size": bf.local_size()}), flush=True)


def launch(backend: str, calls: int, netns: bool = False) -> dict:
    py = sys.executable
    me = [py, os.path.abspath(__file__), "--worker", "--calls", str(calls)]
    env = dict(os.environ, PYTHONUNBUFFERED="1", **(NETNS_ENV if netns else {}))
    agent = os.path.join(NETNS, "rsh.sh")
    hosts = ",".join(f"{h}:1" for h in NETNS_HOSTS)
    if backend == "gloo":
        cmd = [py, "-m", "bluefog.run", "--gloo", "-np", "2"]
        if netns:
            cmd += ["-H", hosts, "--rsh-agent", agent]
        cmd += me
    else:
        cmd = ["mpirun", "--oversubscribe", "--bind-to", "none", "-np", "2"]
        if os.geteuid() == 0:
            cmd.append("--allow-run-as-root")
        if netns:
            net = NETNS_ENV["BF_NETNS_NET"] + ".0/24"
            cmd += ["-H", hosts, "--mca", "plm_rsh_agent", agent, "--mca",
                    "plm_rsh_no_tree_spawn", "1", "--mca", "pml", "ob1", "--mca", "btl",
                    "self,tcp", "--mca", "btl_tcp_if_include", net, "--mca",
                    "oob_tcp_if_include", net, "-x", "PATH"]
        cmd += me
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env, cwd=REPO)
    for line in out.stdout.splitlines():
        if "RESULT " in line:
            return json.loads(line.split("RESULT ", 1)[1])
    raise SystemExit(f"{backend} run failed ({out.returncode}):\n{out.stdout[-3000:]}"
                     f"{out.stderr[-3000:]}")


def link_bits_per_s(rate: str) -> float:
    """tc's rate ("1gbit", "250mbit") in bits per second; 0 for "none"."""
    units = {"kbit": 1e3, "mbit": 1e6, "gbit": 1e9}
    for unit, scale in units.items():
        if rate.endswith(unit):
            return float(rate[:-len(unit)]) * scale
    return 0.0


def measure(args, netns_rate: str = "") -> None:
    netns = bool(netns_rate)
    # times[backend][mib]: one list of call times per launch, in launch order.
    times = {"gloo": {m: [] for m in SIZES_MIB}, "mpi": {m: [] for m in SIZES_MIB}}
    for r in range(args.rounds):
        for backend in (("gloo", "mpi") if r % 2 == 0 else ("mpi", "gloo")):
            res = launch(backend, args.calls, netns)
            assert res["backend"] == backend, res["backend"]
            assert (len(res["hosts"]), res["local_size"]) == ((2, 1) if netns else (1, 2)), res
            for mib, ts in res["times"].items():
                times[backend][int(mib)].append(ts)
    where = (f"2 pretend hosts, 1 rank each, link {netns_rate}" if netns else
             "2 ranks on one host")
    print(f"\nbf.allreduce, {where}, median of {args.rounds} launches x {args.calls} calls "
          "per backend")
    bits = link_bits_per_s(netns_rate) if netns else 0.0
    floor_head = " | link floor" if bits else ""
    print(f"| size | Gloo | MPI | Gloo / MPI | per round | worst launch Gloo / MPI{floor_head} |")
    print("|---|---|---|---|---|---|" + ("---|" if bits else ""))
    for mib in SIZES_MIB:
        g = statistics.median([t for ts in times["gloo"][mib] for t in ts])
        m = statistics.median([t for ts in times["mpi"][mib] for t in ts])
        per_round = [statistics.median(a) / statistics.median(b)
                     for a, b in zip(times["gloo"][mib], times["mpi"][mib])]
        worst_g = max(statistics.median(ts) for ts in times["gloo"][mib])
        worst_m = max(statistics.median(ts) for ts in times["mpi"][mib])
        # At 2 ranks each rank sends (and receives) the whole buffer once: half in the
        # reduce-scatter, half in the allgather.
        floor = f" | {mib * 8 * 2**20 / bits * 1e3:.0f} ms" if bits else ""
        print(f"| {mib} MiB | {g * 1e3:.1f} ms | {m * 1e3:.1f} ms | {g / m:.2f} | "
              f"{min(per_round):.2f}-{max(per_round):.2f} | "
              f"{worst_g * 1e3:.1f} / {worst_m * 1e3:.1f} ms{floor} |", flush=True)


def hosts_sh(*args: str) -> None:
    subprocess.run([os.path.join(NETNS, "hosts.sh"), *args], check=True,
                   env=dict(os.environ, **NETNS_ENV))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--calls", type=int, default=8, help="timed calls per size and launch")
    p.add_argument("--rounds", type=int, default=2, help="launches per backend, interleaved")
    p.add_argument("--netns", nargs="+", metavar="RATE",
                   help="one rank on each of 2 pretend hosts, for each link RATE (none: not "
                        "shaped; 1gbit, 250mbit...); needs root")
    args = p.parse_args()
    if args.worker:
        worker(args.calls)
        return
    if not args.netns:
        measure(args)
        return
    if os.geteuid() != 0:
        raise SystemExit("gloo_vs_mpi.py --netns: needs root (it makes network namespaces)")
    for rate in args.netns:
        hosts_sh("down", "2")  # what an interrupted run left
        hosts_sh("up", "2", rate)
        try:
            measure(args, rate)
        finally:
            hosts_sh("down", "2")


if __name__ == "__main__":
    main()
