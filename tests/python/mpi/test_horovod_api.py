"""Horovod's API beyond the collectives, as a ported script calls it: in-place broadcasts,
broadcast_global_variables in tf.compat.v1 graphs, the layout ops, gradient_predivide_factor,
and the error class for unsupported IndexedSlices reductions.
"""

import numpy as np
import pytest
import tensorflow as tf

import bluefog.tensorflow as bf


def test_broadcast_in_place_returns_the_variables(rank, size):
    vs = [tf.Variable([float(rank)] * 2), tf.Variable(rank + 10)]
    out = bf.broadcast_(vs, root_rank=size - 1)
    assert out[0] is vs[0] and out[1] is vs[1]
    np.testing.assert_allclose(vs[0].numpy(), [size - 1.0] * 2)
    assert int(vs[1].numpy()) == size - 1 + 10


def test_broadcast_global_variables_in_a_v1_graph(rank, size):
    graph = tf.Graph()
    with graph.as_default():
        a = tf.compat.v1.get_variable("a", initializer=tf.constant([float(rank), 1.0]))
        b = tf.compat.v1.get_variable("b", initializer=tf.constant(rank, tf.int64))
        bcast = bf.broadcast_global_variables(0)
        with tf.compat.v1.Session(graph=graph) as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            sess.run(bcast)
            values = sess.run([a, b])
    np.testing.assert_allclose(values[0], [0.0, 1.0])
    assert values[1] == 0


def test_broadcast_global_variables_refuses_eager_mode():
    with pytest.raises(RuntimeError, match="graph mode only"):
        bf.broadcast_global_variables(0)


def test_layout_ops(rank, size):
    assert int(bf.rank_op()) == rank
    assert int(bf.size_op()) == size
    assert int(bf.local_rank_op()) == bf.local_rank()
    assert int(bf.local_size_op()) == bf.local_size()
    assert bf.rank_op().dtype == tf.int32

    @tf.function
    def in_function():
        return bf.rank_op() * 10 + bf.size_op()

    assert int(in_function()) == rank * 10 + size


def test_cross_rank_size_and_homogeneous_match_the_layout(rank, size):
    """Against the layout gathered from every rank: the cross group of a rank is the ranks with
    its local rank, in rank order; the job is homogeneous when every host has as many ranks."""
    layout = bf.allgather(tf.constant([[bf.local_rank(), bf.local_size()]]),
                          name="cross.layout").numpy()
    group = [r for r in range(size) if layout[r, 0] == bf.local_rank()]
    assert bf.cross_rank() == group.index(rank)
    assert bf.cross_size() == len(group)
    assert bf.is_homogeneous() == (len(set(layout[:, 1])) == 1)


def test_gradient_predivide_factor_still_averages(rank, size):
    w = tf.Variable([1.0, 2.0])
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(w * float(rank + 1))
    tape = bf.DistributedGradientTape(tape, gradient_predivide_factor=float(size))
    grad = tape.gradient(loss, w)
    np.testing.assert_allclose(grad.numpy(), [(size + 1) / 2] * 2, rtol=1e-6)


def test_gradient_predivide_factor_in_keras_optimizer(rank, size):
    import keras

    opt = bf.DistributedOptimizer(keras.optimizers.SGD(1.0), gradient_predivide_factor=2.0,
                                  name="hapi.predivide")
    w = tf.Variable([0.0, 0.0])
    opt.apply_gradients([(tf.constant([float(rank + 1), 2.0 * (rank + 1)]), w)])
    np.testing.assert_allclose(w.numpy(), [-(size + 1) / 2, -(size + 1)], rtol=1e-6)


def test_gradient_predivide_factor_must_be_positive():
    with pytest.raises(ValueError, match="gradient_predivide_factor"):
        bf.DistributedGradientTape(tf.GradientTape(), gradient_predivide_factor=0.0)
    with pytest.raises(TypeError, match="gradient_predivide_factor"):
        bf.DistributedGradientTape(tf.GradientTape(), gradient_predivide_factor="2")


def test_unsupported_indexed_slices_reduction_is_also_not_implemented(rank, size):
    slices = tf.IndexedSlices(tf.ones([1, 2]), tf.constant([0]), tf.constant([3, 2]))
    with pytest.raises(NotImplementedError):
        bf.allreduce(slices, op=bf.Max, name="hapi.slices.max")
    with pytest.raises(ValueError):
        bf.allreduce(slices, op=bf.Min, name="hapi.slices.min")
    assert issubclass(bf.UnsupportedReductionError, NotImplementedError)
    assert issubclass(bf.UnsupportedReductionError, ValueError)
    ints = tf.IndexedSlices(tf.ones([1, 2], tf.int32), tf.constant([0]), tf.constant([3, 2]))
    with pytest.raises(NotImplementedError, match="prescale_factor .* int32"):
        bf.allreduce(ints, average=False, prescale_factor=2.0, name="hapi.slices.scaled")


def test_build_queries_answer_like_horovod():
    import bluefog.tensorflow.keras as bfk
    for mod in (bf, bfk):
        on_gloo = bf.backend() == "gloo"
        assert mod.mpi_built() and mod.mpi_enabled() != on_gloo
        assert mod.gloo_enabled() == on_gloo and (mod.gloo_built() or not on_gloo)
        assert not any(f() for f in (mod.nccl_built,
                                     mod.ddl_built, mod.ccl_built, mod.cuda_built,
                                     mod.rocm_built))


def test_barrier_waits_for_every_rank(rank, size):
    """A rank that sleeps before the barrier holds the others: every rank leaves it after the
    last one entered (wall clocks of one machine; the ranks compare through an allgather)."""
    import time
    if rank == size - 1:
        time.sleep(0.3)
    entered = time.time()
    bf.barrier()
    left = time.time()
    times = bf.allgather(tf.constant([[entered, left]], tf.float64), name="barrier.times").numpy()
    assert times[:, 1].min() >= times[:, 0].max() - 1e-3, times
    bf.barrier(process_set=bf.global_process_set)


def test_horovod_device_and_name_scope_arguments(rank, size):
    x = tf.constant([1.0, rank])
    out = bf.allreduce(x, average=False, device_dense="/cpu:0", ignore_name_scope=True,
                       name="hvd.args")
    np.testing.assert_allclose(out.numpy(), [size, size * (size - 1) / 2])
    g = bf.grouped_allreduce([x, x * 2], average=False, device_sparse="/cpu:0", name="hvd.g")
    np.testing.assert_allclose(g[1].numpy(), [2 * size, size * (size - 1)])
    assert bf.allgather(x, ignore_name_scope=True, name="hvd.ag").shape == (2 * size,)
    assert bf.broadcast(x, 0, ignore_name_scope=False, name="hvd.b").numpy()[1] == 0
    with pytest.raises(ValueError, match=r"rank \d+: bluefog allreduce of tensor 'hvd.bad': "
                                         r"device_dense='/cpu:0', device_sparse='/gpu:0'"):
        bf.allreduce(x, device_dense="/cpu:0", device_sparse="/gpu:0", name="hvd.bad")
    with pytest.raises(TypeError, match="ignore_name_scope must be a bool"):
        bf.allgather(x, ignore_name_scope="yes", name="hvd.bad2")


@pytest.mark.parametrize("wrapper", ["tape", "optimizer"])
def test_gradient_groups_give_the_same_average(wrapper, rank, size):
    """Horovod's groups / num_groups split the gradients into that many grouped requests; the
    averages are the same as with one."""
    import keras

    expected = [np.full([k + 1], (size - 1) / 2 + k + 1) for k in range(5)]
    for i, kwargs in enumerate(({}, {"num_groups": 2}, {"groups": 3}, {"groups": 9})):
        variables = [tf.Variable(tf.zeros([k + 1])) for k in range(5)]
        if wrapper == "tape":
            with tf.GradientTape() as tape:
                loss = sum(tf.reduce_sum(v * float(rank + k + 1))
                           for k, v in enumerate(variables))
            got = bf.DistributedGradientTape(tape, **kwargs).gradient(loss, variables)
            got = [g.numpy() for g in got]
        else:
            opt = bf.DistributedOptimizer(keras.optimizers.SGD(1.0), name=f"hapi.groups.{i}",
                                          **kwargs)
            opt.apply_gradients([(tf.fill([k + 1], float(rank + k + 1)), v)
                                 for k, v in enumerate(variables)])
            got = [-v.numpy() for v in variables]
        for g, e in zip(got, expected):
            np.testing.assert_allclose(g, e, rtol=1e-6)
    for bad in ({"groups": [["a variable"]]}, {"groups": 2, "num_groups": 2}, {"groups": -1}):
        with pytest.raises(ValueError, match="groups"):
            if wrapper == "tape":
                bf.DistributedGradientTape(tf.GradientTape(), **bad)
            else:
                bf.DistributedOptimizer(keras.optimizers.SGD(0.0), **bad)


def test_gradient_groups_as_lists_of_variables(rank, size):
    """Horovod's groups=[[v...], ...]: the same averages as without groups; a variable in two
    groups is refused."""
    import keras

    variables = [tf.Variable(tf.zeros([k + 1])) for k in range(3)] + [keras.Variable([0.0] * 4)]
    opt = bf.DistributedOptimizer(keras.optimizers.SGD(1.0), name="hapi.lists",
                                  groups=[[variables[0], variables[3]], [variables[1]]])
    opt.apply_gradients([(tf.fill([k + 1], float(rank + k + 1)), v)
                         for k, v in enumerate(variables)])
    for k, v in enumerate(variables):
        np.testing.assert_allclose(-np.asarray(v), np.full([k + 1], (size - 1) / 2 + k + 1))
    with pytest.raises(ValueError, match="more than one group"):
        bf.DistributedOptimizer(keras.optimizers.SGD(0.0), groups=[[variables[0]], [variables[0]]])


def test_broadcast_variables_keeps_each_ranks_dropout_masks(rank, size):
    """Broadcasting model.variables (Horovod's TF2 examples) gives every rank the same weights
    but not the same dropout seed state: the masks still differ between ranks."""
    import keras

    keras.utils.set_random_seed(1000 + rank)  # different weights and dropout seeds per rank
    model = keras.Sequential([keras.Input((256,)), keras.layers.Dense(256),
                              keras.layers.Dropout(0.5)])
    seeds = [v for v in model.variables if "seed_generator" in v.path]
    assert seeds, "Keras' Dropout no longer keeps its seed in model.variables"
    bf.broadcast_variables(model.variables, root_rank=0)
    kernel = bf.allgather(model.layers[0].kernel.value[None], name="hapi.dropout.w").numpy()
    for r in range(size):
        np.testing.assert_array_equal(kernel[r], kernel[0])
    masks = bf.allgather(tf.cast(model(tf.ones([1, 256]), training=True) != 0, tf.int32),
                         name="hapi.dropout.mask").numpy()
    for r in range(1, size):
        assert (masks[r] != masks[0]).any(), "two ranks drew the same dropout mask"


def test_horovod_signatures_port_unchanged(rank, size):
    """Keyword and positional forms of Horovod's API that ported scripts use."""
    import keras

    import bluefog.tensorflow.keras as bfk

    gps = bf.global_process_set
    vs = [tf.Variable([float(rank)])]
    assert bf.broadcast_(vs, 0, name="hapi.b_", process_set=gps)[0] is vs[0]
    assert vs[0].numpy()[0] == 0
    assert bf.broadcast_object({"r": rank}, 0, process_set=gps)["r"] == 0
    assert bf.allgather_object(rank, process_set=gps) == list(range(size))
    g = bf.grouped_allgather([tf.constant([rank])], ignore_name_scope=True, name="hapi.ga")
    assert g[0].numpy().tolist() == list(range(size))
    assert int(bf.size_op(process_set_id=0)) == size
    assert int(bf.process_set_included_op()) == 1
    with pytest.raises(ValueError, match="not a registered process set"):
        bf.process_set_included_op(12345)
    out = bf.allreduce(tf.constant([float(rank)]), average=None, name="hapi.avgnone")
    np.testing.assert_allclose(out.numpy(), [(size - 1) / 2])
    v = tf.Variable([1.0])
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(v * float(rank + 1))
    grad = bf.DistributedGradientTape(tape).gradient(loss, [v], use_generic_names=True)
    np.testing.assert_allclose(grad[0].numpy(), [(size + 1) / 2])
    np.testing.assert_allclose(bfk.allreduce(float(rank), "hapi.kallreduce").numpy(),
                               (size - 1) / 2)
    assert bfk.MetricAverageCallback(device="").device == ""
    assert bfk.BestModelCheckpoint(monitor="loss").filepath == "best_model.keras"
    assert bfk.BestModelCheckpoint(save_weights_only=True).filepath == "best_model.weights.h5"
    warm = bfk.LearningRateWarmupCallback(0.1, 2, False)
    assert warm.momentum_correction is False
    assert bfk.broadcast_global_variables is bf.broadcast_global_variables
    assert bfk.ProcessSet is bf.ProcessSet and bfk.global_process_set is gps
    assert callable(bfk.add_process_set) and callable(bfk.remove_process_set)
    assert isinstance(keras.optimizers.SGD(0.1), keras.optimizers.Optimizer)


def test_init_arguments_of_horovod(rank, size):
    bf.init(process_sets="dynamic")  # initialized already: a no-op that registers nothing
    with pytest.raises(ValueError, match=r"comm= .* not supported.*process_sets=\[bf.ProcessSet"):
        bf.init(comm=[0])
    with pytest.raises(TypeError, match="process_sets must be a list"):
        bf.init(process_sets="static")


def test_xla_compiled_collective_fails_at_trace_time_naming_the_fix(rank, size):
    """XLA cannot compile bluefog's ops: tracing one into a jit_compile function raises a
    ValueError saying what to change, on every rank, before anything is sent; a Keras model
    compiled with jit_compile=True and DistributedOptimizer gets the same error from fit."""
    import keras

    @tf.function(jit_compile=True)
    def step(x):
        return bf.allreduce(x, name="hapi.xla")

    with pytest.raises(ValueError, match=r"compiled by XLA .* jit_compile=False"):
        step(tf.ones([2]))
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile(optimizer=bf.DistributedOptimizer(keras.optimizers.SGD(0.1), name="hapi.xk"),
                  loss="mse", jit_compile=True)
    if size == 1:
        # One rank: DistributedOptimizer averages nothing, so no collective is traced and XLA
        # compiles the step as it is.
        model.fit(np.ones([4, 2]), np.ones([4, 1]), epochs=1, verbose=0)
    else:
        with pytest.raises(ValueError, match="model.compile\\(..., jit_compile=False\\)"):
            model.fit(np.ones([4, 2]), np.ones([4, 1]), epochs=1, verbose=0)
    # Nothing was sent: the next collective still matches across ranks.
    out = bf.allreduce(tf.constant([float(rank)]), average=False, name="hapi.after_xla")
    np.testing.assert_allclose(out.numpy(), [size * (size - 1) / 2])
