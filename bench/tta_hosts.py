"""Time to accuracy across hosts: allreduce vs decentralized vs asynchronous training.

    python bench/tta_hosts.py                            # root: 2 pretend hosts x 4, 250mbit
    python bench/tta_hosts.py --rate 1gbit --rounds 3 --methods hierarchical winput

Makes 2 pretend hosts (network namespaces, prefix bftt, 10.213.83.0/24, each host's link
shaped to ``--rate``; needs root: see ``bench/netns/``), spreads ``--ranks`` over them and runs
``bench/async_straggler.py``'s worker there (Keras ``model.fit`` on the digits, each rank its own
shard, accuracy of every rank's model at each epoch end, evaluation outside the clock) with no
straggler. The default model is wider than that script's (``--hidden 2048``: 2.2 M parameters,
9 MB of float32 per exchange), so that the link, not the 2 cores, sets the allreduce's step.
Methods (``--methods``; ``allreduce`` always runs, first in every round):

* ``allreduce``: ``bf.DistributedOptimizer`` (the hierarchical allreduce across hosts);
* ``hierarchical``: ``hierarchical_neighbor_allreduce`` with the inner/outer machine schedule,
  the setup docs/decentralized.md recommends across hosts;
* ``neighbor``, ``winput``, ``pushsum``: as in ``bench/async_straggler.py``.

The target is the allreduce runs' median final accuracy (rank 0's model) minus ``--margin``
(1 pp); each run's time to target is its training seconds until rank 0's model first reaches it.
Prints one JSON line per run (``RUN {...}``), then per method the time to target per round, the
median, and ``allreduce / method`` per round and of the medians (over 1: faster than allreduce).
"""

import argparse
import json
import os
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import async_straggler  # noqa: E402
import results  # noqa: E402

LABELS = {"allreduce": "allreduce (DistributedOptimizer, hierarchical across hosts)",
          "hierarchical": "hierarchical_neighbor_allreduce, inner/outer machine schedule",
          "winput": "DistributedWinPutOptimizer (asynchronous)"}

NETNS = os.path.join(HERE, "netns")
NETNS_ENV = {"BF_NETNS_PREFIX": "bftt", "BF_NETNS_NET": "10.213.83"}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rate", default="250mbit", help="each pretend host's link (tc tbf rate)")
    p.add_argument("--ranks", type=int, default=8, help="spread evenly over the 2 hosts")
    p.add_argument("--methods", nargs="+", default=["hierarchical", "winput"],
                   choices=[m for m in async_straggler.METHODS if m != "allreduce"])
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--epochs", type=int, default=30)
    p.add_argument("--batch-size", type=int, default=32, help="per rank")
    p.add_argument("--lr", type=float, default=0.002)
    p.add_argument("--hidden", type=int, default=2048, help="width of the first hidden layer")
    p.add_argument("--margin", type=float, default=0.01, help="target: allreduce final - this")
    p.add_argument("--timeout", type=float, default=900, help="seconds per run")
    p.add_argument("--json", default="", help="also append the JSON lines to this file")
    results.add_out_option(p)
    return p.parse_args(argv)


def hosts_sh(*args: str) -> None:
    subprocess.run([os.path.join(NETNS, "hosts.sh"), *args], check=True,
                   env=dict(os.environ, **NETNS_ENV))


def worker_args(args):
    """async_straggler's own arguments for its run_one, plus the pretend hosts."""
    wargs = async_straggler.parse_args([
        "--ranks", str(args.ranks), "--epochs", str(args.epochs), "--batch-size",
        str(args.batch_size), "--lr", str(args.lr), "--hidden", str(args.hidden), "--timeout",
        str(args.timeout)])
    net = NETNS_ENV["BF_NETNS_NET"]
    hosts = ",".join(f"{net}.{i}:{args.ranks // 2}" for i in (1, 2))
    wargs.extra_env = dict(NETNS_ENV)
    wargs.mpirun_extra = [
        "--host", hosts, "--mca", "plm_rsh_agent", os.path.join(NETNS, "rsh.sh"), "--mca",
        "plm_rsh_no_tree_spawn", "1", "--mca", "btl", "self,vader,tcp", "--mca",
        "btl_tcp_if_include", f"{net}.0/24", "--mca", "oob_tcp_if_include", f"{net}.0/24",
        "-x", "PATH"]
    return wargs


def report(args, runs) -> None:
    target = statistics.median(r["final_acc"] for r in runs if r["method"] == "allreduce") \
        - args.margin
    out = open(args.json, "a") if args.json else None
    for r in runs:
        r["target"], r["rate"] = target, args.rate
        r["time_to_target"] = async_straggler.time_to(r["curve_rank0"], target)
        line = json.dumps(r)
        print("RUN " + line)
        if out:
            out.write(line + "\n")
    if out:
        out.close()
    if args.out:
        steps = {m: statistics.median(r["step_ms_median_per_rank"][0] for r in runs
                                      if r["method"] == m) / 1e3
                 for m in {r["method"] for r in runs}}
        results.write(args.out, "tta_hosts", [
            {"method": r["method"], "label": LABELS.get(r["method"], r["method"]),
             "round": r["round"], "time_to_target_s": r["time_to_target"],
             "median_step_s": steps[r["method"]], "final_acc": r["final_acc"],
             "target": target} for r in runs],
            f"2 pretend hosts joined by a {args.rate} link, {args.ranks // 2} ranks each; "
            f"{args.epochs} epochs. time_to_target_s: rank 0's training time until its model "
            "first reaches the target (allreduce's final accuracy minus the margin), "
            "evaluation excluded (null: never); median_step_s: the method's median step.")
    print(f"\n2 pretend hosts x {args.ranks // 2} ranks, link {args.rate}, hidden "
          f"{args.hidden}, {args.epochs} epochs; target = allreduce's median final accuracy "
          f"- {args.margin * 100:g} pp = {target:.4f} (rank 0's model)")
    print("| method | time to target, s (per round) | median | allreduce / method (per round) "
          "| median step ms | final acc rank 0 (per round) |")
    print("|---|---|---|---|---|---|")
    ar = [r["time_to_target"] for r in runs if r["method"] == "allreduce"]
    for method in ["allreduce"] + args.methods:
        mine = [r for r in runs if r["method"] == method]
        tt = [r["time_to_target"] for r in mine]
        reached = [t for t in tt if t is not None]
        med = statistics.median(reached) if len(reached) == len(tt) else None
        ratios = [f"{a / t:.2f}" if a and t else "-" for a, t in zip(ar, tt)]
        ar_med = statistics.median(ar) if None not in ar else None
        steps = statistics.median(r["step_ms_median_per_rank"][0] for r in mine)
        cells = ", ".join("-" if t is None else f"{t:.1f}" for t in tt)
        print(f"| {method} | {cells} | {'-' if med is None else f'{med:.1f}'} | "
              f"{', '.join(ratios)}; {f'{ar_med / med:.2f}' if med and ar_med else '-'} | "
              f"{steps:.0f} | {', '.join(format(r['final_acc'], '.4f') for r in mine)} |",
              flush=True)


def main(argv=None) -> int:
    args = parse_args(argv)
    if os.geteuid() != 0:
        raise SystemExit("tta_hosts.py: needs root (network namespaces)")
    if args.ranks % 2:
        raise SystemExit(f"tta_hosts.py: {args.ranks} ranks do not spread over 2 hosts")
    wargs = worker_args(args)
    runs = []
    hosts_sh("down", "2")  # what an interrupted run left
    hosts_sh("up", "2", args.rate)
    try:
        for round_ in range(1, args.rounds + 1):
            for method in ["allreduce"] + args.methods:
                result = async_straggler.run_one(wargs, method, 0.0)
                result["round"] = round_
                runs.append(result)
    finally:
        hosts_sh("down", "2")
    report(args, runs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
