#!/usr/bin/env python3
"""tf.distribute.MultiWorkerMirroredStrategy all-reduce baseline.

The stock TensorFlow way to all-reduce across processes, for side-by-side
comparison with bench/mpi_allreduce.cc (the MPI floor) and bluefog.

    python bench/tf_mwms.py --ranks 2 [--json] [--max-bytes N] [--reps R]

Without --worker-index this is the launcher: it reserves free localhost
ports, starts one worker process per rank with TF_CONFIG pointing at them,
relays worker 0's stdout, and kills every worker on the first failure or when
--timeout expires (a lost peer makes the survivors hang in a collective
forever, so a hard timeout is the only reliable exit).

Worker 0 prints, per size, one JSON line (with --json) or a table row:
    {"impl":"mwms","ranks":n,"bytes":b,"median_s":t}
and, to match the MPI "many small" measurement,
    {"impl":"mwms_100x1KiB","ranks":n,"median_s":t}
A "call" is one eager invocation of a tf.function holding the collective, so
the time includes Python/tf.function dispatch: that is the cost a training
step pays, and what a bluefog op called the same way would pay too. The
100 x 1 KiB step is ONE all_reduce over a list of 100 tensors (TF may run
them concurrently), unlike the MPI baseline's 100 sequential calls.
"""

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--json", action="store_true")
    p.add_argument("--max-bytes", type=int, default=64 << 20)
    p.add_argument("--reps", type=int, default=7,
                   help="timed repetitions per size (median is reported)")
    p.add_argument("--budget", type=float, default=0.5,
                   help="target timed seconds per size; sets batch length")
    p.add_argument("--inter-op", type=int, default=2,
                   help="inter-op threads per worker (collective send/recv "
                        "and the reduction must be able to overlap)")
    p.add_argument("--no-small", action="store_true",
                   help="skip the 100 x 1 KiB measurement")
    p.add_argument("--cpu-bfc", action="store_true",
                   help="set TF_CPU_ALLOCATOR_USE_BFC=true in workers, so "
                        "big outputs reuse pooled memory instead of fresh "
                        "mmap'd pages every call")
    p.add_argument("--timeout", type=float, default=300.0,
                   help="launcher hard timeout in seconds")
    p.add_argument("--worker-index", type=int, default=None,
                   help=argparse.SUPPRESS)  # set by the launcher
    return p.parse_args(argv)


def sizes(max_bytes):
    # Same list as mpi_allreduce.cc: powers of 4 from 4 B, 1 KiB guaranteed.
    out, b = [], 4
    while b <= max_bytes:
        out.append(b)
        b *= 4
    if max_bytes >= 1024 and 1024 not in out:
        out.append(1024)
    return sorted(out)


# ----------------------------------------------------------------- launcher


def free_ports(n):
    # Hold all sockets open until every port is chosen so none repeats; the
    # remaining race (someone grabbing a port before the worker binds) is
    # acceptable for a benchmark on a quiet machine.
    socks = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("localhost", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def kill_all(procs):
    # Each worker leads its own process group, so TF's helper threads and any
    # children go with it; SIGKILL follows because a worker blocked in a
    # collective may not honour SIGTERM promptly.
    for p in procs:
        if p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
    deadline = time.time() + 5
    for p in procs:
        try:
            p.wait(timeout=max(0.1, deadline - time.time()))
        except subprocess.TimeoutExpired:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait()


def tail(path, n=4000):
    with open(path, "rb") as f:
        f.seek(0, os.SEEK_END)
        f.seek(max(0, f.tell() - n))
        return f.read().decode(errors="replace")


def launch(args):
    ports = free_ports(args.ranks)
    cluster = {"worker": [f"localhost:{p}" for p in ports]}
    logdir = tempfile.mkdtemp(prefix="tf_mwms_")
    passthrough = list(sys.argv[1:])
    procs, logs = [], []
    for i in range(args.ranks):
        env = dict(os.environ)
        env["TF_CONFIG"] = json.dumps(
            {"cluster": cluster, "task": {"type": "worker", "index": i}})
        env["CUDA_VISIBLE_DEVICES"] = ""  # CPU-only, even if a GPU appears
        env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        if args.cpu_bfc:
            env["TF_CPU_ALLOCATOR_USE_BFC"] = "true"
        log = os.path.join(logdir, f"worker{i}.log")
        logs.append(log)
        logf = open(log, "wb")
        procs.append(subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), "--worker-index",
             str(i)] + passthrough,
            env=env, start_new_session=True,
            stdout=None if i == 0 else logf, stderr=logf))
        logf.close()

    deadline = time.time() + args.timeout
    failed = None
    try:
        while True:
            codes = [p.poll() for p in procs]
            bad = [(i, c) for i, c in enumerate(codes) if c not in (None, 0)]
            if bad:
                failed = "worker {} exited with {}".format(*bad[0])
                break
            if all(c == 0 for c in codes):
                break
            if time.time() > deadline:
                failed = f"timeout after {args.timeout:.0f} s"
                break
            time.sleep(0.2)
    except KeyboardInterrupt:
        failed = "interrupted"
    if failed:
        kill_all(procs)
        sys.stderr.write(f"tf_mwms: {failed}; worker logs in {logdir}\n")
        for i, log in enumerate(logs):
            sys.stderr.write(f"---- worker {i} (tail) ----\n{tail(log)}\n")
        return 1
    shutil.rmtree(logdir, ignore_errors=True)  # logs only matter on failure
    return 0


# ------------------------------------------------------------------- worker


def worker(args):
    import numpy as np
    import tensorflow as tf

    # Must precede any op execution; one intra-op thread per worker keeps N
    # workers from oversubscribing the (few) cores, like one MPI rank per core.
    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(args.inter_op)
    tf.config.set_visible_devices([], "GPU")

    comm = tf.distribute.experimental.CommunicationOptions(
        implementation=tf.distribute.experimental.CommunicationImplementation.RING)
    strategy = tf.distribute.MultiWorkerMirroredStrategy(
        communication_options=comm)
    n, me = args.ranks, args.worker_index
    assert strategy.num_replicas_in_sync == n, strategy.num_replicas_in_sync
    SUM = tf.distribute.ReduceOp.SUM

    # The real gradient-aggregation path: a replica-context all_reduce inside
    # strategy.run inside a tf.function, which lowers to CollectiveReduceV2
    # ops executed over gRPC between the worker processes.
    def replica_fn(ts):
        # A function argument carries no device, and MWMS rejects a reduce
        # "to" a device-less tensor; the identity, created under strategy.run's
        # replica device scope, gets one, as real gradients do. In-graph
        # Identity forwards the buffer, so nothing is copied.
        ts = tf.nest.map_structure(tf.identity, ts)
        return tf.distribute.get_replica_context().all_reduce(SUM, ts)

    @tf.function
    def allreduce(x):
        return strategy.run(replica_fn, args=(x,))

    @tf.function
    def allreduce_many(xs):
        return strategy.run(replica_fn, args=(xs,))

    def gather_max(value):
        # Max over workers via SUM of one-hot vectors (collectives here offer
        # no MAX). Doubles as a barrier, and gives every worker the same
        # number, so all derive identical batch sizes and collectives match.
        v = np.zeros(n, np.float64)
        v[me] = value
        return float(np.max(allreduce(tf.constant(v)).numpy()))

    def timed_batch(fn, x, iters):
        gather_max(0.0)  # line everyone up before the clock starts
        t0 = time.perf_counter()
        for _ in range(iters):
            out = fn(x)
        # Eager calls on CPU are synchronous; touching the result is cheap
        # insurance in case async eager is ever enabled.
        tf.nest.map_structure(lambda t: t.numpy(), out)
        return gather_max(time.perf_counter() - t0)

    def measure(fn, x):
        timed_batch(fn, x, 3)  # trace + collective group/instance setup
        est = timed_batch(fn, x, 2) / 2
        iters = int(min(max(args.budget / (args.reps * max(est, 1e-6)), 1),
                        10000))
        # Big tensors: even one call per rep can blow the runtime budget;
        # drop reps (keep >= 3 for a meaningful median) rather than the size.
        reps = args.reps
        if iters == 1:
            reps = max(3, min(args.reps, int(3 * args.budget / est)))
        return float(np.median([timed_batch(fn, x, iters) / iters
                                for _ in range(reps)]))

    def emit(rec, human):
        if me != 0:
            return
        print(json.dumps(rec, separators=(",", ":")) if args.json else human,
              flush=True)

    if not args.json and me == 0:
        print(f"# MWMS RING all_reduce(SUM, float32), ranks={n}, reps={args.reps}\n"
              f"{'bytes':>12} {'median_us':>14} {'algbw_MB/s':>12}", flush=True)

    # Each worker contributes me+1, so a correct cross-process sum is
    # n(n+1)/2 and a local-only shortcut (me+1) cannot pass.
    want = n * (n + 1) / 2
    for nbytes in sizes(args.max_bytes):
        # Built once per size and reused across calls: only the collective's
        # own output allocation is in the timed loop.
        x = tf.fill([nbytes // 4], tf.constant(me + 1, tf.float32))
        got = allreduce(x).numpy()
        if not np.all(got == want):
            raise SystemExit(f"worker {me}: {nbytes} B all-reduce gave {got[:4]!r}, "
                             f"want {want!r}")
        t = measure(allreduce, x)
        emit({"impl": "mwms", "ranks": n, "bytes": nbytes, "median_s": t},
             f"{nbytes:12d} {t * 1e6:14.2f} {nbytes / t / 1e6:12.1f}")
        del x, got

    if not args.no_small:
        # 100 distinct 1 KiB tensors all-reduced in one replica-context call,
        # which is how a model's 100 small gradients reach the collective.
        xs = [tf.fill([256], tf.constant(me + 1, tf.float32))
              for _ in range(100)]
        got = allreduce_many(xs)
        if not all(np.all(g.numpy() == want) for g in got):
            raise SystemExit(f"worker {me}: 100x1KiB all-reduce mismatch")
        t = measure(allreduce_many, xs)
        emit({"impl": "mwms_100x1KiB", "ranks": n, "median_s": t},
             f"# 100 x 1 KiB in one all_reduce call: median step {t * 1e6:.2f} us")
    return 0


def main():
    args = parse_args()
    if args.ranks < 1 or args.reps < 1 or args.max_bytes < 4:
        sys.exit("tf_mwms: --ranks, --reps must be >= 1, --max-bytes >= 4")
    if args.worker_index is None:
        return launch(args)
    return worker(args)


if __name__ == "__main__":
    sys.exit(main())
