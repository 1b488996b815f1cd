"""bf.join(): ranks with different numbers of batches finish without a hang, the joined ranks
contribute the identity of the reduction to the others' allreduces (and no rows to
allgathers), and after a broadcast from the last rank to join (which ran every step) the
weights are identical on every rank and equal to a closed-form (or numpy-simulated) result.
"""

import numpy as np
import pytest
import tensorflow as tf

import bluefog.tensorflow as bf


def _batches(rank):
    return 3 + 2 * (rank % 3)  # 3, 5, 7, 3 batches on ranks 0..3


def test_join_returns_the_last_rank_and_stands_in_for_allreduce_and_allgather(rank, size):
    steps = _batches(rank)
    total = np.zeros(2)
    gathered_rows = []
    for t in range(max(_batches(r) for r in range(size))):
        if t >= steps:
            break
        total += bf.allreduce(tf.constant([1.0, float(rank)]), average=False,
                              name=f"join.sum.{t}").numpy()
        gathered = bf.allgather(tf.fill([1, 2], float(rank)), name=f"join.g.{t}")
        gathered_rows.append(gathered.shape[0])
    last = int(bf.join())
    # The last rank to join is one with the most batches.
    assert _batches(last) == max(_batches(r) for r in range(size))
    # Step t summed only the ranks still active at t.
    want = np.zeros(2)
    for t in range(steps):
        active = [r for r in range(size) if _batches(r) > t]
        want += [len(active), sum(active)]
    np.testing.assert_allclose(total, want)
    assert gathered_rows == [sum(1 for r in range(size) if _batches(r) > t) for t in range(steps)]
    # After the join, collectives wait for every rank again.
    out = bf.allreduce(tf.constant([1.0]), average=False, name="join.after")
    np.testing.assert_allclose(out.numpy(), [size])


def test_custom_loop_with_uneven_batches(rank, size):
    w = tf.Variable([0.0, 0.0])
    opt_lr = 0.5
    for t in range(_batches(rank)):
        c = np.array([rank + 1.0 + t, 1.0], np.float32)
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(w * c)
        tape = bf.DistributedGradientTape(tape)
        (g,) = tape.gradient(loss, [w])
        w.assign_sub(opt_lr * g)
    # A rank that stopped early missed the last updates: take the weights of the last rank to
    # join, which ran every step (the pattern join() returns that rank for).
    bf.broadcast_variables([w], root_rank=int(bf.join()))
    # Average over size() ranks (joined ones count, with zero gradients).
    want = np.zeros(2)
    for r in range(size):
        for t in range(_batches(r)):
            want -= opt_lr * np.array([r + 1.0 + t, 1.0]) / size
    np.testing.assert_allclose(w.numpy(), want, rtol=1e-6)
    everyone = bf.allgather(tf.expand_dims(w, 0), name="join.loop.weights").numpy()
    np.testing.assert_array_equal(everyone, np.repeat(everyone[:1], size, axis=0))


def test_keras_fit_with_uneven_shards(rank, size):
    import keras

    keras.utils.set_random_seed(1)
    batch = 4
    rng = np.random.default_rng(7)
    data = [(rng.normal(size=(batch * _batches(r), 3)).astype(np.float32),
             rng.normal(size=(batch * _batches(r), 1)).astype(np.float32)) for r in range(size)]
    model = keras.Sequential([keras.Input([3]), keras.layers.Dense(1, use_bias=False,
                                                                   kernel_initializer="zeros")])
    lr = 0.1
    model.compile(optimizer=bf.DistributedOptimizer(keras.optimizers.SGD(lr), name="join.fit"),
                  loss="mse")
    x, y = data[rank]
    history = model.fit(x, y, batch_size=batch, epochs=1, shuffle=False, verbose=0)
    bf.broadcast_variables(model.weights, root_rank=int(bf.join()))
    assert len(history.history["loss"]) == 1
    # numpy: each step averages (over size) the MSE gradients of the ranks still active.
    w = np.zeros((3, 1))
    for t in range(max(_batches(r) for r in range(size))):
        g = np.zeros_like(w)
        for r in range(size):
            if t < _batches(r):
                rows = slice(t * batch, (t + 1) * batch)
                xb, yb = data[r][0][rows], data[r][1][rows]
                g += 2.0 / batch * xb.T @ (xb @ w - yb)
        w -= lr * g / size
    np.testing.assert_allclose(model.get_weights()[0], w, rtol=1e-4, atol=1e-6)


@pytest.mark.skipif(bf.size() < 2, reason="needs a joined rank and an active one")
def test_only_allreduce_and_allgather_run_while_a_rank_has_joined(rank, size):
    if rank != 0:
        with pytest.raises(tf.errors.FailedPreconditionError,
                           match=r"rank\(s\) \[0\] have called join"):
            bf.broadcast(tf.ones([2]), root_rank=1, name="join.bcast")
    # Rank 0 joined first, so the last to join is another rank.
    assert int(bf.join()) != 0


@pytest.mark.skipif(bf.size() < 2, reason="needs a joined rank and an active one")
@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.int32, np.int64])
def test_joined_ranks_contribute_the_identity_of_the_reduction(dtype, rank, size):
    """Only the last rank stays active: min, max and product return its values unchanged (a
    joined rank's zeros would have made them 0), a sum its values, an average its values
    divided by size() (joined ranks count, as in Horovod)."""
    last = size - 1
    if rank == last:
        tag = np.dtype(dtype).name
        cases = [(bf.Min, [5, 1], [5, 1]), (bf.Max, [-5, -1], [-5, -1]),
                 (bf.Product, [5, -3], [5, -3]), (bf.Sum, [4, -2], [4, -2])]
        for op, values, want in cases:
            out = bf.allreduce(tf.constant(values, dtype=dtype), op=op,
                               name=f"join.identity.{tag}.{op}")
            np.testing.assert_array_equal(out.numpy(), np.array(want, dtype=dtype))
        if np.issubdtype(dtype, np.floating):
            out = bf.allreduce(tf.constant([4 * size, -2 * size], dtype=dtype), op=bf.Average,
                               name=f"join.identity.{tag}.avg")
            np.testing.assert_array_equal(out.numpy(), np.array([4, -2], dtype=dtype))
        # Fused: several reductions of one round, each with its own identity.
        outs = bf.grouped_allreduce([tf.constant([7, -7], dtype=dtype)] * 3, op=bf.Max,
                                    name=f"join.identity.{tag}.grouped")
        for out in outs:
            np.testing.assert_array_equal(out.numpy(), np.array([7, -7], dtype=dtype))
    assert int(bf.join()) == last


@pytest.mark.skipif(bf.size() < 2, reason="needs a joined rank and an active one")
def test_registration_that_failed_while_a_rank_had_joined_does_not_shift_names(rank, size):
    """add_process_set and remove_process_set fail while rank 0 has joined; afterwards every
    rank's next registration and removal still meet (none waits for a name another rank moved
    past)."""
    from bluefog.common.basics import BluefogError

    kept = bf.add_process_set(list(range(size)))
    if rank != 0:
        with pytest.raises(BluefogError, match=r"rank\(s\) \[0\] have called join"):
            bf.add_process_set([0, 1])
        with pytest.raises(BluefogError, match=r"rank\(s\) \[0\] have called join"):
            bf.remove_process_set(kept)
    assert int(bf.join()) != 0
    ps = bf.add_process_set([0, 1])
    assert bf.remove_process_set(ps) is True
    assert bf.remove_process_set(kept) is True


@pytest.mark.skipif(bf.size() < 2, reason="needs a joined rank and an active one")
def test_process_set_collectives_fail_on_every_member_while_one_has_joined(rank, size):
    """join() stands in for the global set only (as in Horovod): a set's collective that waits
    for a joined member fails on every member that submitted it, naming the joined rank,
    instead of waiting forever. After the join the set works again."""
    ps = bf.add_process_set(list(range(size)))
    if rank != 0:
        for call in (lambda: bf.allreduce(tf.ones([2]), name="join.ps.ar", process_set=ps),
                     lambda: bf.allgather(tf.ones([1, 2]), name="join.ps.ag", process_set=ps),
                     lambda: bf.broadcast(tf.ones([2]), root_rank=1, name="join.ps.bc",
                                          process_set=ps)):
            with pytest.raises(tf.errors.FailedPreconditionError,
                               match=rf"rank {rank}: .*rank\(s\) \[0\] of this process set "
                                     r"have called join\(\)"):
                call()
    assert int(bf.join()) != 0
    for t in range(3):  # the set's join has ended on every member: its collectives wait again
        out = bf.allreduce(tf.constant([float(rank)]), average=False, name=f"join.ps.after.{t}",
                           process_set=ps)
        np.testing.assert_allclose(out.numpy(), [size * (size - 1) / 2])
    bf.remove_process_set(ps)
