"""bf.elastic on every rank: commit / restore / sync, the per-host commit files, the host-update
check, ``run`` and the Keras callbacks. (The driver, bfrun --min-np, is tested by
tests/python/test_elastic.py and test_elastic_netns.py.)"""

import os
import pickle
import signal
import socket
import subprocess
import time

import keras
import numpy as np
import pytest
import tensorflow as tf

import bluefog.tensorflow as bf
from bluefog.common import elastic_env
from bluefog.tensorflow.elastic import interrupts
from bluefog.tensorflow.elastic.store import CommitStore


def gather(value):
    v = tf.reshape(tf.constant(np.asarray(value, dtype=np.float64)), [1, -1])
    return bf.allgather(v).numpy()


@pytest.fixture
def state_dir(tmp_path, monkeypatch):
    """A commit folder shared by the ranks of this job (rank 0's tmp_path, broadcast)."""
    folder = bf.broadcast_object(str(tmp_path / "elastic-state"), root_rank=0)
    monkeypatch.setenv(elastic_env.ENV_STATE_DIR, folder)
    yield folder
    bf.allreduce(tf.constant(0.0))  # no rank removes the folder while another still reads it


def test_commit_then_restore_returns_to_the_commit(rank):
    v = tf.Variable([1.0, 2.0])
    state = bf.elastic.TensorFlowState([v], epoch=3, history=[1])
    state.commit()
    assert state.commits == 1
    v.assign([rank + 10.0, 0.0])
    state.epoch = 7
    state.history.append(2)
    state.restore()
    np.testing.assert_array_equal(v.numpy(), [1.0, 2.0])
    assert state.epoch == 3 and state.history == [1]


def test_sync_without_commits_gives_rank_0_values(rank):
    v = tf.Variable([float(rank), float(rank) * 2])
    state = bf.elastic.TensorFlowState([v], epoch=rank)
    state.sync()
    np.testing.assert_array_equal(v.numpy(), [0.0, 0.0])
    assert state.epoch == 0 and state.commits == 0 and not state.restored_commit


def test_sync_takes_the_newest_commit_of_any_rank(rank, size):
    v = tf.Variable([0.0])
    state = bf.elastic.TensorFlowState([v], step=0)
    # As after a failure: ranks' last commits differ; the last rank holds the newest.
    v.assign([100.0 + rank])
    state.step = rank
    state._commit_id = rank
    state.save()
    v.assign([-1.0])
    state.sync()
    np.testing.assert_array_equal(v.numpy(), [100.0 + size - 1])
    assert state.step == size - 1 and state.commits == size
    # Taken from another rank (whose own commit was older), except on a single rank.
    assert state.restored_commit == (size > 1)


def test_a_new_state_resumes_from_the_commit_on_disk(state_dir, rank):
    v = tf.Variable([0.0, 0.0])
    state = bf.elastic.TensorFlowState([v], epoch=0, batch=0)
    v.assign([5.0, 6.0])
    state.epoch, state.batch = 2, 7
    state.commit()
    state.commit()
    assert os.path.isdir(state_dir)
    # What the next launch does: fresh objects, then sync (inside bf.elastic.run).
    w = tf.Variable([float(rank), 0.0])
    fresh = bf.elastic.TensorFlowState([w], epoch=0, batch=0)
    fresh.sync()
    np.testing.assert_array_equal(w.numpy(), [5.0, 6.0])
    assert (fresh.epoch, fresh.batch, fresh.commits) == (2, 7, 2) and fresh.restored_commit


def test_a_commit_that_does_not_fit_is_an_error_on_every_rank(state_dir):
    a, b = tf.Variable([1.0]), tf.Variable([2.0, 3.0])
    bf.elastic.TensorFlowState([a, b], epoch=0).commit()
    other = bf.elastic.TensorFlowState([tf.Variable([0.0])], epoch=0)
    with pytest.raises(ValueError, match="does not fit this state.*2 variables, the state has 1"):
        other.sync()


def dead_pid():
    child = subprocess.Popen(["true"])
    child.wait()
    return child.pid


def test_a_commit_removes_temporaries_of_killed_writers_and_no_others(tmp_path):
    store = CommitStore(str(tmp_path))
    base = os.path.basename(store.path)
    live = subprocess.Popen(["sleep", "60"])
    try:
        names = {"dead": f"{base}.tmp{dead_pid()}", "live": f"{base}.tmp{live.pid}",
                 "other host": f"commit-elsewhere.pkl.tmp{dead_pid()}", "unrelated": "notes.txt"}
        for name in names.values():
            (tmp_path / name).write_bytes(b"x" * 1000)
        store.write(0, [np.zeros(2, np.float32)], {"epoch": 1})
        store.write(1, [np.ones(2, np.float32)], {"epoch": 2})
        left = sorted(p.name for p in tmp_path.iterdir())
        assert left == sorted([base, names["live"], names["other host"], names["unrelated"]])
        assert store.read()["commit"] == 1
    finally:
        live.kill()
        live.wait()


def test_a_commit_is_flushed_before_the_rename_and_the_folder_after(tmp_path, monkeypatch):
    events = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd):
        events.append(("fsync", os.path.isdir(f"/proc/self/fd/{fd}")))
        real_fsync(fd)

    def replace(src, dst):
        events.append(("replace", None))
        real_replace(src, dst)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    CommitStore(str(tmp_path)).write(0, [np.zeros(2, np.float32)], {})
    assert events == [("fsync", False), ("replace", None), ("fsync", True)]


def test_a_failed_write_leaves_no_temporary(tmp_path):
    store = CommitStore(str(tmp_path))
    with pytest.raises((pickle.PicklingError, AttributeError)):
        store.write(0, [np.zeros(2, np.float32)], {"f": lambda: 0})  # lambdas do not pickle
    assert list(tmp_path.iterdir()) == []


def test_a_commit_with_other_dtypes_is_an_error_not_a_cast(state_dir):
    # An optimizer's scalars in another order: same count, same shapes, other dtypes.
    bf.elastic.TensorFlowState([tf.Variable(0.001), tf.Variable(120, dtype=tf.int64)]).commit()
    iterations, learning_rate = tf.Variable(0, dtype=tf.int64), tf.Variable(0.5)
    swapped = bf.elastic.TensorFlowState([iterations, learning_rate])
    with pytest.raises(ValueError, match="does not fit this state: rank 0: variable 0 .* has "
                                         "dtype int64, the commit float32 .*Delete the state"):
        swapped.sync()
    assert int(iterations.numpy()) == 0 and float(learning_rate.numpy()) == 0.5


def write_commit(folder, record):
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, f"commit-{socket.gethostname()}.pkl")
    with open(path, "wb") as f:
        pickle.dump(record, f)


@pytest.mark.parametrize("record, reason", [
    ({"format": 1, "values": [np.zeros(1, np.float32)], "attrs": {}}, "'commit' must be an int"),
    ({"format": 1, "commit": "3", "values": [np.zeros(1, np.float32)], "attrs": {}},
     "'commit' must be an int"),
    ({"format": 1, "commit": 3, "values": [[0.0]], "attrs": {}}, r"'values'\[0\] must be a numpy"),
    ({"format": 1, "commit": 3, "values": [np.zeros(1, np.float32)], "attrs": "x"},
     "'attrs' must be a dict"),
])
def test_a_hand_made_commit_gets_the_documented_error(state_dir, record, reason, rank):
    if rank == 0:
        write_commit(state_dir, record)
    bf.allreduce(tf.constant(0.0))  # written before any rank reads
    state = bf.elastic.TensorFlowState([tf.Variable([1.0])])
    with pytest.raises(ValueError, match=f"does not fit this state: rank 0: .*malformed: {reason}"
                                         ".*Delete the state folder"):
        state.sync()


def test_a_bad_commit_on_one_host_is_an_error_on_every_rank(tmp_path, monkeypatch, rank, size):
    # Each rank its own folder, as if on its own host; only the last one's file is bad.
    monkeypatch.setenv(elastic_env.ENV_STATE_DIR, str(tmp_path / f"rank{rank}"))
    if rank == size - 1:
        write_commit(str(tmp_path / f"rank{rank}"), {"format": 1, "values": [], "attrs": {}})
    state = bf.elastic.TensorFlowState([tf.Variable([1.0])])
    with pytest.raises(ValueError, match=f"host.* of rank.*{size - 1}.* does not fit this state: "
                                         f"rank {size - 1}: .*'commit' must be an int"):
        state.sync()


def test_a_load_that_fails_on_the_root_alone_is_an_error_on_every_rank(rank, size):
    v = tf.Variable([0.0])
    state = bf.elastic.TensorFlowState([v], step=0)
    state._commit_id = rank  # the last rank holds the newest commit, and loads it
    state.save()
    if rank == size - 1:
        def broken_load(snapshot):
            raise OSError("the disk went away")
        state._load = broken_load
    with pytest.raises(ValueError, match=f"rank {size - 1} could not load commit {size - 1}.*"
                                         "OSError: the disk went away.*Delete the state folder"):
        state.sync()


def test_host_update_notice_interrupts_the_next_commit_on_every_rank(rank, size):
    assert interrupts.install_handler()
    state = bf.elastic.ObjectState(step=0)
    state.commit()  # nothing pending
    if rank == size - 1:
        os.kill(os.getpid(), elastic_env.HOST_UPDATE_SIGNAL)
        time.sleep(0.1)  # Python runs the handler between bytecodes of the main thread
        assert interrupts.pending() >= 1
    with pytest.raises(bf.elastic.HostsUpdatedInterrupt, match="noticed by 1 rank"):
        state.commit()
    assert state.commits == 2  # the interrupted commit was saved first
    state.commit()  # the notice was consumed
    signal.signal(elastic_env.HOST_UPDATE_SIGNAL, signal.SIG_DFL)


def test_run_syncs_first_and_calls_reset_callbacks_only_after_a_restore(state_dir, rank):
    v = tf.Variable([float(rank)])
    state = bf.elastic.TensorFlowState([v], step=0)
    resets = []
    state.register_reset_callbacks([lambda: resets.append(bf.size())])

    @bf.elastic.run
    def train(state, steps):
        assert v.numpy()[0] == state.step  # rank 0's value (0) before the first step
        for _ in range(steps):
            v.assign_add([1.0])
            state.step += 1
            state.commit()
        return state.step

    assert train(state, 3) == 3
    assert resets == []  # a fresh start is not a reset
    assert train(state, 0) == 3  # nor is calling it again in the same processes
    # A later launch: a new state finds the commit, and the reset callbacks run.
    w = tf.Variable([-1.0])
    again = bf.elastic.TensorFlowState([w], step=0)
    again.register_reset_callbacks([lambda: resets.append(bf.size())])

    @bf.elastic.run
    def resume(state):
        return float(w.numpy()[0]), state.step

    assert resume(again) == (3.0, 3)
    assert resets == [bf.size()]


def test_run_lets_the_interrupt_through_without_an_elastic_bfrun(monkeypatch):
    monkeypatch.delenv(elastic_env.ENV_ELASTIC, raising=False)
    state = bf.elastic.ObjectState(step=0)

    @bf.elastic.run
    def train(state):
        raise bf.elastic.HostsUpdatedInterrupt("test")

    with pytest.raises(bf.elastic.HostsUpdatedInterrupt):
        train(state)


def make_model(seed=3):
    keras.utils.set_random_seed(seed)
    return keras.Sequential([keras.Input((3,)), keras.layers.Dense(2), keras.layers.Dense(1)])


def test_keras_state_holds_weights_and_optimizer_slots(rank):
    model = make_model(seed=rank)
    optimizer = keras.optimizers.Adam(0.01)
    state = bf.elastic.KerasState(model, optimizer, epoch=0)
    state.sync()  # builds the optimizer, then rank 0's weights and slots everywhere
    assert optimizer.built
    rows = gather(np.concatenate([np.ravel(w) for w in model.get_weights()]))
    np.testing.assert_array_equal(rows, np.repeat(rows[:1], rows.shape[0], axis=0))
    x = np.ones((4, 3), np.float32)
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(model(x) ** 2)
    grads = tape.gradient(loss, model.trainable_variables)
    optimizer.apply_gradients(zip(grads, model.trainable_variables))
    state.commit()
    saved = [v.numpy().copy() for v in model.weights + optimizer.variables]
    optimizer.apply_gradients(zip(grads, model.trainable_variables))
    state.restore()
    for v, want in zip(model.weights + optimizer.variables, saved):
        np.testing.assert_array_equal(v.numpy(), want)
    assert int(optimizer.iterations.numpy()) == 1


class Recorder(keras.callbacks.Callback):
    def __init__(self, state):
        super().__init__()
        self.state, self.seen = state, []

    def on_train_batch_end(self, batch, logs=None):
        self.seen.append((self.state.epoch, self.state.batch, self.state.commits))


def test_keras_callbacks_track_epoch_and_batch_and_commit(rank):
    model = make_model()
    model.compile(optimizer=bf.DistributedOptimizer(keras.optimizers.SGD(0.01)), loss="mse")
    state = bf.elastic.KerasState(model, epoch=0, batch=0)
    state.sync()
    recorder = Recorder(state)
    callbacks = [bf.elastic.UpdateBatchStateCallback(state),
                 bf.elastic.UpdateEpochStateCallback(state),
                 bf.elastic.CommitStateCallback(state, batches_per_commit=3), recorder]
    x = np.ones((8, 3), np.float32)
    y = np.zeros((8, 1), np.float32)
    model.fit(x, y, batch_size=2, epochs=2, initial_epoch=state.epoch, callbacks=callbacks,
              verbose=0)
    # 4 batches per epoch; commits after batches 3 and at each epoch end.
    assert recorder.seen == [(0, 1, 0), (0, 2, 0), (0, 3, 1), (0, 4, 1),
                             (1, 1, 2), (1, 2, 2), (1, 3, 3), (1, 4, 3)]
    assert (state.epoch, state.batch, state.commits) == (2, 0, 4)
    # Resuming mid-epoch: 2 batches of epoch 2 were done; this fit gets the other 2.
    state.epoch, state.batch = 2, 2
    recorder.seen.clear()
    model.fit(x[:4], y[:4], batch_size=2, epochs=3, initial_epoch=2, callbacks=callbacks,
              verbose=0)
    assert [s[1] for s in recorder.seen] == [3, 4]
    assert (state.epoch, state.batch) == (3, 0)
    # Horovod's examples resume with fit(epochs=total - state.epoch), counted from 0: the
    # state still counts the epochs of the whole training.
    model.fit(x, y, batch_size=2, epochs=5 - state.epoch, callbacks=callbacks, verbose=0)
    assert (state.epoch, state.batch) == (5, 0)


def test_mistakes_get_clear_errors():
    with pytest.raises(ValueError, match="method names of the state"):
        bf.elastic.ObjectState(commit=1)
    with pytest.raises(TypeError, match="not a tf.Variable"):
        bf.elastic.TensorFlowState([1.0])
    with pytest.raises(TypeError, match="expected a keras.Model"):
        bf.elastic.KerasState("model")
    with pytest.raises(ValueError, match="nothing was saved"):
        bf.elastic.ObjectState(step=0).restore()
    with pytest.raises(ValueError, match="batches_per_commit must be an int >= 1"):
        bf.elastic.CommitStateCallback(bf.elastic.ObjectState(), batches_per_commit=0)
    with pytest.raises(ValueError, match="no 'batch' attribute"):
        bf.elastic.UpdateBatchStateCallback(bf.elastic.ObjectState(epoch=0))
    with pytest.raises(TypeError, match="not callable"):
        bf.elastic.ObjectState().register_reset_callbacks([1])
    with pytest.raises(TypeError, match="must be a bf.elastic State"):
        bf.elastic.run(lambda s: s)(object())
    unbuilt = keras.Sequential([keras.layers.Dense(1)])
    with pytest.raises(ValueError, match="no weights yet; build it first"):
        bf.elastic.KerasState(unbuilt).sync()
