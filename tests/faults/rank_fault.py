"""A training-like loop in which one rank fails mid-run; launched by tests/python/test_faults.py.

    mpirun -np 3 python tests/faults/rank_fault.py MODE [--victim 1] [--step 20]

Every rank runs named allreduces in a loop. At step --step, rank --victim fails in the way MODE
says; the other ranks carry on and must end with an error rather than wait forever:

    sigkill     os.kill(own pid, SIGKILL): killed from outside, no cleanup at all
    segfault    a real crash (reads address 0 through ctypes): SIGSEGV
    exit3       sys.exit(3): Python exits normally; atexit runs bluefog's shutdown
    exit0       sys.exit(0): as above, but a "successful" exit in the middle of training
    os_exit3    os._exit(3): exits at once, no atexit, no MPI_Finalize
    raise       an uncaught exception on the victim

The victim prints "FAULT <mode> rank <r> at <unix time>" just before failing, so the test can
measure how long the job takes to end. A survivor whose collective fails prints
"SURVIVOR rank <r> failed after <s> s: <message>" and re-raises.
"""

import argparse
import ctypes
import os
import signal
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import tensorflow as tf

tf.config.threading.set_intra_op_parallelism_threads(1)
tf.config.threading.set_inter_op_parallelism_threads(2)

import bluefog.tensorflow as bf  # noqa: E402


def fail(mode: str) -> None:
    if mode == "sigkill":
        os.kill(os.getpid(), signal.SIGKILL)
    elif mode == "segfault":
        ctypes.string_at(0)
    elif mode == "exit3":
        sys.exit(3)
    elif mode == "exit0":
        sys.exit(0)
    elif mode == "os_exit3":
        os._exit(3)
    elif mode == "raise":
        raise RuntimeError("the victim rank raised on purpose")
    elif mode == "none":
        return
    raise SystemExit(f"unknown mode {mode}")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("mode")
    p.add_argument("--victim", type=int, default=1)
    p.add_argument("--step", type=int, default=20)
    p.add_argument("--steps", type=int, default=100000)
    p.add_argument("--progress-every", type=int, default=0,
                   help="rank 0 prints 'PROGRESS step N' every N steps (0: never)")
    args = p.parse_args()
    bf.init()
    rank, size = bf.rank(), bf.size()
    x = tf.ones([16])
    for step in range(args.steps):
        if args.progress_every and rank == 0 and step % args.progress_every == 0:
            print(f"PROGRESS step {step} at {time.time():.3f}", flush=True)
        if step == args.step and rank == args.victim and args.mode != "none":
            print(f"FAULT {args.mode} rank {rank} at {time.time():.3f}", flush=True)
            fail(args.mode)
        t0 = time.time()
        try:
            y = bf.allreduce(x, average=False, name=f"step.{step}")
        except Exception as e:
            print(f"SURVIVOR rank {rank} failed after {time.time() - t0:.1f} s: "
                  f"{type(e).__name__}: {str(e).strip()[:400]}", flush=True)
            raise
        assert float(y[0]) == size, (step, y)
        time.sleep(0.005)
    print(f"rank {rank} finished all {args.steps} steps", flush=True)


if __name__ == "__main__":
    main()
