"""Eager and tf.function allreduce timings of one framework, bluefog or Horovod, through the
API they share (``hvd.allreduce(x, op=hvd.Sum, name=...)``), with raw MPI_Allreduce timed in
the same process, its batches interleaved with the framework's (the ratios use it). Run on
every rank under mpirun by bench/vs_horovod.py, with bluefog's .venv or Horovod's; rank 0
prints JSON lines {"framework", "impl", "bytes", "median_s", "ranks"}.

    mpirun -np 2 python bench/fw_allreduce.py --framework bluefog \
        --mpi-lib build/bench/libmpi_allreduce.so

impl: eager (an eager call on a kept input), function (the call inside a tf.function, kept
input), function_temp (inside a tf.function on a temporary, t * 2: a gradient is one),
scale (that tf.function's multiplication alone: function_temp - scale is the allreduce's
share), call (a tf.function of the same argument that communicates nothing: TensorFlow's own
cost of a call, ~0.2-0.3 ms here whatever it holds), chain_temp (one tf.function of 8 chained
allreduces, each of a temporary t * 0.5, as a training step's graph holds many) and
chain_scale (its 8 multiplications alone: (chain_temp - chain_scale) / 8 is one allreduce's
time inside a graph, with no function call in it), mpi_inplace / mpi_oop (raw MPI_Allreduce on
buffers allocated once, in place / out of place).
"""

import argparse
import ctypes
import json
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import numpy as np
import tensorflow as tf

from timing import per_call, timed

tf.config.threading.set_intra_op_parallelism_threads(1)
tf.config.threading.set_inter_op_parallelism_threads(2)


CHAIN = 8  # allreduces in chain_temp's function


def load(framework: str):
    if framework == "horovod":
        import horovod.tensorflow as hvd
    else:
        import bluefog.tensorflow as hvd
    hvd.init()
    return hvd


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--framework", choices=["bluefog", "horovod"], required=True)
    p.add_argument("--mpi-lib", required=True, help="bench/mpi_allreduce.cc as a library")
    p.add_argument("--max-bytes", type=int, default=64 << 20)
    p.add_argument("--reps", type=int, default=7)
    p.add_argument("--budget", type=float, default=0.4, help="seconds per size and impl")
    args = p.parse_args()
    hvd = load(args.framework)
    lib = ctypes.CDLL(args.mpi_lib)
    lib.bench_mpi_allreduce.restype = ctypes.c_double
    lib.bench_mpi_allreduce.argtypes = [ctypes.c_longlong] * 3 + [ctypes.c_int]
    n, me = hvd.size(), hvd.rank()

    def raw(nbytes: int, out_of_place: bool):
        def run(iters: int) -> float:
            seconds = lib.bench_mpi_allreduce(nbytes, 1, iters, int(out_of_place))
            if seconds < 0:
                raise SystemExit("raw MPI_Allreduce failed")
            return seconds
        return run

    warm = tf.constant([1.0])
    for _ in range(200):
        hvd.allreduce(warm, op=hvd.Sum, name="bench.warm")
    sizes, b = [], 4
    while b <= args.max_bytes:
        sizes.append(b)
        b *= 4
    for nbytes in sizes:
        x = tf.fill([nbytes // 4], float(me + 1))
        got = hvd.allreduce(x, op=hvd.Sum, name=f"check.{nbytes}").numpy()
        assert np.all(got == n * (n + 1) / 2), f"wrong allreduce result at {nbytes} bytes"
        fn = tf.function(lambda t, nb=nbytes: hvd.allreduce(t, op=hvd.Sum, name=f"f.{nb}"))
        fn_temp = tf.function(
            lambda t, nb=nbytes: hvd.allreduce(t * 2.0, op=hvd.Sum, name=f"t.{nb}"))
        fn_scale = tf.function(lambda t: t * 2.0)
        fn_call = tf.function(lambda t: tf.shape(t))

        def chain(t, nb=nbytes, reduce=True):
            for i in range(CHAIN):
                t = t * 0.5
                if reduce:
                    t = hvd.allreduce(t, op=hvd.Sum, name=f"c{i}.{nb}")
            return t

        fn_chain = tf.function(chain)
        fn_chain_scale = tf.function(lambda t: chain(t, reduce=False))
        batches = {
            "eager": per_call(lambda x=x, nb=nbytes: hvd.allreduce(x, op=hvd.Sum,
                                                                    name=f"e.{nb}")),
            "function": per_call(lambda x=x, f=fn: f(x)),
            "function_temp": per_call(lambda x=x, f=fn_temp: f(x)),
            "scale": per_call(lambda x=x, f=fn_scale: f(x)),
            "call": per_call(lambda x=x, f=fn_call: f(x)),
            "chain_temp": per_call(lambda x=x, f=fn_chain: f(x)),
            "chain_scale": per_call(lambda x=x, f=fn_chain_scale: f(x)),
            "mpi_inplace": raw(nbytes, False),
            "mpi_oop": raw(nbytes, True),
        }
        # Past any warm-up or path choice of this size before timing: bluefog times two paths
        # per size class and kind of call for its first 48 calls (csrc/core/path_chooser.h),
        # and a training loop makes thousands; each framework's calls get the same warm-up.
        for name in ("eager", "function", "function_temp"):
            batches[name](64)
        batches["chain_temp"](64 // CHAIN)
        for impl, seconds in timed(hvd, batches, args.budget, args.reps).items():
            if me == 0:
                print(json.dumps({"framework": args.framework, "impl": impl, "bytes": nbytes,
                                  "median_s": seconds, "ranks": n}), flush=True)


if __name__ == "__main__":
    main()
