"""How much of a training step's communication hides behind its compute.

Run on every rank under mpirun (bluefog's .venv); in one process per rank, batches of every kind
interleaved, block by block:

- step: bench/fw_step.py's tf.function step with ``DistributedGradientTape`` (one per tape
  variant, ``--variants``);
- compute: the same step with a plain tape, no communication;
- comm: the same gradients' averaging alone, through the same call path: a tape recorded over
  ``sum(v * g)`` for the model's variables ``v`` and gradients ``g`` of one real step, so
  ``DistributedGradientTape.gradient`` returns ``g``'s average as in the step; minus the same
  function with a plain tape (the gradient's own multiplications).

Rank 0 prints one JSON line per model and variant: the medians (seconds, each batch its slowest
rank's time) and, per block, ``step / max(compute, comm)`` (1.0: the communication hides
entirely behind the compute) and ``step / (compute + comm)`` (1.0: nothing overlaps), medians
over the blocks, so the machine's drift within a launch cancels.

    mpirun -np 2 .venv/bin/python bench/step_overlap.py --models mlp resnet50 \
        --variants default bucket=262144

A variant is ``default``, comma-separated ``key=value`` keyword arguments of
``DistributedGradientTape`` (integers), e.g. ``groups=4``, or ``buckets=B[:F]``: the gradients
in backward order (the last variables' first), cut into grouped allreduces that each close once
they hold B bytes (the first F, default B / 4), each sent as soon as its own gradients exist.
"""

import argparse
import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import numpy as np
import tensorflow as tf

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fw_step import load, model_and_batch, step_maker  # noqa: E402
from timing import barrier, per_call, slowest  # noqa: E402


def bucket_caps(variant: str):
    """(B, F) of a ``buckets=B[:F]`` variant, else None."""
    if not variant.startswith("buckets="):
        return None
    first, _, rest = variant[len("buckets="):].partition(":")
    cap = int(first)
    return cap, int(rest) if rest else max(1, cap // 4)


def bucketed_average(bf, grads: list, caps, name: str) -> list:
    """The average of `grads` over ranks as grouped allreduces of consecutive gradients in
    backward order (reversed), each closed once it holds caps[1] bytes (the first) or
    caps[0] (the others)."""
    order = [j for j in reversed(range(len(grads))) if grads[j] is not None]
    buckets, size = [[]], 0
    for j in order:
        if size >= (caps[1] if len(buckets) == 1 else caps[0]):
            buckets.append([])  # a bucket closes once it holds its cap, as DDP's
            size = 0
        buckets[-1].append(j)
        size += grads[j].shape.num_elements() * grads[j].dtype.size
    out = list(grads)
    for i, bucket in enumerate(buckets):
        reduced = bf.grouped_allreduce([grads[j] for j in bucket], op=bf.Average,
                                       name=f"{name}.b{i}")
        for j, r in zip(bucket, reduced):
            out[j] = r
    return out


class BucketTape:
    """A tape whose gradient() averages through bucketed_average."""

    def __init__(self, bf, tape, caps, name):
        self.bf, self.tape, self.caps, self.name = bf, tape, caps, name

    def gradient(self, loss, sources):
        return bucketed_average(self.bf, self.tape.gradient(loss, sources), self.caps,
                                self.name)


def wrapper(bf, variant: str, name: str):
    """(tape) -> the tape `variant` takes the gradients from."""
    caps = bucket_caps(variant)
    if caps is not None:
        return lambda t: BucketTape(bf, t, caps, name)
    kwargs = tape_kwargs(variant)
    return lambda t: bf.DistributedGradientTape(t, **kwargs)


def tape_kwargs(variant: str) -> dict:
    if variant == "default":
        return {}
    out = {}
    for item in variant.split(","):
        key, _, value = item.partition("=")
        out[key] = int(value)
    return out


def comm_only(bf, model, grads, wrap_tape):
    """(averaging of `grads` through DistributedGradientTape, the same with a plain tape): two
    tf.functions that return a scalar once every gradient is there."""
    variables = model.trainable_variables

    def make(wrap):
        @tf.function
        def run():
            with tf.GradientTape() as tape:
                loss = tf.add_n([tf.reduce_sum(v * g) for v, g in zip(variables, grads)])
            if wrap:
                tape = wrap_tape(tape)
            out = tape.gradient(loss, variables)
            with tf.control_dependencies(out):
                return tf.constant(0.0)
        return run

    return make(True), make(False)


def bench(bf, keras, name: str, variants: list, steps: int, blocks: int, warmup: int) -> list:
    me = bf.rank()
    keras.utils.set_random_seed(me)
    model, shape = model_and_batch(name)
    make_step = step_maker(model, shape, me)
    compute = make_step()
    dist = {v: make_step(wrapper(bf, v, f"bench.step{i}")) for i, v in enumerate(variants)}
    for step in dist.values():
        step()  # builds the optimizer's slots, so the broadcast covers them
    bf.broadcast_variables(model.variables, root_rank=0)
    with tf.GradientTape() as tape:
        loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)(
            tf.zeros([shape[0]], tf.int64), model(tf.ones(shape), training=True))
    grads = [tf.identity(g) for g in tape.gradient(loss, model.trainable_variables)]
    comm = {v: comm_only(bf, model, grads, wrapper(bf, v, f"bench.comm{i}"))
            for i, v in enumerate(variants)}
    kinds = {"compute": per_call(lambda: float(compute()))}
    for v in variants:
        kinds[f"step {v}"] = per_call(lambda s=dist[v]: float(s()))
        kinds[f"comm {v}"] = per_call(lambda f=comm[v][0]: float(f()))
        kinds[f"scale {v}"] = per_call(lambda f=comm[v][1]: float(f()))
    # bluefog times two paths for the first 48 calls of each size class: the comm kinds, cheap,
    # take the trials for the steps, which send the same sizes.
    for v in variants:
        for f in comm[v]:
            for _ in range(60):
                f()
    for _ in range(warmup):
        for run in kinds.values():
            run(1)
    comm_steps = max(steps, 8)
    times = {k: [] for k in kinds}
    for block in range(blocks):
        order = list(kinds) if block % 2 == 0 else list(reversed(kinds))
        for k in order:
            n = comm_steps if k.startswith(("comm", "scale")) else steps
            barrier(bf)
            times[k].append(slowest(bf, kinds[k](n) / n))
    rows = []
    for v in variants:
        step, cpu = np.array(times[f"step {v}"]), np.array(times["compute"])
        com = np.maximum(np.array(times[f"comm {v}"]) - np.array(times[f"scale {v}"]), 0.0)
        rows.append({
            "model": name, "ranks": bf.size(), "variant": v,
            "step_s": float(np.median(step)), "compute_s": float(np.median(cpu)),
            "comm_s": float(np.median(com)),
            "overhead": float(np.median(step / cpu)) - 1,
            "step_over_max": float(np.median(step / np.maximum(cpu, com))),
            "step_over_sum": float(np.median(step / (cpu + com)))})
    return rows


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--models", nargs="+", default=["mlp", "resnet50"])
    p.add_argument("--variants", nargs="+", default=["default"])
    p.add_argument("--steps", type=int, default=3, help="steps per timed block")
    p.add_argument("--blocks", type=int, default=10, help="timed blocks of each kind")
    p.add_argument("--warmup", type=int, default=5, help="untimed batches of each kind first")
    args = p.parse_args()
    bf = load("bluefog")
    import keras

    for name in args.models:
        for row in bench(bf, keras, name, args.variants, args.steps, args.blocks, args.warmup):
            if bf.rank() == 0:
                print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
