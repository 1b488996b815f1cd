"""LocalSGD and DiLoCo (optimizers that sync every H steps) on every rank.

Exact checks use SGD with a fixed gradient per rank, so each rank can follow the whole job in
numpy: between syncs rank r moves by ``-lr * g_r`` per step; a sync replaces the model by the
mixing (mean over ranks, or the topology's neighbour weights) of the ranks' models (LocalSGD),
or applies the outer optimizer to the mean of the ranks' changes since the last sync (DiLoCo).
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

import bluefog.tensorflow as bf

from conftest import gather_rows, needs_ranks, neighbor_mixing_matrix, rank_values

LR = 0.125  # exact in float32
SHAPE = (3, 2)


def mixing_matrix(averaging: str, size: int) -> np.ndarray:
    """W[u][v]: the weight rank v gives to rank u's model."""
    if averaging == "neighbor":
        return neighbor_mixing_matrix(size)
    return np.full((size, size), 1.0 / size)  # allreduce; hierarchical on one machine


def fixed_problem(rank, size):
    x0 = rank_values(SHAPE, 0).astype(np.float32)  # the same start on every rank
    grads = [0.5 * rank_values(SHAPE, r, offset=1) for r in range(size)]
    return x0, grads


def maybe_function(step, run):
    return tf.function(step) if run == "function" else step


# Every kind and averaging traced; eager runs take the same path through apply, two suffice.
SYNC_CASES = ([(k, a, "function") for k in ("LocalSGD", "DiLoCo")
               for a in ("allreduce", "neighbor", "hierarchical_neighbor")]
              + [("LocalSGD", "allreduce", "eager"), ("DiLoCo", "neighbor", "eager")])


@pytest.mark.parametrize("kind,averaging,run", SYNC_CASES)
def test_syncs_every_h(kind, averaging, run, rank, size):
    """LocalSGD mixes the models; DiLoCo with outer SGD(1.0) subtracts the mixed changes
    from each rank's own anchor (anchors differ between ranks under neighbour averaging)."""
    if averaging == "hierarchical_neighbor" and bf.local_size() != size:
        pytest.skip("closed form written for all ranks on one machine")
    bf.set_topology()
    h = 3
    w = mixing_matrix(averaging, size)
    x0, grads = fixed_problem(rank, size)
    var = tf.Variable(x0)
    if kind == "LocalSGD":
        opt = bf.LocalSGD(keras.optimizers.SGD(LR), sync_every=h, averaging=averaging)
        assert opt.outer_optimizer is None
    else:
        opt = bf.DiLoCo(keras.optimizers.SGD(LR), keras.optimizers.SGD(1.0), sync_every=h,
                        averaging=averaging)
    assert (opt.sync_every, opt.averaging) == (h, averaging)
    step = maybe_function(lambda: opt.apply_gradients([(tf.constant(grads[rank],
                                                                     tf.float32), var)]), run)
    models = [x0.astype(np.float64)] * size
    anchors = list(models)
    for k in range(1, 8):
        step()
        models = [m - LR * g for m, g in zip(models, grads)]
        if k % h == 0 and kind == "LocalSGD":
            models = list(np.tensordot(w.T, np.stack(models), axes=1))
        elif k % h == 0:
            deltas = np.stack([a - m for a, m in zip(anchors, models)])
            anchors = [a - d for a, d in zip(anchors, np.tensordot(w.T, deltas, axes=1))]
            models = list(anchors)
        rows = gather_rows(var.numpy().ravel(), name=f"lowcomm.{kind}.{averaging}.{run}.{k}")
        np.testing.assert_allclose(var.numpy(), models[rank], rtol=1e-6, atol=1e-6,
                                   err_msg=f"step {k}")
        if averaging != "neighbor" and k % h == 0:
            assert np.all(rows == rows[0]), f"ranks differ right after the sync at step {k}"
        if size > 1 and k % h != 0:
            assert not np.all(rows == rows[0]), f"ranks agree between syncs (step {k})"
    stats = opt.communication_stats()
    assert (stats["steps"], stats["syncs"]) == (7, 2)
    per_sync = var.numpy().nbytes if size > 1 else 0
    assert (stats["bytes_per_sync"], stats["bytes_sent"]) == (per_sync, 2 * per_sync)


def regression(rank):
    rng = np.random.default_rng(7 + rank)
    x = rng.standard_normal((16, 4)).astype(np.float32)
    y = (x @ (np.arange(1, 5) + rank) + rank).astype(np.float32)
    return tf.constant(x), tf.constant(y)


@pytest.mark.parametrize("run", ["eager", "function"])
def test_diloco_h1_is_data_parallel_sgd(run, rank, size):
    """DiLoCo(SGD(lr), SGD(1.0), sync_every=1) against DistributedOptimizer(SGD(lr)) (run
    eagerly: its first traced step costs seconds)."""
    x, y = regression(rank)
    runs = {}
    for kind in ("diloco", "allreduce"):
        w = tf.Variable(tf.fill([4], 0.25))
        b = tf.Variable(0.5)
        if kind == "diloco":
            opt = bf.DiLoCo(keras.optimizers.SGD(0.05), keras.optimizers.SGD(1.0),
                            sync_every=1)
        else:
            opt = bf.DistributedOptimizer(keras.optimizers.SGD(0.05))

        def step(opt=opt, w=w, b=b):
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean(tf.square(tf.linalg.matvec(x, w) + b - y))
            opt.apply(tape.gradient(loss, [w, b]), [w, b])

        step = maybe_function(step, run if kind == "diloco" else "eager")
        for _ in range(6):
            step()
        runs[kind] = (np.append(w.numpy(), b.numpy()), opt)
    np.testing.assert_allclose(runs["diloco"][0], runs["allreduce"][0], rtol=2e-5, atol=1e-6)
    stats = runs["diloco"][1].communication_stats()
    assert (stats["steps"], stats["syncs"]) == (6, 6)
    assert stats["bytes_sent"] == (6 * 5 * 4 if size > 1 else 0)


@pytest.mark.parametrize("compression", [None, bf.Compression.fp16])
def test_diloco_outer_nesterov_closed_form(compression, rank, size):
    """The default outer optimizer (SGD 0.7, Nesterov momentum 0.9) on the mean change."""
    h, lr_out, mu = 2, 0.7, 0.9
    x0, grads = fixed_problem(rank, size)
    var = tf.Variable(x0)
    opt = bf.DiLoCo(keras.optimizers.SGD(LR), sync_every=h, compression=compression)
    step = tf.function(lambda: opt.apply([tf.constant(grads[rank], tf.float32)], [var]))
    anchor, velocity = x0.astype(np.float64), np.zeros(SHAPE)
    mean_g = np.mean(grads, axis=0)
    for k in range(1, 7):
        step()
        if k % h == 0:
            outer_grad = h * LR * mean_g  # anchor - model, averaged over the ranks
            velocity = mu * velocity - lr_out * outer_grad
            anchor = anchor + mu * velocity - lr_out * outer_grad
            expected = anchor
        else:
            expected = anchor - LR * grads[rank]
        tol = 1e-5 if compression is None else 2e-3
        np.testing.assert_allclose(var.numpy(), expected, rtol=tol, atol=tol,
                                   err_msg=f"step {k}")
    stats = opt.communication_stats()
    per_sync = (var.numpy().size * (4 if compression is None else 2)) if size > 1 else 0
    assert stats == {"steps": 6, "syncs": 3, "bytes_sent": 3 * per_sync,
                     "bytes_per_sync": per_sync, "sync_every": h, "averaging": "allreduce"}


def test_bad_arguments_raise():
    sgd = keras.optimizers.SGD(0.1)
    for bad in (0, -2, 1.5, True, "3", None):
        with pytest.raises(ValueError, match="sync_every must be an int >= 1"):
            bf.LocalSGD(sgd, sync_every=bad)
        with pytest.raises(ValueError, match="sync_every must be an int >= 1"):
            bf.DiLoCo(sgd, sync_every=bad)
    for bad in ("window", "gossip", "", None):
        with pytest.raises(ValueError, match="averaging must be one of 'allreduce', 'neighbor', "
                                             "'hierarchical_neighbor'"):
            bf.DiLoCo(sgd, sync_every=2, averaging=bad)
    with pytest.raises(ValueError, match="compression works with averaging='allreduce' only"):
        bf.DiLoCo(sgd, sync_every=2, averaging="neighbor", compression=bf.Compression.fp16)
    with pytest.raises(TypeError, match="compression"):
        bf.DiLoCo(sgd, sync_every=2, compression="int8")
    with pytest.raises(ValueError, match="outer optimizer must be another instance"):
        bf.DiLoCo(sgd, sgd, sync_every=2)
    built = keras.optimizers.SGD(0.1)
    built.build([keras.Variable(np.zeros(2, np.float32))])
    with pytest.raises(ValueError, match="outer_optimizer is already built"):
        bf.DiLoCo(sgd, built, sync_every=2)
    with pytest.raises(ValueError, match="already communicates"):
        bf.LocalSGD(bf.LocalSGD(sgd, sync_every=2), sync_every=2)
    with pytest.raises(ValueError, match="not the class"):
        bf.LocalSGD(keras.optimizers.SGD, sync_every=2)


@needs_ranks(2)
@pytest.mark.parametrize("setting", ["sync_every", "averaging", "optimizer"])
def test_ranks_disagreeing_raise_on_every_rank(setting, rank, size):
    var = tf.Variable(np.ones(3, np.float32))
    if setting == "sync_every":
        opt = bf.LocalSGD(keras.optimizers.SGD(LR), sync_every=2 + rank % 2)
        values = ", ".join(f"rank {r}: {2 + r % 2}" for r in range(size))
    elif setting == "averaging":
        opt = bf.LocalSGD(keras.optimizers.SGD(LR), sync_every=2,
                          averaging="allreduce" if rank == 0 else "neighbor")
        values = ", ".join(f"rank {r}: {'allreduce' if r == 0 else 'neighbor'!r}"
                           for r in range(size))
    else:
        # Every rank makes as many Keras optimizers (DiLoCo's outer one given, not its default):
        # Keras numbers them per process, and DistributedOptimizer's collectives in later tests
        # carry that name (sgd_N), so an extra one on some ranks would hang those tests.
        inner, outer = keras.optimizers.SGD(LR), keras.optimizers.SGD(0.7)
        opt = (bf.LocalSGD(inner, sync_every=2) if rank == 0
               else bf.DiLoCo(inner, outer, sync_every=2))
        values = ", ".join(f"rank {r}: {'LocalSGD' if r == 0 else 'DiLoCo'}"
                           for r in range(size))
    step = tf.function(lambda: opt.apply([tf.ones(3)], [var]))
    with pytest.raises(ValueError, match=f"rank {rank}: bluefog .*the ranks disagree on "
                                         f"{setting} \\({values}\\)"):
        step()
    # The runtime is still usable afterwards.
    total = bf.allreduce(tf.constant([1.0]), average=False, name=f"lowcomm.after.{setting}")
    assert float(total.numpy()[0]) == size


def test_model_fit_with_diloco(rank, size):
    rng = np.random.default_rng(rank)
    x = rng.standard_normal((32, 4)).astype(np.float32)
    y = (x[:, 0] + x[:, 1] * (1 + rank) > 0).astype(np.int64)
    keras.utils.set_random_seed(1)  # the same initial model everywhere
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="relu"),
                              keras.layers.Dense(2)])
    opt = bf.DiLoCo(keras.optimizers.Adam(0.01), sync_every=4)
    model.compile(optimizer=opt, jit_compile=False, metrics=["accuracy"],
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    history = model.fit(x, y, batch_size=8, epochs=3, verbose=0)  # 4 steps an epoch
    losses = history.history["loss"]
    assert losses[-1] < losses[0], losses
    params = np.concatenate([w.ravel() for w in model.get_weights()])
    rows = gather_rows(params, name="lowcomm.fit.weights")
    assert np.all(rows == rows[0]), "ranks differ after the last step, a sync"
    stats = opt.communication_stats()
    per_sync = params.size * 4 if size > 1 else 0
    assert (stats["steps"], stats["syncs"], stats["bytes_sent"]) == (12, 3, 3 * per_sync)
