"""The decentralized optimizers (adapt-then-combine, adapt-with-combine) on every rank.

Exact checks use SGD with a fixed gradient per rank, so each rank can simulate the whole network
in numpy: with ``W`` the mixing matrix of the communication type (``W[u][v]`` = weight rank ``v``
gives to rank ``u``), one step is

* ATC: ``x_v <- sum_u W[u][v] (x_u - lr g_u)``
* AWC: ``x_v <- sum_u W[u][v] x_u - lr g_v``.

The training checks use rank-dependent data: with communication the ranks' models agree (and
the loss falls), without it they drift to their own local optima.
"""

import keras
import networkx as nx
import numpy as np
import pytest
import tensorflow as tf

import bluefog.tensorflow as bf
from bluefog.common import topology_util as tu

from conftest import neighbor_mixing_matrix, rank_values

OPTIMIZERS = {"atc": bf.DistributedAdaptThenCombineOptimizer,
              "awc": bf.DistributedAdaptWithCombineOptimizer}
COMMUNICATIONS = ["neighbor_allreduce", "hierarchical_neighbor_allreduce", "allreduce", "empty"]
SHAPES = [(3, 2), (4,)]
LR = 0.125  # exact in float32: Keras keeps the learning rate in float32


@pytest.fixture(autouse=True)
def default_topology():
    bf.set_topology()
    yield
    bf.set_topology()


def mixing_matrix(communication: str, size: int) -> np.ndarray:
    if communication == "neighbor_allreduce":
        return neighbor_mixing_matrix(size)
    if communication == "empty":
        return np.eye(size)
    return np.full((size, size), 1.0 / size)  # allreduce; hierarchical on one machine


def mix(w, values):
    """Row v of the result: sum_u W[u][v] values[u]."""
    return np.tensordot(w.T, values, axes=1)


def simulate(mode, w, x_all, g_all, communicate):
    """One SGD step of every rank; x_all/g_all: [rank] -> array."""
    stepped = [x - LR * g for x, g in zip(x_all, g_all)]
    if not communicate:
        return stepped
    if mode == "atc":
        return list(mix(w, np.stack(stepped)))
    mixed = mix(w, np.stack(x_all))
    return [m - LR * g for m, g in zip(mixed, g_all)]


def skip_unless_one_machine(communication, size):
    if communication.startswith("hierarchical") and bf.local_size() != size:
        pytest.skip("closed form written for all ranks on one machine")


def spread(vector, name):
    """Largest distance of a rank's vector from the ranks' mean."""
    rows = bf.allgather(tf.reshape(tf.constant(vector, tf.float64), [1, -1]), name=name).numpy()
    return float(np.max(np.abs(rows - rows.mean(axis=0))))


def flat(variables):
    return np.concatenate([np.asarray(v, np.float64).ravel() for v in variables])


# ------------------------------------------------------------------------------------------
# Exact one-step semantics
# ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("run", ["eager", "function"])
@pytest.mark.parametrize("communication", COMMUNICATIONS)
@pytest.mark.parametrize("mode", sorted(OPTIMIZERS))
def test_steps_match_closed_form(mode, communication, run, rank, size):
    skip_unless_one_machine(communication, size)
    w = mixing_matrix(communication, size)
    dtypes = [np.float32, np.float64]  # two dtypes: two flattened exchanges
    x_all = [[rank_values(s, r) for r in range(size)] for s in SHAPES]
    g_all = [[0.1 * rank_values(s, r, offset=1) for r in range(size)] for s in SHAPES]
    variables = [tf.Variable(x_all[i][rank].astype(dt)) for i, dt in enumerate(dtypes)]
    grads = [tf.constant(g_all[i][rank].astype(dt)) for i, dt in enumerate(dtypes)]
    opt = OPTIMIZERS[mode](keras.optimizers.SGD(LR), communication_type=communication)

    def step():
        opt.apply(grads, variables)

    if run == "function":
        step = tf.function(step)
    for k in range(3):
        step()
        for i in range(len(SHAPES)):
            x_all[i] = simulate(mode, w, x_all[i], g_all[i], communicate=True)
            tol = 1e-5 if dtypes[i] == np.float32 else 1e-12
            np.testing.assert_allclose(variables[i].numpy(), x_all[i][rank], rtol=tol,
                                       atol=tol, err_msg=f"step {k}, variable {i}")
    assert int(opt.iterations.numpy()) == 3


@pytest.mark.parametrize("run", ["eager", "function"])
@pytest.mark.parametrize("mode", sorted(OPTIMIZERS))
def test_communicates_every_n_steps(mode, run, rank, size):
    n = 3
    w = mixing_matrix("neighbor_allreduce", size)
    x_all = [rank_values((5,), r) for r in range(size)]
    g_all = [0.1 * rank_values((5,), r, offset=1) for r in range(size)]
    var = tf.Variable(x_all[rank])
    grad = tf.constant(g_all[rank])
    opt = OPTIMIZERS[mode](keras.optimizers.SGD(LR), num_steps_per_communication=n)
    assert opt.num_steps_per_communication == n
    assert opt.communication_type == "neighbor_allreduce"

    def step():
        opt.apply([grad], [var])

    if run == "function":
        step = tf.function(step)
    for k in range(1, 8):
        step()
        x_all = simulate(mode, w, x_all, g_all, communicate=(k % n == 0))
        np.testing.assert_allclose(var.numpy(), x_all[rank], rtol=1e-12, err_msg=f"step {k}")


def test_apply_gradients_and_weighted_topology(rank, size):
    """apply_gradients goes through the same path; a weighted topology's weights are used."""
    graph = tu.StarGraph(size)
    bf.set_topology(graph, is_weighted=True)
    w = nx.to_numpy_array(graph, nodelist=range(size))
    x_all = [rank_values((4,), r) for r in range(size)]
    g_all = [rank_values((4,), r, offset=3) for r in range(size)]
    var = tf.Variable(x_all[rank])
    opt = bf.DistributedNeighborAllreduceOptimizer(keras.optimizers.SGD(LR))
    opt.apply_gradients([(tf.constant(g_all[rank]), var)])
    expected = simulate("atc", w, x_all, g_all, communicate=True)[rank]
    np.testing.assert_allclose(var.numpy(), expected, rtol=1e-12)


# ------------------------------------------------------------------------------------------
# Training on rank-dependent data: consensus and a falling loss
# ------------------------------------------------------------------------------------------

def make_regression(rank, n=64, dim=4):
    """Rank-dependent linear data: the ranks' least-squares solutions differ."""
    rng = np.random.default_rng(100 + rank)
    x = rng.standard_normal((n, dim)).astype(np.float32)
    w_true = np.arange(1, dim + 1, dtype=np.float32) + rank  # rank-dependent optimum
    y = x @ w_true + 0.5 * rank
    return tf.constant(x), tf.constant(y.astype(np.float32))


def train_custom_loop(optimizer, rank, steps=150):
    x, y = make_regression(rank)
    w = tf.Variable(tf.zeros([4]))
    b = tf.Variable(0.0)

    def loss_fn():
        return tf.reduce_mean(tf.square(tf.linalg.matvec(x, w) + b - y))

    @tf.function
    def step():
        with tf.GradientTape() as tape:
            loss = loss_fn()
        optimizer.apply(tape.gradient(loss, [w, b]), [w, b])
        return loss

    first = float(step())
    for _ in range(steps - 1):
        step()
    return first, float(loss_fn()), flat([w, b])


@pytest.mark.parametrize("mode", sorted(OPTIMIZERS))
def test_training_reaches_consensus(mode, rank, size):
    opt = OPTIMIZERS[mode](keras.optimizers.SGD(0.05))
    first, last, params = train_custom_loop(opt, rank)
    local = OPTIMIZERS[mode](keras.optimizers.SGD(0.05), communication_type="empty")
    _, _, params_local = train_custom_loop(local, rank)

    # The loss of the network (mean of the ranks' local losses) falls.
    losses = bf.allreduce(tf.constant([first, last], tf.float64), name=f"dec.loss.{mode}").numpy()
    assert losses[1] < 0.5 * losses[0], losses
    # The ranks agree: far closer to each other than ranks that train alone. (With a constant
    # step size some disagreement remains, proportional to the step and to how much the ranks'
    # gradients differ; adapt-with-combine keeps more of it than adapt-then-combine.)
    together = spread(params, f"dec.spread.{mode}")
    alone = spread(params_local, f"dec.spread_local.{mode}")
    if size > 1:
        assert alone > 0.5, alone
        assert together < 0.2 * alone, (together, alone)
    else:
        assert together == alone == 0.0


def test_atc_allreduce_keeps_ranks_identical(rank, size):
    """Adapt-then-combine with allreduce ends every step with the mean model on every rank."""
    opt = bf.DistributedAdaptThenCombineOptimizer(keras.optimizers.Adam(0.05),
                                                  communication_type="allreduce")
    _, _, params = train_custom_loop(opt, rank, steps=30)
    assert spread(params, "dec.allreduce.identical") < 1e-5


# ------------------------------------------------------------------------------------------
# model.fit
# ------------------------------------------------------------------------------------------

def fit_model(optimizer, rank, epochs=3):
    keras.utils.set_random_seed(7)  # the same initial model on every rank
    x, y = make_regression(rank, n=96)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="tanh"),
                              keras.layers.Dense(1)])
    model.compile(optimizer=optimizer, loss="mse")
    history = model.fit(x.numpy(), y.numpy(), batch_size=16, epochs=epochs, verbose=0,
                        shuffle=False)
    return history.history["loss"], flat(model.trainable_weights)


def test_model_fit(rank, size):
    """model.fit with the neighbour optimizer, communicating every other step (the traced
    train step branches on the step counter)."""
    opt = bf.DistributedNeighborAllreduceOptimizer(keras.optimizers.Adam(0.02),
                                                   num_steps_per_communication=2)
    losses, params = fit_model(opt, rank)
    assert losses[-1] < losses[0], losses
    # 3 epochs of 6 steps: 18 applies.
    assert int(opt._bluefog_counter.numpy()) == 18
    assert int(opt.iterations.numpy()) == 18
    scale = float(np.max(np.abs(params)))
    if size > 1:
        assert spread(params, "dec.fit") < 0.05 * scale


# ------------------------------------------------------------------------------------------
# The wrapper: class, configuration, state, errors
# ------------------------------------------------------------------------------------------

def test_wrapper_is_the_optimizer_class_with_its_config():
    base = keras.optimizers.Adam(0.003, beta_1=0.8, clipnorm=1.0)
    for wrap in (bf.DistributedAdaptThenCombineOptimizer, bf.DistributedAdaptWithCombineOptimizer,
                 bf.DistributedNeighborAllreduceOptimizer):
        opt = wrap(base)
        assert isinstance(opt, keras.optimizers.Adam)
        assert type(opt).__name__ == "Adam"
        config, expected = opt.get_config(), base.get_config()
        config.pop("name"), expected.pop("name")
        assert config == expected
        # It serializes as the plain class.
        again = keras.optimizers.deserialize(keras.optimizers.serialize(opt))
        assert type(again) is keras.optimizers.Adam


def test_wrapping_a_built_optimizer_keeps_its_state(rank):
    var = tf.Variable([1.0, 2.0])
    base = keras.optimizers.Adam(0.1)
    base.apply([tf.constant([0.5, -0.5])], [var])
    opt = bf.DistributedAdaptThenCombineOptimizer(base, communication_type="empty")
    assert opt.built
    for a, b in zip(base.variables, opt.variables):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    opt.apply([tf.constant([0.5, -0.5])])  # no variables: the ones it was built with
    assert int(opt.iterations.numpy()) == 2


@pytest.mark.parametrize("bad", ["ring", "neighbour_allreduce", None, 1, ""])
def test_bad_communication_type(bad):
    with pytest.raises(ValueError, match="communication_type"):
        bf.DistributedAdaptThenCombineOptimizer(keras.optimizers.SGD(0.1),
                                                communication_type=bad)
    with pytest.raises(ValueError, match="communication_type"):
        bf.DistributedAdaptWithCombineOptimizer(keras.optimizers.SGD(0.1),
                                                communication_type=bad)


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "2", None])
def test_bad_num_steps(bad):
    for wrap in (bf.DistributedAdaptThenCombineOptimizer, bf.DistributedAdaptWithCombineOptimizer,
                 bf.DistributedNeighborAllreduceOptimizer):
        with pytest.raises(ValueError, match="num_steps_per_communication"):
            wrap(keras.optimizers.SGD(0.1), num_steps_per_communication=bad)


@pytest.mark.parametrize("bad", ["adam", keras.optimizers.SGD, object(), None,
                                 tf.compat.v1.train.GradientDescentOptimizer(0.1)],
                         ids=["string", "class", "object", "none", "v1_optimizer"])
def test_not_a_keras_optimizer(bad):
    for wrap in (bf.DistributedAdaptThenCombineOptimizer, bf.DistributedAdaptWithCombineOptimizer,
                 bf.DistributedNeighborAllreduceOptimizer):
        with pytest.raises(ValueError, match="optimizer"):
            wrap(bad)


def test_already_wrapped():
    once = bf.DistributedNeighborAllreduceOptimizer(keras.optimizers.SGD(0.1))
    with pytest.raises(ValueError, match="already"):
        bf.DistributedAdaptWithCombineOptimizer(once)
    with pytest.raises(ValueError, match="already"):
        bf.DistributedAdaptThenCombineOptimizer(bf.DistributedOptimizer(keras.optimizers.SGD(0.1)))


def test_bad_name():
    with pytest.raises(ValueError, match="name"):
        bf.DistributedNeighborAllreduceOptimizer(keras.optimizers.SGD(0.1), name="")
