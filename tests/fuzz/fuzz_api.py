"""Seeded fuzzer of bluefog's public TensorFlow API with bad and odd input, run under mpirun.

    mpirun -np 3 .venv/bin/python tests/fuzz/fuzz_api.py --cases 300 --seed 7
    mpirun -np 3 .venv/bin/python tests/fuzz/fuzz_api.py --family state --cases 200

Every rank draws the same cases from the shared seed (per-rank differences are functions of the
rank drawn from that stream), so the ranks stay in step. A case is one call of a public function
(allreduce, grouped_allreduce, allgather, broadcast, neighbor_allreduce, neighbor_allgather)
with arguments that are either (the stateless cases; --family state draws sequences on the
stateful APIs instead, see fuzz_state_cases.py: windows and their mutexes, process sets, join,
alltoall splits, elastic states)

* invalid the same way on every rank (wrong types, odd names, huge/negative/non-int root ranks,
  non-tensor inputs, unsupported dtypes, scalars to allgather, bad neighbour lists and weights):
  every rank must raise a clear exception;
* valid on every rank but inconsistent between ranks (shapes, dtypes, root ranks, operations,
  neighbour lists that do not mirror each other): every rank must raise, naming the
  disagreement;
* valid and consistent but odd (names with spaces, NUL bytes, non-ASCII or 10,000 characters;
  Python lists and numpy arrays instead of tensors; zero-sized tensors; infinities): every rank
  must return the right value.

A clear exception is a TypeError, ValueError, NotImplementedError, bluefog's BluefogError or a
tf.errors.OpError whose message names bluefog. After every case all ranks run a check-up
collective that gathers each rank's outcome, so a rank that succeeded where another raised, or a
runtime left broken by the bad call, is caught at once. A watchdog ends the process when a case
takes longer than --case-timeout seconds, so a hang fails instead of blocking. Exit status 0 when
every case behaved; rank 0 prints "FUZZ SUMMARY {json}" with the number of cases that raised a
clear exception on every rank and of those that gave the right value on every rank.

Some bad input cannot fail on every rank: when only some ranks pass arguments that are invalid
locally (e.g. one rank passes root_rank=-1), those ranks raise at once and the others submit
and wait for them. Those cases are not drawn here (see BLUEFOG_STALL_SHUTDOWN_TIME).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
import traceback

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np
import tensorflow as tf
from fuzz_cases import CLEAR_TYPES, Case, make_case

# ------------------------------------------------------------------------------- checking


def is_clear(e: BaseException, bf) -> bool:
    """Whether `e` is an exception a user can act on: an argument error (TypeError, ValueError,
    NotImplementedError), BluefogError or a TF op error, whose message comes from bluefog (names
    bluefog and so the call and tensor), not a bare error from deep inside Python or TF."""
    if not isinstance(e, CLEAR_TYPES + (bf.BluefogError, tf.errors.OpError)):
        return False
    return "bluefog" in str(e).lower()


def is_clear_for(case: Case, e: BaseException, bf) -> bool:
    # A device string is handed to tf.device: TensorFlow's own error names the bad device.
    if case.kind == "bad_device" and isinstance(e, (ValueError, tf.errors.InvalidArgumentError)):
        return "device" in str(e)
    return is_clear(e, bf)


def same_value(got, want) -> bool:
    if isinstance(want, list):
        return (isinstance(got, (list, tuple)) and len(got) == len(want) and
                all(same_value(g, w) for g, w in zip(got, want)))
    if want is None:
        return got is None
    g = np.asarray(got.numpy() if hasattr(got, "numpy") else got)
    w = np.asarray(want)
    if g.shape != w.shape:
        return False
    if g.dtype == np.bool_:
        return np.array_equal(g, w)
    return np.allclose(g.astype(np.float64), w.astype(np.float64), rtol=1e-2, atol=1e-2,
                       equal_nan=True)


OUTCOME_OK, OUTCOME_ERROR = 1, 2


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description="bluefog API fuzzer (run under mpirun)")
    p.add_argument("--cases", type=int, default=300)
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--function-fraction", type=float, default=0.15,
                   help="fraction of cases also wrapped in a tf.function")
    p.add_argument("--case-timeout", type=float, default=60.0)
    p.add_argument("--family", choices=["api", "state", "all"], default="api",
                   help="which cases to draw: the stateless API, the stateful one (windows, "
                        "process sets, join, splits, elastic states) or both")
    p.add_argument("--verbose", action="store_true", help="rank 0 prints every case's outcome")
    args = p.parse_args(argv)
    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(2)
    tf.get_logger().setLevel("ERROR")
    import bluefog.tensorflow as bf
    bf.init()
    rank, size = bf.rank(), bf.size()

    current = {"case": "init", "since": time.monotonic()}

    def watchdog():
        while True:
            time.sleep(0.5)
            if time.monotonic() - current["since"] > args.case_timeout:
                print(f"FUZZ rank {rank}: HANG: {current['case']} did not finish within "
                      f"{args.case_timeout:.0f} s", file=sys.stderr, flush=True)
                os._exit(4)
    threading.Thread(target=watchdog, daemon=True).start()

    rng = np.random.default_rng(args.seed)
    failures, counts, unclear = [], {}, []
    clear_everywhere = right_everywhere = 0
    t0 = time.monotonic()
    for i in range(args.cases):
        case = make_case(rng, i, size, args.family)
        in_function = rng.random() < args.function_fraction and not case.eager_only
        label = f"case {i} [{case.kind}{' in tf.function' if in_function else ''}] {case.detail}"
        current.update(case=label, since=time.monotonic())
        counts[case.kind] = counts.get(case.kind, 0) + 1
        outcome, got, error = OUTCOME_OK, None, None
        try:
            if in_function:
                got = tf.function(lambda: case.run(rank, size))()  # noqa: B023 - called at once
            else:
                got = case.run(rank, size)
            if isinstance(got, (list, tuple)):
                got = [g.numpy() if hasattr(g, "numpy") else g for g in got]
            elif hasattr(got, "numpy"):
                got = got.numpy()
        except Exception as e:  # every exception is examined below
            outcome, error = OUTCOME_ERROR, e
        problem = None
        if case.expect == "error":
            if outcome == OUTCOME_OK:
                problem = "expected an exception, got a result"
            elif not is_clear_for(case, error, bf):
                problem = f"unclear exception {type(error).__name__}: {str(error)[:300]}"
        elif outcome == OUTCOME_ERROR and case.may_raise:
            if not is_clear_for(case, error, bf):
                problem = f"unclear exception {type(error).__name__}: {str(error)[:300]}"
        elif outcome == OUTCOME_ERROR:
            problem = f"unexpected {type(error).__name__}: {str(error)[:300]}"
        elif not same_value(got, case.expect(rank, size)):
            problem = f"wrong result {str(got)[:200]}"
        # Check-up: every rank's outcome, through a fresh collective that must still work.
        try:
            rows = bf.allgather(tf.constant([[outcome, int(problem is not None)]], tf.int32),
                                name=f"fuzz.checkup.{i}").numpy()
            outcomes, anyone_wrong = rows[:, 0].tolist(), bool(rows[:, 1].any())
        except Exception as e:
            problem = (problem or "") + f"; check-up collective failed: {e}"[:300]
            outcomes, anyone_wrong = [outcome] * size, True
        if len(set(outcomes)) != 1:
            problem = (problem or "") + f"; ranks disagree on the outcome: {outcomes}"
        elif not anyone_wrong:
            clear_everywhere += outcomes[0] == OUTCOME_ERROR
            right_everywhere += outcomes[0] == OUTCOME_OK
        if args.verbose and rank == 0:
            what = (f"{type(error).__name__}: {str(error)[:160]!r}" if error is not None
                    else "ok")
            print(f"FUZZ {label[:120]} -> {what}", flush=True)
        if problem:
            failures.append(f"{label}: {problem}")
            if error is not None and "unclear" in problem:
                unclear.append(label)
                traceback.print_exception(type(error), error, error.__traceback__, limit=6)
    wall = time.monotonic() - t0
    current.update(case="summary", since=time.monotonic())
    n_fail = int(bf.allreduce(tf.constant(len(failures)), average=False,
                              name="fuzz.failures").numpy())
    for f in failures[:50]:
        print(f"FUZZ rank {rank}: FAIL {f}", file=sys.stderr, flush=True)
    if rank == 0:
        print("FUZZ SUMMARY " + json.dumps({
            "ok": n_fail == 0, "size": size, "cases": args.cases, "seed": args.seed,
            "family": args.family, "failures_all_ranks": n_fail,
            "clear_error_on_every_rank": clear_everywhere,
            "right_value_on_every_rank": right_everywhere,
            "wall_s": round(wall, 1), "by_kind": counts}),
            flush=True)
    return 0 if n_fail == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
