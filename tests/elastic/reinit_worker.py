"""One rank of tests/python/test_gloo_reinit.py: three Gloo jobs in one process.

Job 1 is this rank, RANK of WORLD_SIZE at MASTER_PORT, with a process set and a window; it
ends with bf.shutdown(). Job 2 (bf.init() again, at SECOND_PORT, the same ranks) must work, and
job 1's process set and window must be gone with clear errors. Then rank --die exits abruptly:
the others' next allreduce must fail at once, and they start job 3 at THIRD_PORT without it."""

import argparse
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import bluefog.tensorflow as bf  # noqa: E402

tf.config.threading.set_intra_op_parallelism_threads(1)
tf.config.threading.set_inter_op_parallelism_threads(1)

p = argparse.ArgumentParser()
p.add_argument("--die", type=int, required=True)
args = p.parse_args()
pid = os.getpid()


def check_sum(n, name, process_set=None):
    kwargs = {"process_set": process_set} if process_set is not None else {}
    got = bf.allreduce(tf.constant([float(bf.rank() + 1)]), average=False, name=name,
                       **kwargs).numpy()
    assert got[0] == n * (n + 1) / 2, (name, got)


# Job 1.
bf.init()
rank, size = bf.rank(), bf.size()
ps = bf.add_process_set(list(range(size)))
check_sum(size, "sum")
check_sum(size, "set_sum", ps)
bf.win_create(tf.zeros([2]), "w")
bf.shutdown()

# Job 2: the same ranks; the same request names are new in a new job.
os.environ["MASTER_PORT"] = os.environ["SECOND_PORT"]
bf.init()
assert bf.size() == size and bf.rank() == rank
assert ps.process_set_id is None, ps
check_sum(size, "sum")
try:
    bf.win_put(tf.zeros([2]), "w")
    raise SystemExit("win_put on job 1's window succeeded")
except ValueError as e:
    assert "earlier job of this process" in str(e), e
ps2 = bf.add_process_set(list(range(size)))
check_sum(size, "set_sum", ps2)
print(f"SECOND JOB OK rank {rank}", flush=True)

if rank == args.die:
    os._exit(3)  # no shutdown: the peers see its connections break
started = time.time()
try:
    bf.allreduce(tf.constant([1.0]), name="after")
    raise SystemExit(f"rank {rank}: the allreduce after rank {args.die} died succeeded")
except tf.errors.OpError as e:
    print(f"FAILED rank {rank} after {time.time() - started:.2f} s: "
          f"{type(e).__name__}: {e.message.splitlines()[0][:200]}", flush=True)
assert not bf.is_initialized()
bf.shutdown()

# Job 3: the survivors.
survivors = [r for r in range(size) if r != args.die]
os.environ.update(MASTER_PORT=os.environ["THIRD_PORT"], RANK=str(survivors.index(rank)),
                  WORLD_SIZE=str(len(survivors)))
bf.init()
assert os.getpid() == pid and bf.size() == len(survivors)
check_sum(len(survivors), "sum")
got = bf.allreduce(tf.constant(np.arange(3, dtype=np.float32)), name="avg").numpy()
assert np.allclose(got, np.arange(3)), got
print(f"REINIT OK rank {bf.rank()} of {bf.size()} (was {rank} of {size}) pid {pid}", flush=True)
