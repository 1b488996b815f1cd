"""Calibrates bluefog's cost model (bluefog.common.cost_model) on this cluster and recommends
an averaging method.

Run it the way you run training, on the hosts you train on, e.g.::

    bfrun -np 8 -H a:4,b:4 python -m bluefog.tensorflow.calibrate --mib 16

Each rank times bluefog's own neighbor exchanges (inside tf.function) with a partner on its
host and with the same local rank on another host, every rank at once, at a small and a large
size: latency is the small exchange, bandwidth the slope. Rank 0 prints the costs, the
predicted step time of every method at this job's size and at 64-1024 ranks, and the
recommendation. ``--save FILE`` keeps the costs as JSON; ``--load FILE`` predicts from saved
costs without MPI. On one host the link between hosts cannot be measured: give it with
``--inter-gbit`` and ``--inter-latency-ms``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Optional

from bluefog.common import cost_model

SMALL = 1024


def _time_exchange(peer: Optional[int], nbytes: int, reps: int, name: str) -> float:
    """Slowest rank's median seconds of one neighbor_allreduce with `peer` (both ways)."""
    import numpy as np
    import tensorflow as tf

    import bluefog.tensorflow as bf
    from bluefog.tensorflow import neighbor_ops

    x = tf.constant(np.ones(max(1, nbytes // 4), np.float32))
    peers = [] if peer is None else [peer]
    w = 0.5 if peers else 1.0

    @tf.function
    def step(t):
        return neighbor_ops.neighbor_allreduce_op(t, name, peers, peers, w, [w] * len(peers), [])

    step(x).numpy()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        step(x).numpy()
        times.append(time.perf_counter() - t0)
    mine = statistics.median(times)
    return float(bf.allreduce(tf.constant([mine], tf.float64), op=bf.Max,
                              name=f"{name}.max").numpy()[0])


def calibrate(nbytes: int = 4 << 20, reps: int = 5, inter: Optional[cost_model.Link] = None
              ) -> cost_model.Costs:
    """Measures the costs on the running job (every rank must call it). ``inter`` stands in
    for the link between hosts when the job has one host."""
    import bluefog.tensorflow as bf

    rank, local, local_rank = bf.rank(), bf.local_size(), bf.local_rank()
    machines = bf.machine_size() if bf.is_homogeneous() else 1
    t_self = {s: _time_exchange(None, s, reps, f"calib.self.{s}") for s in (SMALL, nbytes)}
    combine = nbytes / max(t_self[nbytes] - t_self[SMALL], 1e-9)

    def link(peer_of, per_host: int) -> cost_model.Link:
        t = {s: _time_exchange(peer_of(), s, reps, f"calib.{per_host}.{s}")
             for s in (SMALL, nbytes)}
        # The exchange's extra time over the same op without a peer: sending, receiving and
        # combining what was received (the model charges the first receive nothing more).
        transfer = max(t[nbytes] - t[SMALL] - (t_self[nbytes] - t_self[SMALL]), 1e-9)
        return cost_model.Link(t[SMALL], per_host * nbytes / transfer)

    def local_peer():
        mate = local_rank ^ 1
        return rank - local_rank + mate if mate < local else None

    intra = link(local_peer, 1) if local > 1 else cost_model.Link(t_self[SMALL], 1e12)
    if machines > 1:
        def remote_peer():
            mate = bf.machine_rank() ^ 1
            return mate * local + local_rank if mate < machines else None
        inter = link(remote_peer, local)
    elif inter is None:
        raise ValueError(f"rank {rank}: calibrate: this job runs on one host, so the link "
                         "between hosts cannot be measured; run it across two hosts or give "
                         "--inter-gbit and --inter-latency-ms")
    return cost_model.Costs(intra, inter, combine)


def describe(costs: cost_model.Costs) -> str:
    return (f"within a host: latency {costs.intra.latency_s * 1e3:.3f} ms, "
            f"{costs.intra.bandwidth_bps / 1e9:.2f} GB/s per rank; between hosts: latency "
            f"{costs.inter.latency_s * 1e3:.3f} ms, {costs.inter.bandwidth_bps / 1e9:.3f} GB/s "
            f"per host and direction; combine {costs.combine_bps / 1e9:.2f} GB/s")


def report(costs: cost_model.Costs, size: int, local: int, nbytes: int,
           sizes: list, table_local: int) -> str:
    method, how, times = cost_model.recommend(costs, size, local, nbytes)
    lines = [describe(costs), "",
             f"predicted ms per step, {size} ranks, {local} per host, {nbytes / 2**20:g} MiB:"]
    lines += [f"  {name:50s} {t * 1e3:9.1f}" for name, t in times.items()]
    lines += ["", f"recommended: {method}", f"  use: {how}", "",
              f"predicted ms per step at {table_local} ranks per host:",
              cost_model.format_table(costs, sizes, table_local, nbytes)]
    return "\n".join(lines)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mib", type=float, default=16.0, help="tensor size to predict for")
    p.add_argument("--calibration-mib", type=float, default=4.0)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--size", type=int, help="ranks to recommend for (default: this job)")
    p.add_argument("--local-size", type=int, help="ranks per host (default: this job)")
    p.add_argument("--sizes", default="64,128,256,512,1024")
    p.add_argument("--table-local-size", type=int, help="ranks per host in the table")
    p.add_argument("--inter-gbit", type=float, help="link between hosts, Gbit/s (one host)")
    p.add_argument("--inter-latency-ms", type=float, default=0.2)
    p.add_argument("--save", help="write the costs to this JSON file (rank 0)")
    p.add_argument("--load", help="predict from saved costs, without MPI")
    args = p.parse_args(argv)
    nbytes = int(args.mib * 2**20)
    sizes = [int(s) for s in args.sizes.split(",")]
    if args.load:
        with open(args.load) as f:
            costs = cost_model.Costs.from_dict(json.load(f))
        size, local = args.size or 8, args.local_size or 4
        print(report(costs, size, local, nbytes, sizes, args.table_local_size or local))
        return
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(1)
    import bluefog.tensorflow as bf

    bf.init()
    inter = None
    if args.inter_gbit:
        inter = cost_model.Link(args.inter_latency_ms / 1e3, args.inter_gbit * 1e9 / 8)
    costs = calibrate(int(args.calibration_mib * 2**20), args.reps, inter)
    if bf.rank() == 0:
        size, local = args.size or bf.size(), args.local_size or bf.local_size()
        print(report(costs, size, local, nbytes, sizes, args.table_local_size or local))
        if args.save:
            with open(args.save, "w") as f:
                json.dump(costs.as_dict(), f, indent=1)


if __name__ == "__main__":
    main()
