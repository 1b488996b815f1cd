"""Keras callbacks that keep a ``bf.elastic.KerasState`` current during ``model.fit``
(Horovod's ``CommitStateCallback``, ``UpdateBatchStateCallback``, ``UpdateEpochStateCallback``).

List them in this order: the two update callbacks, then ``CommitStateCallback``, so that a
commit records the batch and epoch just finished.
"""

from __future__ import annotations

import keras

from bluefog.tensorflow.elastic.state import State


def _check_state(state, who: str) -> State:
    if not isinstance(state, State):
        raise TypeError(f"bluefog elastic {who}: expected a bf.elastic State, got "
                        f"{type(state).__name__}")
    return state


class CommitStateCallback(keras.callbacks.Callback):
    """Commits ``state`` every ``batches_per_commit`` batches and at the end of every epoch."""

    def __init__(self, state: State, batches_per_commit: int = 1):
        super().__init__()
        self.state = _check_state(state, "CommitStateCallback")
        if (isinstance(batches_per_commit, bool) or not isinstance(batches_per_commit, int)
                or batches_per_commit < 1):
            raise ValueError(f"bluefog elastic CommitStateCallback: batches_per_commit must be "
                             f"an int >= 1, got {batches_per_commit!r}")
        self.batches_per_commit = batches_per_commit
        self._since = 0

    def on_train_batch_end(self, batch, logs=None):
        self._since += 1
        if self._since >= self.batches_per_commit:
            self._since = 0
            self.state.commit()

    def on_epoch_end(self, epoch, logs=None):
        self._since = 0
        self.state.commit()


class UpdateBatchStateCallback(keras.callbacks.Callback):
    """Keeps ``state.batch`` = the batches finished in the current epoch (0 at its end).

    When ``fit`` starts while ``state.batch`` > 0 (a launch resumed mid-epoch, and the data
    given to this ``fit`` skips those batches), the count continues from there."""

    def __init__(self, state: State):
        super().__init__()
        self.state = _check_state(state, "UpdateBatchStateCallback")
        if not hasattr(state, "batch"):
            raise ValueError("bluefog elastic UpdateBatchStateCallback: the state has no "
                             "'batch' attribute; create it with batch=0")
        self._offset = 0
        self._first_epoch = True

    def on_train_begin(self, logs=None):
        self._first_epoch = True

    def on_epoch_begin(self, epoch, logs=None):
        self._offset = self.state.batch if self._first_epoch else 0
        self._first_epoch = False

    def on_train_batch_end(self, batch, logs=None):
        self.state.batch = self._offset + batch + 1

    def on_epoch_end(self, epoch, logs=None):
        self.state.batch = 0


class UpdateEpochStateCallback(keras.callbacks.Callback):
    """Keeps ``state.epoch`` = the epochs finished, whether ``fit`` resumes with
    ``initial_epoch=state.epoch`` or, as in Horovod's examples, runs ``epochs -
    state.epoch`` epochs counted from 0."""

    def __init__(self, state: State):
        super().__init__()
        self.state = _check_state(state, "UpdateEpochStateCallback")
        if not hasattr(state, "epoch"):
            raise ValueError("bluefog elastic UpdateEpochStateCallback: the state has no "
                             "'epoch' attribute; create it with epoch=0")
        self._offset = None

    def on_train_begin(self, logs=None):
        self._offset = None

    def on_epoch_begin(self, epoch, logs=None):
        # fit's first epoch is 0 (counted from 0) or state.epoch (initial_epoch given).
        if self._offset is None:
            self._offset = self.state.epoch - epoch if epoch in (0, self.state.epoch) else 0

    def on_epoch_end(self, epoch, logs=None):
        self.state.epoch = (self._offset or 0) + epoch + 1
