"""A tiny in-place elastic job (tests/python/test_elastic_inplace.py): no model, a counter.

Each step allreduces 1 (so a lost peer is noticed) and adds 1 to a variable; the variable and
the step are committed every --commit-every steps. At the end every worker prints its values:
the variable must equal the number of steps on every rank whatever failures happened (a lost
commit, or a rank left out of a sync, would show as a wrong value).

--die W:S:WHERE (repeatable): worker W (BLUEFOG_ELASTIC_WORKER) kills itself with SIGKILL at
step S, WHERE being "step" (after the step's allreduce, while the others go on to the next
one) or "commit" (just before the commit of step S, which the others are then inside).
--steps-of W:S: worker W trains only S steps (an uneven shard): its training function
returns while the others still train.
--die W:N:sync: worker W kills itself inside the first state sync of a round of N ranks in
which it sends the state (the root), after the variables went out and before the attributes
(the step) do: the others, a joining worker among them, are then inside the sync's broadcasts.
"""

import argparse
import os
import signal
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import tensorflow as tf  # noqa: E402

import bluefog.tensorflow as bf  # noqa: E402

bf.init()
tf.config.threading.set_intra_op_parallelism_threads(1)
tf.config.threading.set_inter_op_parallelism_threads(1)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--commit-every", type=int, default=5)
    p.add_argument("--step-ms", type=float, default=30)
    p.add_argument("--die", action="append", default=[])
    p.add_argument("--steps-of", action="append", default=[])
    p.add_argument("--graph", action="store_true",
                   help="the step's allreduce inside a tf.function (a lost rank then surfaces "
                        "as TensorFlow's 'Graph execution error')")
    args = p.parse_args()
    me = os.environ.get("BLUEFOG_ELASTIC_WORKER", "")
    deaths = {}
    for d in args.die:
        w, s, where = d.split(":")
        if w == me:
            deaths[(int(s), where)] = True
    steps = dict(w.split(":") for w in args.steps_of).get(me, args.steps)
    steps = int(steps)
    print(f"START worker {me} pid {os.getpid()}", flush=True)
    counter = tf.Variable(0.0)

    class State(bf.elastic.TensorFlowState):
        in_sync = False

        def sync(self):
            self.in_sync = True
            try:
                super().sync()
            finally:
                self.in_sync = False

        def _attrs(self):
            # Inside a sync, the root calls this between broadcasting the variables and the
            # attributes; every rank calls it again when saving the synced state at the end.
            if self.in_sync:
                die(bf.size(), "sync")
            return super()._attrs()

    state = State([counter], step=0)
    state.register_reset_callbacks([lambda: print(
        f"RESET size {bf.size()} step {state.step} t={time.time():.3f}", flush=True)
        if bf.rank() == 0 else None])

    def die(step, where):
        if deaths.get((step, where)):
            at = f"in a sync at size {step}" if where == "sync" else f"at step {step} ({where})"
            print(f"DYING worker {me} {at} t={time.time():.3f}", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)

    def count():
        return bf.allreduce(tf.constant(1.0), average=False)

    step_sum = tf.function(count) if args.graph else count

    @bf.elastic.run
    def train(state):
        while state.step < steps:
            n = step_sum()
            counter.assign_add(1.0)
            state.step += 1
            if bf.rank() == 0:
                print(f"STEP {state.step} size {int(n)}", flush=True)
            die(state.step, "step")
            if state.step % args.commit_every == 0:
                die(state.step, "commit")
                state.commit()
            time.sleep(args.step_ms / 1000)

    train(state)
    print(f"DONE worker {me} rank {bf.rank()} size {bf.size()} step {state.step} counter "
          f"{float(counter.numpy()):.0f} pid {os.getpid()}", flush=True)


if __name__ == "__main__":
    main()
