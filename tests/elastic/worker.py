"""A tiny elastic job for the driver tests (tests/python/test_elastic.py): no model, a counter.

Each step allreduces 1 (so a lost peer is noticed) and adds 1 to a variable; both the variable
and the step count are committed every --commit-every steps. After the job, every rank prints
its values: the variable must equal the number of steps on every rank, whatever launches and
resets happened (a lost commit or a rank left out of a sync would show as a wrong value).

--die-rank R --die-at N: in the first launch, rank R kills itself (SIGKILL) after step N.
--stop-at N: in the first launch, every rank exits with status 3 after step N (the whole job
lost, for the --state-dir restart test).
--bad-reset: the reset callback raises (a bug in the user's callback).
--quiet-after N: no STEP lines after step N (a job whose launcher writes nothing for a while).
"""

import argparse
import os
import signal
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import tensorflow as tf

import bluefog.tensorflow as bf

bf.init()
tf.config.threading.set_intra_op_parallelism_threads(1)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--commit-every", type=int, default=5)
    p.add_argument("--step-ms", type=float, default=100)
    p.add_argument("--die-rank", type=int)
    p.add_argument("--die-at", type=int)
    p.add_argument("--stop-at", type=int)
    p.add_argument("--bad-reset", action="store_true")
    p.add_argument("--quiet-after", type=int)
    args = p.parse_args()
    launch = int(os.environ.get("BLUEFOG_ELASTIC_RESTART", "0"))
    counter = tf.Variable(0.0)
    state = bf.elastic.TensorFlowState([counter], step=0)
    state.register_reset_callbacks([lambda: print(
        f"RESET launch {launch} size {bf.size()} step {state.step}", flush=True)
        if bf.rank() == 0 else None])
    if args.bad_reset:
        state.register_reset_callbacks([lambda: 1 / 0])

    @bf.elastic.run
    def train(state):
        while state.step < args.steps:
            n = bf.allreduce(tf.constant(1.0), average=False)
            counter.assign_add(1.0)
            state.step += 1
            if bf.rank() == 0 and (args.quiet_after is None or state.step <= args.quiet_after):
                print(f"STEP launch {launch} step {state.step} size {int(n)}", flush=True)
            if state.step % args.commit_every == 0:
                state.commit()
            if launch == 0 and bf.rank() == args.die_rank and state.step == args.die_at:
                print(f"DYING rank {bf.rank()} at {time.time():.3f}", flush=True)
                os.kill(os.getpid(), signal.SIGKILL)
            if launch == 0 and state.step == args.stop_at:
                sys.exit(3)
            time.sleep(args.step_ms / 1000)

    train(state)
    print(f"DONE rank {bf.rank()} size {bf.size()} step {state.step} counter "
          f"{float(counter.numpy()):.0f}", flush=True)


if __name__ == "__main__":
    main()
