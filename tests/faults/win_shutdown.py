"""One rank shuts down while the others keep putting into its window; launched by
tests/python/test_win_shutdown.py.

    mpirun -np 3 python tests/faults/win_shutdown.py [--cap 20]

Every rank creates window "w" on the default topology (rank 0 is an out-neighbour of every
other rank on 2 and 3 ranks). Rank 0 calls bf.shutdown() and prints
"SHUTDOWN rank 0 took <s> s". Every other rank puts into rank 0 in a loop until a put fails
(or --cap seconds pass), prints "PUTTER rank <r>: <n> puts, then: <message>" (message "none"
when no put failed), and shuts down.
"""

import argparse
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import tensorflow as tf

tf.config.threading.set_intra_op_parallelism_threads(1)
tf.config.threading.set_inter_op_parallelism_threads(2)

import bluefog.tensorflow as bf  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cap", type=float, default=20.0)
    args = parser.parse_args()
    bf.init()
    rank = bf.rank()
    bf.win_create(tf.zeros([64]), "w")
    bf.allreduce(tf.constant([0.0]), name="ready")
    if rank == 0:
        time.sleep(0.5)  # the others are putting by now
        start = time.time()
        bf.shutdown()
        print(f"SHUTDOWN rank 0 took {time.time() - start:.2f} s", flush=True)
        return
    assert 0 in bf.out_neighbor_ranks(), bf.out_neighbor_ranks()
    x = tf.fill([64], float(rank))
    puts, message, start = 0, "none", time.time()
    while time.time() - start < args.cap:
        try:
            bf.win_put(x, "w", dst_weights={0: 1.0})
        except tf.errors.OpError as e:
            message = e.message
            break
        puts += 1
    print(f"PUTTER rank {rank}: {puts} puts, then: {message}", flush=True)
    bf.shutdown()


if __name__ == "__main__":
    main()
