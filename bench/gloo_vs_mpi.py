"""Gloo vs MPI: bf.allreduce of 64 KiB-64 MiB float32 at 2 and 3 ranks (`make bench-gloo`, `make
bench-gloo-netns`).

The driver launches the same worker alternately with `bfrun --gloo` and `mpirun` (--rounds
times each, interleaved, because these VMs drift by 2-4x within minutes), takes the median
per size over every call of every round, and prints a table with the ratio Gloo / MPI (above 1:
Gloo is slower), the range of the per-round ratios and each backend's worst launch (the median
of its slowest launch). The worker (this file with --worker) times eager calls of one tensor per
size after warm-up; a call's time is the slower rank's.

Without --netns every rank runs on this host, for each rank count of --np (2 and 3). With
``--netns RATE [RATE ...]`` (root) the ranks run on two pretend hosts, --per-host ranks on each
(1, 2: each count in turn): two network namespaces made by bench/netns/hosts.sh (prefix bfgv,
10.213.79.0/24, so as not to meet other users of hosts.sh) whose link is shaped to RATE
(``none``: not shaped; ``1gbit``, ``250mbit``: tc tbf), reached through bench/netns/rsh.sh by
both launchers (``bfrun --gloo -H ... --rsh-agent``, ``mpirun -H ... --mca plm_rsh_agent``;
MPI over its TCP transport). The namespaces are made for each RATE and removed after it. Each
table then gives the link's floor (the time the link needs for the bytes each host must send
across) and the share of the link's rate each backend's slowest launch moved.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SIZES_KIB = (64, 256, 1024, 4096, 16384, 65536)
NETNS = os.path.join(REPO, "bench", "netns")
NETNS_ENV = {"BF_NETNS_PREFIX": "bfgv", "BF_NETNS_NET": "10.213.79"}
NETNS_HOSTS = [f"{NETNS_ENV['BF_NETNS_NET']}.{i}" for i in (1, 2)]
sys.path.insert(0, os.path.join(REPO, "bench"))
import results  # noqa: E402  (bench/results.py)

RECORDS = []  # what --out writes: one per size, rank count and link (docs/data/gloo_vs_mpi_*)


def link_text(rate: str) -> str:
    """tc's rate as the tables write it: "1gbit" -> "1 Gbit/s", "none" -> "not shaped"."""
    for unit, text in (("gbit", "Gbit/s"), ("mbit", "Mbit/s"), ("kbit", "kbit/s")):
        if rate.endswith(unit):
            return f"{rate[:-len(unit)]} {text}"
    return "not shaped"


def worker(calls: int, sizes_kib) -> None:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import numpy as np
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(2)
    import bluefog.tensorflow as bf

    bf.init()
    out = {}
    for kib in sizes_kib:
        t = tf.constant(np.ones(int(kib * 256), np.float32))
        name = f"bench_{kib}"
        for _ in range(2):
            bf.allreduce(t, average=False, name=name)
        times = []
        for _ in range(calls):
            bf.barrier()
            start = time.perf_counter()
            bf.allreduce(t, average=False, name=name)
            took = time.perf_counter() - start
            times.append(float(bf.allreduce(tf.constant([took]), op=bf.Max).numpy()[0]))
        out[kib] = times
    import socket

    # Where the ranks ran: one host name per rank (the netns mode checks there are two).
    name = np.frombuffer(socket.gethostname().encode()[:64].ljust(64), np.uint8)
    hosts = bf.allgather(tf.constant(name[None, :])).numpy()
    hosts = sorted({bytes(h).decode().strip() for h in hosts})
    from bluefog.common import basics

    # MPI across hosts: whether the allreduces took Gloo's pairs (BLUEFOG_CROSS_HOST, the probe).
    cross = bool(basics._tuning("cross_host_calls")) if bf.backend() == "mpi" else False
    if bf.rank() == 0:
        print("RESULT " + json.dumps({"backend": bf.backend(), "times": out, "hosts": hosts,
                                      "local_size": bf.local_size(), "cross_host": cross}),
              flush=True)


def size_text(kib: float) -> str:
    return f"{kib / 1024:g} MiB" if kib >= 1024 else f"{kib:g} KiB"


def launch(backend: str, calls: int, netns: bool = False, np_: int = 2,
           sizes_kib=SIZES_KIB, per_host: int = 1, mca=(), cross_host: str = "") -> dict:
    py = sys.executable
    me = [py, os.path.abspath(__file__), "--worker", "--calls", str(calls), "--sizes-kib",
          *map(str, sizes_kib)]
    env = dict(os.environ, PYTHONUNBUFFERED="1", **(NETNS_ENV if netns else {}))
    agent = os.path.join(NETNS, "rsh.sh")
    hosts = ",".join(f"{h}:{per_host}" for h in NETNS_HOSTS)
    if backend == "gloo":
        cmd = [py, "-m", "bluefog.run", "--gloo", "-np", str(np_)]
        if netns:
            cmd += ["-H", hosts, "--rsh-agent", agent]
        cmd += me
    else:
        cmd = ["mpirun", "--oversubscribe", "--bind-to", "none", "-np", str(np_)]
        if os.geteuid() == 0:
            cmd.append("--allow-run-as-root")
        if netns:
            net = NETNS_ENV["BF_NETNS_NET"] + ".0/24"
            cmd += ["-H", hosts, "--mca", "plm_rsh_agent", agent, "--mca",
                    "plm_rsh_no_tree_spawn", "1", "--mca", "pml", "ob1", "--mca", "btl",
                    "self,tcp", "--mca", "btl_tcp_if_include", net, "--mca",
                    "oob_tcp_if_include", net, "-x", "PATH"]
        for setting in mca:
            cmd += ["--mca", *setting.split("=", 1)]
        if cross_host:
            env["BLUEFOG_CROSS_HOST"] = cross_host
            cmd += ["-x", "BLUEFOG_CROSS_HOST"]
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


def measure(args, netns_rate: str = "", np_: int = 2, per_host: int = 1) -> float:
    """Prints the table; returns the worst Gloo / MPI ratio of any size (one host)."""
    netns = bool(netns_rate)
    if netns:
        np_ = 2 * per_host
    # times[backend][kib]: one list of call times per launch, in launch order.
    sizes = args.sizes_kib
    times = {"gloo": {k: [] for k in sizes}, "mpi": {k: [] for k in sizes}}
    crossed = []  # per MPI launch: whether its allreduces took Gloo's pairs across hosts
    for r in range(args.rounds):
        for backend in (("gloo", "mpi") if r % 2 == 0 else ("mpi", "gloo")):
            res = launch(backend, args.calls, netns, np_, sizes, per_host, args.mca,
                         args.cross_host)
            if backend == "mpi":
                crossed.append(res.get("cross_host", False))
            assert res["backend"] == backend, res["backend"]
            assert (len(res["hosts"]), res["local_size"]) == ((2, per_host) if netns else
                                                              (1, np_)), res
            for kib, ts in res["times"].items():
                times[backend][float(kib)].append(ts)
    where = (f"2 pretend hosts, {per_host} rank(s) each, link {netns_rate}" if netns else
             f"{np_} ranks on one host")
    print(f"\nbf.allreduce, {where}, median of {args.rounds} launches x {args.calls} calls "
          "per backend")
    if netns:
        print(f"MPI across hosts (BLUEFOG_CROSS_HOST={args.cross_host or 'auto'}): "
              + ", ".join("Gloo's pairs" if c else "MPI's transport" for c in crossed)
              + " (per launch)")
    bits = link_bits_per_s(netns_rate) if netns else 0.0
    floor_head = " | link floor | worst launch's share of the link Gloo / MPI" if bits else ""
    print(f"| size | Gloo | MPI | Gloo / MPI | per round | worst launch Gloo / MPI{floor_head} |")
    print("|---|---|---|---|---|---|" + ("---|---|" if bits else ""))
    worst_ratio = 0.0
    for kib in sizes:
        g = statistics.median([t for ts in times["gloo"][kib] for t in ts])
        m = statistics.median([t for ts in times["mpi"][kib] for t in ts])
        per_round = [statistics.median(a) / statistics.median(b)
                     for a, b in zip(times["gloo"][kib], times["mpi"][kib])]
        worst_g = max(statistics.median(ts) for ts in times["gloo"][kib])
        worst_m = max(statistics.median(ts) for ts in times["mpi"][kib])
        worst_ratio = max(worst_ratio, worst_g / worst_m)
        # Each host must send the other (and receive from it) the whole buffer's worth at
        # least: half of the partial sums and half of the result. At 1 rank per host the ring
        # sends exactly that (half in the reduce-scatter, half in the allgather); at several,
        # the hierarchical allreduce splits it over the host's ranks. The share of the link is
        # that floor over the time.
        floor_s = kib * 8 * 2**10 / bits if bits else 0.0
        floor = (f" | {floor_s * 1e3:.0f} ms | {floor_s / worst_g:.0%} / {floor_s / worst_m:.0%}"
                 if bits else "")
        RECORDS.append({
            "where": "2 hosts" if netns else "one host", "ranks": np_, "per_host":
            per_host if netns else np_, "link": link_text(netns_rate) if netns else None,
            "bytes": int(kib * 1024), "gloo_s": g, "mpi_s": m, "gloo_over_mpi": g / m,
            "per_round_min": min(per_round), "per_round_max": max(per_round),
            "gloo_worst_launch_s": worst_g, "mpi_worst_launch_s": worst_m,
            "worst_launch_ratio": worst_g / worst_m, "link_floor_s": floor_s or None,
            "mpi_across_hosts_gloo_pairs": all(crossed) if netns else None})
        print(f"| {size_text(kib)} | {g * 1e3:.2f} ms | {m * 1e3:.2f} ms | {g / m:.2f} | "
              f"{min(per_round):.2f}-{max(per_round):.2f} | "
              f"{worst_g * 1e3:.2f} / {worst_m * 1e3:.2f} ms ({worst_g / worst_m:.2f}){floor} |",
              flush=True)
    return worst_ratio


def hosts_sh(*args: str) -> None:
    subprocess.run([os.path.join(NETNS, "hosts.sh"), *args], check=True,
                   env=dict(os.environ, **NETNS_ENV))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--calls", type=int, default=8, help="timed calls per size and launch")
    p.add_argument("--rounds", type=int, default=2, help="launches per backend, interleaved")
    p.add_argument("--sizes-kib", type=float, nargs="+", default=list(SIZES_KIB),
                   help="tensor sizes in KiB (default 64 KiB to 64 MiB)")
    p.add_argument("--np", type=int, nargs="+", default=[2, 3],
                   help="ranks on one host, each count measured in turn (without --netns)")
    p.add_argument("--netns", nargs="+", metavar="RATE",
                   help="2 pretend hosts, for each link RATE (none: not shaped; 1gbit, "
                        "250mbit...); needs root")
    p.add_argument("--per-host", type=int, nargs="+", default=[1],
                   help="ranks on each pretend host (with --netns), each count in turn")
    p.add_argument("--mca", nargs="+", default=[], metavar="NAME=VALUE",
                   help="Open MPI settings added to the mpirun launches (--mca NAME VALUE)")
    p.add_argument("--cross-host", default="", metavar="HOW",
                   help="BLUEFOG_CROSS_HOST for the mpirun launches (auto, mpi, gloo; default: "
                        "unset, which is auto)")
    results.add_out_option(p)
    args = p.parse_args()
    if args.worker:
        worker(args.calls, args.sizes_kib)
        return
    if not args.netns:
        worst = {n: measure(args, np_=n) for n in args.np}
        print(f"\nworst launch Gloo / MPI over {size_text(min(args.sizes_kib))}-"
              f"{size_text(max(args.sizes_kib))}: " +
              ", ".join(f"{n} ranks {w:.2f}" for n, w in worst.items()))
        save(args)
        return
    if os.geteuid() != 0:
        raise SystemExit("gloo_vs_mpi.py --netns: needs root (it makes network namespaces)")
    for rate in args.netns:
        hosts_sh("down", "2")  # what an interrupted run left
        hosts_sh("up", "2", rate)
        try:
            for per_host in args.per_host:
                measure(args, rate, per_host=per_host)
        finally:
            hosts_sh("down", "2")
    save(args)


def save(args) -> None:
    if args.out:
        results.write(args.out, "gloo_vs_mpi", RECORDS,
                      f"Eager bf.allreduce of one float32 tensor, bfrun --gloo against mpirun, "
                      f"{args.rounds} launches per backend interleaved, {args.calls} calls per "
                      "size and launch, a call's time the slower rank's. gloo_s, mpi_s: median "
                      "over every call; per_round_min/max: the per-round Gloo / MPI ratio's "
                      "range; *_worst_launch_s: the median of each backend's slowest launch; "
                      "link_floor_s: each host sending the other the buffer once.")


if __name__ == "__main__":
    main()
