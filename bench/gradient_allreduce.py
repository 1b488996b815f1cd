"""Where a training step's communication time goes: the allreduce of one model's gradients alone,
against what the memory of the machine allows.

Run under mpirun on every rank (bluefog's .venv); rank 0 prints one JSON line of milliseconds,
each the median over repetitions of the slowest rank's time, all kinds interleaved:

    mpirun -np 2 .venv/bin/python bench/gradient_allreduce.py --model resnet50 [--groups 4 8]

(the raw MPI library, build/bench/libmpi_allreduce.so, is built by `make bench` or
`make bench-horovod`, or by bench/run.py's build_mpi_baseline()).

- grouped: one grouped_allreduce (average) of tensors shaped like the model's gradients, each a
  temporary (g * 1.0, as a tape's gradients are) in a tf.function, the multiplications' own
  time subtracted: what DistributedGradientTape sends per step;
- one: the same bytes as one temporary tensor (the multiplication subtracted);
- grouped_large / one_large, grouped_small / one_small: the same two for the gradients of at
  least 1 MiB (each its own collective) and for the smaller ones (packed into one);
- mpi_inplace: raw in-place MPI_Allreduce of the same bytes (bench/mpi_allreduce.cc);
- copy / add: one thread of numpy copying the bytes, and adding two such arrays into a third:
  the memory traffic an allreduce cannot avoid (a rank reads its peers' part and writes every
  output) costs about that much here;
- with --groups: the training step (bench/fw_step.py's model and batch) with
  DistributedGradientTape(groups=G) for each G, G=0 (one grouped request), the compute-only
  step, and the compute-only step whose ranks meet once (a scalar allreduce after the
  gradients): whether splitting the request, so that the first gradients travel while the rest
  are still computed, shortens the step, and how much of a step's overhead is the ranks
  waiting for each other rather than moving gradients.
"""

import argparse
import ctypes
import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import numpy as np
import tensorflow as tf

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)

import bluefog.tensorflow as bf  # noqa: E402

from fw_step import model_and_batch, step_maker  # noqa: E402
from timing import interleaved  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="resnet50", choices=["resnet50", "mlp", "cnn"])
    p.add_argument("--mpi-lib", default=os.path.join(ROOT, "build", "bench",
                                                     "libmpi_allreduce.so"),
                   help="bench/mpi_allreduce.cc as a library")
    p.add_argument("--groups", type=int, nargs="*", default=[],
                   help="also time training steps with DistributedGradientTape(groups=G)")
    p.add_argument("--reps", type=int, default=7)
    p.add_argument("--calls", type=int, default=8, help="calls per timed batch")
    args = p.parse_args()
    bf.init()
    cores = os.cpu_count() or 1
    tf.config.threading.set_intra_op_parallelism_threads(max(1, cores // bf.local_size()))
    tf.config.threading.set_inter_op_parallelism_threads(2)
    import keras

    me = bf.rank()
    if not os.path.exists(args.mpi_lib):
        raise SystemExit(f"{args.mpi_lib} is missing: build it first (make bench-horovod, or "
                         "python -c 'import run; run.build_mpi_baseline()' in bench/)")
    lib = ctypes.CDLL(args.mpi_lib)
    lib.bench_mpi_allreduce.restype = ctypes.c_double
    lib.bench_mpi_allreduce.argtypes = [ctypes.c_longlong] * 3 + [ctypes.c_int]
    keras.utils.set_random_seed(me)
    model, shape = model_and_batch(args.model)
    grads = [tf.ones(v.shape) for v in model.trainable_variables]
    nbytes = sum(int(np.prod(v.shape)) * 4 for v in model.trainable_variables)
    a, b, c = (np.ones(nbytes // 4, np.float32) for _ in range(3))

    def pair(tensors: list, what: str) -> dict:
        """Callables timing `tensors` grouped and as one tensor, each with its multiplications
        alone. The tensors are captured and the results only waited for (control dependencies),
        as in a step whose gradients stay in the graph: a function taking and returning the
        214 tensors adds TensorFlow's own per-argument and per-output costs to both sides."""
        flat = tf.ones([sum(int(np.prod(t.shape)) for t in tensors)])

        def finished(outputs):
            with tf.control_dependencies(outputs):
                return tf.constant(0.0)

        grouped = tf.function(lambda: finished(bf.grouped_allreduce(
            [g * 1.0 for g in tensors], op=bf.Average, name=f"bench.grouped{what}")))
        grouped_scale = tf.function(lambda: finished([g * 1.0 for g in tensors]))
        one = tf.function(lambda: finished(
            [bf.allreduce(flat * 1.0, op=bf.Average, name=f"bench.one{what}")]))
        one_scale = tf.function(lambda: finished([flat * 1.0]))
        return {f"grouped{what}": lambda: grouped().numpy(),
                f"grouped{what}_scale": lambda: grouped_scale().numpy(),
                f"one{what}": lambda: one().numpy(),
                f"one{what}_scale": lambda: one_scale().numpy()}

    def raw() -> None:
        if lib.bench_mpi_allreduce(nbytes, 1, 1, 0) < 0:
            raise SystemExit("raw MPI_Allreduce failed")

    large = [g for g in grads if g.dtype.size * int(np.prod(g.shape)) >= 1 << 20]
    small = [g for g in grads if g.dtype.size * int(np.prod(g.shape)) < 1 << 20]
    kinds = pair(grads, "")
    for tensors, what in ((large, "_large"), (small, "_small")):
        if tensors and len(tensors) < len(grads):
            kinds.update(pair(tensors, what))
    kinds.update({"mpi_inplace": raw, "copy": lambda: np.copyto(b, a),
                  "add": lambda: np.add(a, b, out=c)})
    if args.groups:
        kinds.update(steps(model, shape, me, [0] + args.groups))
    # Past bluefog's path trials (48 calls per size class and kind) and the first page faults.
    for _ in range(60):
        for run in kinds.values():
            run()
    ms = {k: v * 1e3 for k, v in interleaved(bf, kinds, args.reps, args.calls).items()}
    row = {"model": args.model, "ranks": bf.size(), "tensors": len(grads), "bytes": nbytes,
           "large_tensors": len(large)}
    for what in ("", "_large", "_small"):
        if f"grouped{what}" in ms:
            row[f"grouped{what}_ms"] = ms.pop(f"grouped{what}") - ms.pop(f"grouped{what}_scale")
            row[f"one{what}_ms"] = ms.pop(f"one{what}") - ms.pop(f"one{what}_scale")
    row.update({f"{k}_ms": v for k, v in ms.items()})
    if me == 0:
        print(json.dumps({k: round(v, 2) if isinstance(v, float) else v
                          for k, v in row.items()}), flush=True)


def steps(model, shape, me: int, groups: list) -> dict:
    """Training steps (bench/fw_step.py's) with DistributedGradientTape(groups=G) for each G,
    the compute-only step and the compute-only step with one scalar allreduce, each a callable
    that makes one step and waits for it."""
    make = step_maker(model, shape, me)

    def meet(grads):  # the ranks meet once per step, with no gradient bytes
        with tf.control_dependencies(grads):
            return bf.allreduce(tf.constant(0.0), op=bf.Sum, name="bench.meet")

    def waited(step):
        return lambda: float(step())

    out = {f"step_groups_{g}": waited(make(lambda t, g=g: bf.DistributedGradientTape(t, groups=g)))
           for g in groups}
    out["step_compute_only"] = waited(make())
    out["step_compute_synced"] = waited(make(after=meet))
    return out


if __name__ == "__main__":
    main()
