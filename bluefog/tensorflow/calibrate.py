"""Calibrates bluefog's cost model (bluefog.common.cost_model) on this cluster and recommends
an averaging method.

Run it the way you run training, on the hosts you train on, e.g.::

    bfrun -np 8 -H a:4,b:4 python -m bluefog.tensorflow.calibrate --mib 16

Each rank times bluefog's own neighbor exchanges (inside tf.function) with a partner on its
host and with the same local rank on another host, every rank at once, at 1 KiB and at
--calibration-mib, next to the same op without a peer, interleaved: latency is the small
exchange, bandwidth the large one's extra time over the op alone. Rank 0 prints the costs, the
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
BACK_TO_BACK = 3


def _exchange_steps(peer: Optional[int], nbytes: int, name: str):
    """A warmed-up step: one neighbor_allreduce of `nbytes` with `peer` both ways (or alone)."""
    import numpy as np
    import tensorflow as tf

    from bluefog.tensorflow import neighbor_ops

    x = tf.constant(np.ones(max(1, nbytes // 4), np.float32))
    peers = [] if peer is None else [peer]
    w = 0.5 if peers else 1.0

    @tf.function
    def step(t):
        return neighbor_ops.neighbor_allreduce_op(t, name, peers, peers, w, [w] * len(peers), [])

    step(x).numpy()
    return lambda: step(x).numpy()


def _timed(steps: dict, reps: int, tag: str) -> dict:
    """Slowest rank's median seconds of each step; the steps interleaved within each repetition
    so that outside load falls on all of them alike."""
    import tensorflow as tf

    import bluefog.tensorflow as bf

    times = {k: [] for k in steps}
    for _ in range(reps):
        for k, fn in steps.items():
            # Start together, and average a few steps back to back, as training runs them.
            bf.allreduce(tf.constant([0.0]), name=f"calib.{tag}.barrier")
            t0 = time.perf_counter()
            for _ in range(BACK_TO_BACK):
                fn()
            times[k].append((time.perf_counter() - t0) / BACK_TO_BACK)
    keys = sorted(steps)
    mine = tf.constant([statistics.median(times[k]) for k in keys], tf.float64)
    worst = bf.allreduce(mine, op=bf.Max, name=f"calib.{tag}.max").numpy()
    return {k: float(v) for k, v in zip(keys, worst)}


def calibrate(nbytes: int = 16 << 20, reps: int = 5, inter: Optional[cost_model.Link] = None
              ) -> cost_model.Costs:
    """Measures the costs on the running job (every rank must call it). ``inter`` stands in
    for the link between hosts when the job has one host."""
    import bluefog.tensorflow as bf

    rank, local, local_rank = bf.rank(), bf.local_size(), bf.local_rank()
    machines = bf.machine_size() if bf.is_homogeneous() else 1

    def link(tag: str, peer: Optional[int], per_host: int):
        steps = {(kind, s): _exchange_steps(p, s, f"calib.{tag}.{kind}.{s}")
                 for kind, p in (("self", None), ("pair", peer)) for s in (SMALL, nbytes)}
        t = _timed({f"{k[0]}.{k[1]}": v for k, v in steps.items()}, reps, tag)
        self_extra = t[f"self.{nbytes}"] - t[f"self.{SMALL}"]
        pair_extra = t[f"pair.{nbytes}"] - t[f"pair.{SMALL}"]
        # The exchange's extra time over the same op without a peer: sending, receiving and
        # combining what was received (the model charges the first receive nothing more).
        # Under heavy load the difference can vanish in the noise: never below a quarter.
        transfer = max(pair_extra - self_extra, 0.25 * pair_extra, 1e-6)
        latency = max(t[f"pair.{SMALL}"] - t[f"self.{SMALL}"], 20e-6)
        op = (t[f"self.{SMALL}"], nbytes / max(self_extra, 1e-6))
        return cost_model.Link(latency, per_host * nbytes / transfer), op

    op = None
    intra = cost_model.Link(20e-6, 1e12)  # no peer on the host: never used
    if local > 1:
        mate = local_rank ^ 1
        intra, op = link("intra", rank - local_rank + mate if mate < local else None, 1)
    if machines > 1:
        mate = bf.machine_rank() ^ 1
        inter, op_x = link("inter", mate * local + local_rank if mate < machines else None,
                           local)
        op = op or op_x
    elif inter is None:
        raise ValueError(f"rank {rank}: calibrate: this job runs on one host, so the link "
                         "between hosts cannot be measured; run it across two hosts or give "
                         "--inter-gbit and --inter-latency-ms")
    if op is None:  # one rank
        op = (t_small_op(), 1e12)
    return cost_model.Costs(intra, inter, op[0], op[1], _combine_bps(nbytes, reps))


def t_small_op() -> float:
    fn = _exchange_steps(None, SMALL, "calib.single")
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def _combine_bps(nbytes: int, reps: int) -> float:
    """One weighted-sum pass (out += w * x) over `nbytes`, every rank at once; slowest rank."""
    import numpy as np
    import tensorflow as tf

    import bluefog.tensorflow as bf

    x = np.ones(max(1, nbytes // 4), np.float32)
    out, tmp = np.zeros_like(x), np.empty_like(x)
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        np.multiply(x, 0.5, out=tmp)
        np.add(out, tmp, out=out)
        times.append(time.perf_counter() - t0)
    worst = bf.allreduce(tf.constant([statistics.median(times)], tf.float64), op=bf.Max,
                         name="calib.combine.max").numpy()[0]
    return nbytes / max(float(worst), 1e-9)


def describe(costs: cost_model.Costs) -> str:
    return (f"within a host: latency {costs.intra.latency_s * 1e3:.3f} ms, "
            f"{costs.intra.bandwidth_bps / 1e9:.2f} GB/s per rank; between hosts: latency "
            f"{costs.inter.latency_s * 1e3:.3f} ms, {costs.inter.bandwidth_bps / 1e9:.3f} GB/s "
            f"per host and direction; one op: {costs.op_latency_s * 1e3:.2f} ms + "
            f"{costs.op_bps / 1e9:.2f} GB/s; a pass over memory {costs.combine_bps / 1e9:.2f} GB/s")


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
    p.add_argument("--calibration-mib", type=float, default=16.0)
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
