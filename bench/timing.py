"""The interleaved timing the benchmarks here share, for bluefog or Horovod alike (`hvd` is
either module: only allreduce and allgather are used).

Each kind of call is timed in batches; before every batch the ranks meet (a scalar allreduce),
and a batch counts as its slowest rank's time, so every number is what the job as a whole
waited. Batches of all kinds alternate repetition by repetition, so that a change in the
machine's state during a run touches every kind alike (the machines these run on are shared and
noisy: compare kinds within one run, as ratios).
"""

import random
import time

import numpy as np
import tensorflow as tf


def slowest(hvd, seconds: float) -> float:
    """The largest of every rank's `seconds`."""
    return float(tf.reduce_max(hvd.allgather(tf.constant([seconds]), name="bench.max")))


def barrier(hvd) -> None:
    hvd.allreduce(tf.constant(0.0), op=hvd.Sum, name="bench.barrier")


def per_call(step):
    """A batch runner for a callable: (iterations) -> this rank's seconds for them."""
    def run(iters: int) -> float:
        t0 = time.perf_counter()
        for _ in range(iters):
            step()
        return time.perf_counter() - t0
    return run


def timed(hvd, batches: dict, budget: float, reps: int, max_iters: int = 20000) -> dict:
    """Median seconds per call of each batch runner ((iterations) -> seconds), `reps` batches
    each of about budget / reps seconds, in a fresh order every repetition (the same on every
    rank): a batch runs slower after some others (their buffers in cache instead of its own),
    so none always follows the same one. Every rank derives the same iteration counts, from the
    slowest rank's estimate, so the collectives inside stay matched."""
    iters = {}
    for name, run in batches.items():
        run(3)
        one = slowest(hvd, run(2) / 2)
        iters[name] = max(1, min(max_iters, int(budget / reps / max(one, 1e-7))))
    samples = {name: [] for name in batches}
    for rep in range(reps):
        order = list(batches)
        random.Random(rep).shuffle(order)
        for name in order:
            barrier(hvd)
            samples[name].append(slowest(hvd, batches[name](iters[name]) / iters[name]))
    return {name: float(np.median(v)) for name, v in samples.items()}


def interleaved(hvd, steps: dict, reps: int, calls: int) -> dict:
    """Median seconds per call of each step (a callable), `reps` batches of `calls` calls each,
    the steps in turn within every repetition."""
    return interleaved_batches(hvd, {name: per_call(step) for name, step in steps.items()}, reps,
                               calls)


def interleaved_batches(hvd, batches: dict, reps: int, calls: int) -> dict:
    """interleaved() for batch runners ((iterations) -> seconds, e.g. core_switched's)."""
    samples = {name: [] for name in batches}
    for _ in range(reps):
        for name, run in batches.items():
            barrier(hvd)
            samples[name].append(slowest(hvd, run(calls) / calls))
    return {name: float(np.median(v)) for name, v in samples.items()}


def core_switched(run, off, on):
    """A batch runner with one of the core's switches off for the batch (`off()` before it,
    `on()` after): the same process, so the two ways are interleaved."""
    def batch(iters: int) -> float:
        off()
        try:
            return run(iters)
        finally:
            on()
    return batch
