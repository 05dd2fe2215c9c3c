"""Keras callbacks for data-parallel training: start in step, agree on metrics, scale the lr."""

import numpy as np

import horovodlite as core
import keras
from horovodlite.process_sets import global_process_set
from horovodlite.training import LocalVariables

from .functions import broadcast_variables

__all__ = [
    "BroadcastGlobalVariablesCallback",
    "MetricAverageCallback",
    "LearningRateScheduleCallback",
    "LearningRateWarmupCallback",
    "BestModelCheckpoint",
]


class BroadcastGlobalVariablesCallback(keras.callbacks.Callback):
    """Make every rank start from `root_rank`'s model and optimizer variables.

    Broadcasts once, at the start of training, before the first step: the model's weights and
    the optimizer's variables, which it builds first if `fit` has not (Keras 3 builds them in the
    first step on the tensorflow backend; building takes no step). So n ranks train exactly as
    one process from `root_rank`'s weights. Only a model that `fit` itself builds in its first
    step (no `keras.Input`, not built) has nothing to broadcast before it: then the broadcast
    follows the first batch, as Horovod's does, and that batch's update averages gradients
    taken at different weights. The model variables in `local_variables` (a variable or a
    list), or registered with `register_local_var`, keep each rank's value; the optimizer's
    variables are all broadcast, as in Horovod.

    Raises:
        TypeError: an entry of `local_variables` is not a variable.
    """

    def __init__(self, root_rank, device="", local_variables=None, process_set=global_process_set):
        super().__init__()
        self.root_rank, self.process_set = root_rank, process_set
        self.broadcast_done = False
        self._local = LocalVariables()
        if local_variables is None:
            local_variables = []
        elif hasattr(local_variables, "assign"):
            local_variables = [local_variables]
        for variable in local_variables:
            self.register_local_var(variable)

    def register_local_var(self, var):
        """Leave the model variable `var` out of the broadcast: it keeps each rank's value."""
        if not hasattr(var, "assign"):
            raise TypeError(
                "local_variables must be variables (model.variables entries), got "
                f"{type(var).__name__}"
            )
        self._local.add(var)

    def _broadcast(self):
        optimizer = getattr(self.model, "optimizer", None)
        variables = [v for v in self.model.variables if v not in self._local]
        if optimizer is not None:
            variables += list(optimizer.variables)
        broadcast_variables(variables, self.root_rank, process_set=self.process_set)
        self.broadcast_done = True

    def on_train_begin(self, logs=None):
        if self.broadcast_done or not self.model.built:
            return
        optimizer = getattr(self.model, "optimizer", None)
        if optimizer is not None and not optimizer.built:
            # With the variables fit gives it: the slots and the step count it would create in
            # the first step, so that step finds them built and broadcast.
            optimizer.build(self.model.trainable_variables)
        self._broadcast()

    def on_train_batch_end(self, batch, logs=None):
        if not self.broadcast_done:  # only a model that the first step built
            self._broadcast()


class MetricAverageCallback(keras.callbacks.Callback):
    """Average the epoch's logged metrics over the ranks, so every rank logs the same numbers.

    Put it before callbacks that read the metrics (checkpoints, early stopping, the lr
    schedule on plateau): they then see the averages.
    """

    def __init__(self, device="", process_set=global_process_set):
        super().__init__()
        self.process_set = process_set

    def on_epoch_end(self, epoch, logs=None):
        if logs is None:
            return
        names = sorted(k for k, v in logs.items() if np.ndim(v) == 0 and _is_number(v))
        everyone = core.allgather_object(names, process_set=self.process_set)
        if any(theirs != names for theirs in everyone):
            ranks = self.process_set.ranks if self.process_set.process_set_id else None
            detail = "; ".join(
                f"rank {ranks[i] if ranks else i}: {theirs}" for i, theirs in enumerate(everyone)
            )
            raise ValueError(
                f"MetricAverageCallback needs the same metrics on every rank, got {detail}: "
                "compile the same metrics everywhere and validate on every rank"
            )
        if not names:
            return
        values = np.array([float(logs[k]) for k in names], dtype=np.float64)
        averaged = core.allreduce(
            values, op=core.Average, name="metric_average", process_set=self.process_set
        )
        for name, value in zip(names, averaged):
            logs[name] = float(value)


def _is_number(value) -> bool:
    try:
        float(value)
    except (TypeError, ValueError):
        return False
    return True


def _get(optimizer_attr) -> float:
    return float(keras.ops.convert_to_numpy(optimizer_attr))


class LearningRateScheduleCallback(keras.callbacks.Callback):
    """Set the learning rate to `initial_lr * multiplier(epoch)` from start_epoch to end_epoch.

    Args:
        initial_lr: the learning rate the multiplier scales (required).
        multiplier: a number, or a function of the (fractional) epoch.
        start_epoch, end_epoch: the epochs [start, end) it acts on (end None: to the end).
        staircase: change once per epoch; else every batch, by fractional epoch.
        momentum_correction: scale the optimizer's `momentum` by new_lr / old_lr for the batch
            in which the learning rate changes (Goyal et al., 2017). Keras 3 reads `momentum`
            as a constant when it compiles the train step, so this takes effect where the step
            runs eagerly (the torch backend, run_eagerly=True).
        steps_per_epoch: batches per epoch; needed when staircase is False (default: from fit).
    """

    def __init__(
        self,
        initial_lr,
        multiplier,
        start_epoch=0,
        end_epoch=None,
        staircase=True,
        momentum_correction=True,
        steps_per_epoch=None,
    ):
        super().__init__()
        if initial_lr is None:
            raise ValueError("initial_lr is required: pass the learning rate to scale")
        self.initial_lr = initial_lr
        self.start_epoch, self.end_epoch = start_epoch, end_epoch
        self.staircase, self.momentum_correction = staircase, momentum_correction
        self.steps_per_epoch = steps_per_epoch
        self.restore_momentum = None
        self.current_epoch = None
        if callable(multiplier):
            self.multiplier = multiplier
        else:
            self.staircase = True
            self.multiplier = lambda epoch: multiplier

    def _autodetect_steps_per_epoch(self) -> int:
        steps = (self.params or {}).get("steps")
        if steps:
            return steps
        raise ValueError(
            f"{type(self).__name__} cannot tell the number of steps per epoch: pass "
            "steps_per_epoch="
        )

    def _adjust_learning_rate(self, epoch) -> None:
        optimizer = self.model.optimizer
        old_lr = _get(optimizer.learning_rate)
        new_lr = self.initial_lr * self.multiplier(epoch)
        optimizer.learning_rate = new_lr
        if self.momentum_correction and getattr(optimizer, "momentum", None) and old_lr:
            self.restore_momentum = optimizer.momentum
            optimizer.momentum = self.restore_momentum * new_lr / old_lr

    def _restore_momentum_if_needed(self) -> None:
        if self.restore_momentum is not None:
            self.model.optimizer.momentum = self.restore_momentum
            self.restore_momentum = None

    def on_train_begin(self, logs=None):
        if not self.staircase and not self.steps_per_epoch:
            self.steps_per_epoch = self._autodetect_steps_per_epoch()

    def on_epoch_begin(self, epoch, logs=None):
        self.current_epoch = epoch

    def on_train_batch_begin(self, batch, logs=None):
        if self.current_epoch < self.start_epoch or (
            self.end_epoch is not None and self.current_epoch >= self.end_epoch
        ):
            return
        if self.staircase and batch == 0:
            self._adjust_learning_rate(self.current_epoch)
        elif not self.staircase:
            self._adjust_learning_rate(self.current_epoch + float(batch) / self.steps_per_epoch)

    def on_train_batch_end(self, batch, logs=None):
        self._restore_momentum_if_needed()

    def on_epoch_end(self, epoch, logs=None):
        if logs is not None:
            logs["lr"] = _get(self.model.optimizer.learning_rate)


class LearningRateWarmupCallback(LearningRateScheduleCallback):
    """Ramp the learning rate from `initial_lr / size` to `initial_lr` over warmup_epochs.

    Horovod's formula: at fractional epoch e (counted so that each epoch ends on a round
    number), lr = initial_lr / size * (e * (size - 1) / warmup_epochs + 1).
    """

    def __init__(
        self, initial_lr, warmup_epochs=5, momentum_correction=True, steps_per_epoch=None, verbose=0
    ):
        def multiplier(epoch):
            epoch += 1.0 / self.steps_per_epoch
            size = core.size()
            return 1.0 / size * (epoch * (size - 1) / warmup_epochs + 1)

        super().__init__(
            initial_lr,
            multiplier,
            start_epoch=0,
            end_epoch=warmup_epochs,
            staircase=False,
            momentum_correction=momentum_correction,
            steps_per_epoch=steps_per_epoch,
        )
        self.verbose = verbose

    def on_epoch_end(self, epoch, logs=None):
        super().on_epoch_end(epoch, logs)
        if epoch == self.end_epoch - 1 and self.verbose > 0:
            lr = _get(self.model.optimizer.learning_rate)
            print(f"\nEpoch {epoch + 1}: finished gradual learning rate warmup to {lr:g}.")


class BestModelCheckpoint(keras.callbacks.ModelCheckpoint):
    """Save the best model so far (by `monitor`) to `filepath`, on rank 0 only."""

    def __init__(
        self,
        monitor="val_loss",
        verbose=0,
        mode="auto",
        save_freq="epoch",
        filepath="best_model.keras",
    ):
        super().__init__(
            filepath,
            monitor=monitor,
            verbose=verbose,
            save_best_only=True,
            mode=mode,
            save_freq=save_freq,
        )

    def on_train_batch_end(self, batch, logs=None):
        if core.rank() == 0:
            super().on_train_batch_end(batch, logs)

    def on_epoch_end(self, epoch, logs=None):
        if core.rank() == 0:
            super().on_epoch_end(epoch, logs)
