"""Fuzz cases for the APIs that keep state between calls: windows, process sets, join,
alltoall/reducescatter splits and elastic states. Each case leaves the job as it found it (its
windows freed, its process sets removed, every rank joined), so the next case starts clean.

Misuse must fail clearly on every rank; valid sequences must give the right value. Drawn by
fuzz_cases.make_case; every rank draws the same case from the shared seed.
"""

from __future__ import annotations

import os
import pickle
import shutil
import tempfile

import numpy as np
import tensorflow as tf

STATE_KINDS = ("window_bad", "window_valid", "window_mutex_bad", "process_set_bad",
               "process_set_cycle", "join_reduce", "splits_bad", "elastic_bad",
               "elastic_valid")


def _bf():
    import bluefog.tensorflow as bf
    return bf


class _Window:
    """A window that exists for one case: created on entry, freed on exit on every rank (also
    when the body raised, so that a refused call does not leave it behind)."""

    def __init__(self, name, value, zero_init=False):
        self.name, self.value, self.zero_init = name, value, zero_init

    def __enter__(self):
        _bf().win_create(self.value, self.name, zero_init=self.zero_init)
        return self

    def __exit__(self, *exc):
        bf = _bf()
        bf.barrier()
        bf.win_free(self.name)
        return False


def make_state_case(kind: str, rng, index: int, size: int):
    from fuzz_cases import Case, small  # fuzz_cases imports this module

    base_seed = int(rng.integers(2 ** 31))
    name = f"fuzz.state.{index}"

    if kind == "window_bad":
        # Misuse that every rank commits alike, on an existing window or on none.
        variant = int(rng.integers(10))
        weight = [float("nan"), float("inf"), -float("inf")][int(rng.integers(3))]

        def run(rank, size):
            bf = _bf()
            x = small([3], tf.float32, base_seed + rank)
            if variant == 0:
                return bf.win_put(x, "fuzz.no.such.window")
            if variant == 1:
                return bf.win_update("fuzz.no.such.window")
            if variant == 2:
                return bf.win_free("fuzz.no.such.window")
            if variant == 3:
                return bf.win_create(x, ["not", "a", "name"])
            with _Window(name, x):
                if variant == 4:  # a put weight that is not a finite number
                    return bf.win_put(x, name, dst_weights={r: weight
                                                            for r in bf.out_neighbor_ranks()}
                                      or {(rank + 1) % size: weight})
                if variant == 5:
                    return bf.win_accumulate(x, name, self_weight=weight)
                if variant == 6:  # a target outside the job
                    return bf.win_put(x, name, dst_weights={size + 2: 1.0})
                if variant == 7:  # another shape than the window's
                    return bf.win_put(small([4], tf.float32, base_seed), name)
                if variant == 8:
                    return bf.win_update(name, self_weight=weight, neighbor_weights={
                        r: 0.5 for r in bf.in_neighbor_ranks()})
                return bf.win_create(x, name)  # the name exists already
        return Case(kind, run, "error", f"window misuse variant {variant} (weight {weight})",
                    eager_only=True)

    if kind == "window_valid":
        # Every rank puts its value to its out-neighbours (weight w) into buffers that start at
        # zero, then reads x + w * sum of its in-neighbours' values.
        w = [1.0, 0.5, 0.25][int(rng.integers(3))]
        accumulate = bool(rng.integers(2))
        mutex = bool(rng.integers(2))

        def run(rank, size):
            bf = _bf()
            x = small([2, 3], tf.float64, base_seed + rank)
            with _Window(name, x, zero_init=True):
                dst = {r: w for r in bf.out_neighbor_ranks()}
                put = bf.win_accumulate if accumulate else bf.win_put
                put(x, name, dst_weights=dst, require_mutex=mutex)
                bf.barrier()
                out = bf.win_update(name, self_weight=1.0,
                                    neighbor_weights={r: 1.0 for r in bf.in_neighbor_ranks()},
                                    require_mutex=mutex)
                return out.numpy()

        def expect(rank, size):
            bf = _bf()
            mine = small([2, 3], tf.float64, base_seed + rank)
            got = sum(w * small([2, 3], tf.float64, base_seed + r)
                      for r in bf.in_neighbor_ranks())
            return mine + got
        return Case(kind, run, expect,
                    f"{'win_accumulate' if accumulate else 'win_put'} w={w} mutex={mutex}",
                    eager_only=True)

    if kind == "window_mutex_bad":
        # Asking again for a mutex this rank holds is an error; afterwards the mutex must still
        # be held until the block ends, and free after it (a put with require_mutex succeeds).
        variant = int(rng.integers(3))
        outside = [size + 1, -1, 2 ** 40][int(rng.integers(3))]

        def run(rank, size):
            bf = _bf()
            x = small([2], tf.float32, base_seed + rank)
            with _Window(name, x):
                if variant == 0:  # a rank outside the job
                    with bf.win_mutex(name, ranks=[outside]):
                        return None
                try:
                    if variant == 1:
                        with bf.win_mutex(name, for_self=True):
                            bf.win_update(name, require_mutex=True)
                    else:
                        with bf.win_mutex(name):
                            bf.win_put(x, name, require_mutex=True)
                    refused = None
                except Exception as e:  # the refusal, checked for clarity below
                    refused = e
                # Whatever happened inside, every mutex is free again now.
                bf.barrier()
                bf.win_put(x, name, require_mutex=True)
                bf.win_update(name, require_mutex=True)
                if refused is None and (variant == 1 or bf.out_neighbor_ranks()):
                    raise AssertionError("the second request for a held mutex was not refused")
                if refused is not None:
                    raise refused
                return None
        expect = "error" if (variant == 0 or variant == 1 or size > 1) else (
            lambda rank, size: None)
        return Case(kind, run, expect, f"win_mutex misuse variant {variant} ({outside})",
                    eager_only=True)

    if kind == "process_set_bad":
        variant = int(rng.integers(8))
        bad = [[size], [-1], [1.0], [0.7], ["1"], [], [[0]], [None]][variant]

        def run(rank, size):
            bf = _bf()
            return bf.add_process_set(bad)
        return Case(kind, run, "error", f"add_process_set({bad!r})", eager_only=True)

    if kind == "process_set_cycle":
        # Register a random subset, run one collective on it (members only), remove it. A set
        # may repeat an earlier one: registering it again after removal is allowed.
        members = sorted(int(r) for r in rng.choice(size, int(rng.integers(1, size + 1)),
                                                    replace=False))
        op = ["allreduce", "allgather", "broadcast"][int(rng.integers(3))]

        def run(rank, size):
            bf = _bf()
            ps = bf.add_process_set(members)
            try:
                if rank not in members:
                    return None
                x = small([3], tf.int32, base_seed + rank)
                if op == "allreduce":
                    out = bf.allreduce(x, average=False, name=name, process_set=ps)
                elif op == "allgather":
                    out = bf.allgather(x, name=name, process_set=ps)
                else:
                    out = bf.broadcast(x, root_rank=members[-1], name=name, process_set=ps)
                return out.numpy()
            finally:
                bf.remove_process_set(ps)

        def expect(rank, size):
            if rank not in members:
                return None
            xs = [small([3], tf.int32, base_seed + r) for r in members]
            if op == "allreduce":
                return np.sum(xs, axis=0)
            if op == "allgather":
                return np.concatenate(xs)
            return xs[-1]
        return Case(kind, run, expect, f"process set {members} {op}", eager_only=True)

    if kind == "join_reduce":
        # Some ranks join at once; the others reduce and then join. The joined ranks stand in
        # with the reduction's identity; an average still divides by size().
        joined = sorted(int(r) for r in rng.choice(size, int(rng.integers(0, size + 1)),
                                                   replace=False))
        rop = ["sum", "average", "min", "max", "product"][int(rng.integers(5))]
        dtype = [tf.float32, tf.float64, tf.int32, tf.int64][int(rng.integers(4))]
        active = [r for r in range(size) if r not in joined]

        def run(rank, size):
            bf = _bf()
            out = None
            if rank not in joined:
                x = small([2], dtype, base_seed + rank)
                out = bf.allreduce(x, op=getattr(bf, rop.capitalize()), name=name).numpy()
            last = int(bf.join())
            if not 0 <= last < size or (active and last not in active):
                raise AssertionError(f"join() returned {last}; ranks still active: {active}")
            return out

        def expect(rank, size):
            if rank in joined:
                return None
            xs = np.stack([small([2], dtype, base_seed + r).astype(np.float64) for r in active])
            if rop == "average":
                out = xs.sum(axis=0) / size
                return np.trunc(out) if dtype.is_integer else out
            return {"sum": np.sum, "min": np.min, "max": np.max,
                    "product": np.prod}[rop](xs, axis=0)
        return Case(kind, run, expect, f"join {joined} then {rop} {dtype.name}",
                    eager_only=True)

    if kind == "splits_bad":
        # Splits that every rank gets wrong alike, inside a tf.function or not: negative ones,
        # ones whose int64 sum wraps around to the row count, the wrong number of them.
        variant = int(rng.integers(5))
        rows = size + 1

        def splits_for(size):
            if variant == 0:
                return [-1, rows + 1] + [0] * (size - 2) if size > 1 else [-1]
            if variant == 1 and size >= 3:
                return [2 ** 63 - 1, 2 ** 63 - 1, rows + 2] + [0] * (size - 3)
            if variant == 1:
                return [rows + 2 ** 62] + [0] * (size - 1)
            if variant == 2:
                return [rows] + [0] * size
            if variant == 3:
                return [1.5] * size
            return [[rows]] + [[0]] * (size - 1)

        def run(rank, size):
            bf = _bf()
            x = small([rows, 2], tf.float32, base_seed + rank)
            return bf.alltoall(x, splits=tf.constant(splits_for(size), tf.int64)
                               if variant in (0, 1) else splits_for(size), name=name)
        return Case(kind, run, "error", f"alltoall splits variant {variant}")

    if kind == "elastic_bad":
        variant = int(rng.integers(6))

        def run(rank, size):
            bf = _bf()
            from bluefog.tensorflow import elastic
            if variant == 0:
                return elastic.ObjectState(commit=1)  # a method's name
            if variant == 1:
                return elastic.TensorFlowState([tf.constant(1.0)])
            if variant == 2:
                return elastic.ObjectState(epoch=0).restore()
            if variant == 3:
                return elastic.ObjectState(epoch=0).register_reset_callbacks([5])
            # A commit on the host's disk that does not fit the state: scalars in the other
            # order (4: every rank must refuse it alike), or not a commit at all (5: ignored
            # with a warning).
            folder = _shared_folder(bf, name)
            os.environ["BLUEFOG_ELASTIC_STATE_DIR"] = folder
            try:
                v = [tf.Variable(0.001, dtype=tf.float32), tf.Variable(120, dtype=tf.int64)]
                state = elastic.TensorFlowState(v, epoch=0)
                if bf.local_rank() == 0:
                    os.makedirs(folder, exist_ok=True)
                    with open(state._store.path, "wb") as f:
                        if variant == 4:
                            pickle.dump({"format": 1, "commit": 5,
                                         "values": [np.array(120, np.int64),
                                                    np.array(0.001, np.float32)],
                                         "attrs": {"epoch": 3}}, f)
                        else:
                            f.write(b"\x80\x04not a pickle at all")
                bf.barrier()
                state.sync()
                if variant == 5:  # an unreadable file is ignored with a warning: fine
                    return np.array([float(v[0].numpy()), float(v[1].numpy())])
                return None
            finally:
                os.environ.pop("BLUEFOG_ELASTIC_STATE_DIR", None)
                bf.barrier()
                if bf.local_rank() == 0:
                    shutil.rmtree(folder, ignore_errors=True)
        if variant == 5:
            return Case(kind, run, lambda rank, size: np.array([0.001, 120.0]),
                        "elastic sync over an unreadable commit", eager_only=True)
        return Case(kind, run, "error", f"elastic misuse variant {variant}", eager_only=True)

    # elastic_valid: commit, change, restore; sync takes the newest commit everywhere.
    steps = int(rng.integers(1, 4))

    def run(rank, size):
        from bluefog.tensorflow import elastic
        v = tf.Variable(small([3], tf.float64, base_seed + rank))
        state = elastic.TensorFlowState([v], step=0)
        state.sync()  # everyone takes rank 0's values
        for k in range(steps):
            v.assign_add(tf.ones([3], tf.float64))
            state.step = k + 1
            state.commit()
        v.assign(tf.zeros([3], tf.float64) - 99)
        state.step = -1
        state.restore()
        return np.concatenate([v.numpy(), [state.step, state.commits]])

    def expect(rank, size):
        return np.concatenate([small([3], tf.float64, base_seed) + steps, [steps, steps]])
    return Case(kind, run, expect, f"elastic commit x{steps} then restore", eager_only=True)


def _shared_folder(bf, name: str) -> str:
    """A folder every rank of this host names alike (rank 0's choice, broadcast)."""
    folder = tempfile.mkdtemp(prefix="bluefog-fuzz-") if bf.rank() == 0 else None
    return str(bf.broadcast_object(folder, root_rank=0, name=f"{name}.folder"))
