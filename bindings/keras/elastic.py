"""hvd.elastic for Keras 3: KerasState and the callbacks that commit during `model.fit`.

Glue on horovodlite.training.elastic: how a model's and an optimizer's variables are saved
(numpy copies, picklable), restored (assigned) and synced (broadcast from rank 0). Works on
the tensorflow and torch backends, as horovodlite.keras does.
"""

import numpy as np

import keras
from horovodlite.training.elastic import *  # noqa: F403 (SHARED: run, State, ...)
from horovodlite.training.elastic import SHARED, HandlerState, State, StateHandler

from .functions import broadcast_variables

__all__ = [
    *SHARED,
    "KerasState",
    "CommitStateCallback",
    "UpdateBatchStateCallback",
    "UpdateEpochStateCallback",
    "VariablesHandler",
    "keras_handler_for",
]


class VariablesHandler(StateHandler):
    """Commits a list of variables (anything with `.numpy()` and `.assign()`) as numpy copies.

    Args:
        value: the object committed (a model, an optimizer, a list of variables).
        variables: returns its variables, in an order that is the same on every rank.
        broadcast: `broadcast(variables, root_rank)`, the framework's in-place broadcast.
        build: called before a restore if the object has fewer variables than the commit
            (a Keras optimizer creates its slots lazily).
    """

    def __init__(self, value, variables, broadcast, build=None):
        self._variables, self._broadcast, self._build = variables, broadcast, build
        super().__init__(value)

    def save(self) -> None:
        self.saved = [np.array(v.numpy(), copy=True) for v in self._variables(self.value)]

    def restore(self) -> None:
        variables = self._variables(self.value)
        if len(variables) < len(self.saved) and self._build is not None:
            self._build(self.value)
            variables = self._variables(self.value)
        if len(variables) != len(self.saved):
            raise ValueError(
                f"cannot restore {type(self.value).__name__}: it has {len(variables)} "
                f"variables, the commit {len(self.saved)}"
            )
        for variable, array in zip(variables, self.saved):
            variable.assign(array)

    def sync(self) -> None:
        variables = self._variables(self.value)
        if variables:
            self._broadcast(variables, 0)


def keras_handler_for(model, optimizer, broadcast):
    """Return HandlerState's `handler_for`: the model's and the optimizer's handlers."""

    def handler_for(value):
        if value is model:
            return VariablesHandler(model, lambda m: list(m.variables), broadcast)
        if value is optimizer:
            return VariablesHandler(
                optimizer, lambda o: list(o.variables), broadcast, _builder(model)
            )
        return None

    return handler_for


def _builder(model):
    def build(optimizer):
        if not optimizer.built:
            optimizer.build(model.trainable_variables)

    return build


class KerasState(HandlerState):
    """Horovod's KerasState: a Keras model, its optimizer, and any picklable attributes.

    `commit()` keeps numpy copies of the model's and the optimizer's (default:
    `model.optimizer`) variables, `sync()` broadcasts them from rank 0, `restore()` assigns the
    last commit (building the optimizer's slots first if they do not exist yet). `backend` is
    accepted for Horovod.
    """

    def __init__(self, model, optimizer=None, backend=None, **kwargs):
        optimizer = optimizer if optimizer is not None else getattr(model, "optimizer", None)
        handler_for = keras_handler_for(model, optimizer, broadcast_variables)
        super().__init__(handler_for, model=model, optimizer=optimizer, **kwargs)


class CommitStateCallback(keras.callbacks.Callback):
    """Commit `state` every `batches_per_commit` batches (and so check for new hosts).

    A commit due at an epoch's last batch happens when the next epoch begins (or training
    ends) instead, after every callback's `on_epoch_end`: it then holds the finished epoch's
    number (UpdateEpochStateCallback), whatever the order of the callbacks.
    """

    def __init__(self, state: State, batches_per_commit: int = 1):
        super().__init__()
        if batches_per_commit < 1:
            raise ValueError(f"batches_per_commit must be at least 1, got {batches_per_commit}")
        self.state, self.batches_per_commit = state, batches_per_commit
        self.batches_remaining = batches_per_commit
        self._due = False

    def on_train_batch_end(self, batch, logs=None):
        self.batches_remaining -= 1
        if self.batches_remaining == 0:
            self.batches_remaining = self.batches_per_commit
            if batch + 1 == (self.params or {}).get("steps"):
                self._due = True
            else:
                self.state.commit()

    def on_epoch_begin(self, epoch, logs=None):
        self._commit_if_due()

    def on_train_end(self, logs=None):
        self._commit_if_due()

    def _commit_if_due(self):
        if self._due:
            self._due = False
            self.state.commit()


class UpdateBatchStateCallback(keras.callbacks.Callback):
    """Keep `state.batch` at the number of batches done in the current epoch (0 at its end)."""

    def __init__(self, state: State):
        super().__init__()
        self.state = state

    def on_train_batch_end(self, batch, logs=None):
        self.state.batch = batch + 1

    def on_epoch_end(self, epoch, logs=None):
        self.state.batch = 0


class UpdateEpochStateCallback(keras.callbacks.Callback):
    """Keep `state.epoch` at the number of epochs done, across restarts.

    Works with both ways to resume: `fit(initial_epoch=state.epoch, epochs=total)` and
    Horovod's `fit(epochs=total - state.epoch)`.
    """

    def __init__(self, state: State):
        super().__init__()
        self.state = state
        self._offset = None

    def on_train_begin(self, logs=None):
        self._offset = None

    def on_epoch_begin(self, epoch, logs=None):
        if self._offset is None:  # fit's first epoch is the one the state says comes next
            self._offset = self.state.epoch - epoch

    def on_epoch_end(self, epoch, logs=None):
        self.state.epoch = self._offset + epoch + 1
