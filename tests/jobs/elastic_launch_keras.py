"""Keras model.fit with the elastic callbacks under the elastic launcher.

    elastic_launch_keras.py OUT EPOCHS KILL_EPOCH

Four batches an epoch, a commit at each epoch's end. On the first run rank 1 SIGKILLs itself
after the second batch of epoch KILL_EPOCH. Every rank appends `restart=R size=S rank=r
start=E` to OUT/starts.txt as it enters the training function, and `epoch=E` to
OUT/epochs-R.txt at each epoch's end; rank 0 writes the final weights to OUT/weights.txt.
"""

import os
import signal
import sys

import horovodlite.keras as hvd
import keras
import numpy as np

out, epochs, kill_epoch = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
hvd.init()
restart = int(os.environ.get("HOROVODLITE_ELASTIC_RESTART", "0"))
keras.utils.set_random_seed(0)
model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(4), keras.layers.Dense(1)])
model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.05)), loss="mse")
rng = np.random.default_rng(7 + hvd.rank())
x, y = rng.normal(size=(16, 3)), rng.normal(size=(16, 1))
state = hvd.elastic.KerasState(model, epoch=0, batch=0)


class Record(keras.callbacks.Callback):
    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_end(self, batch, logs=None):
        if restart == 0 and self.epoch == kill_epoch and batch == 1 and hvd.rank() == 1:
            os.kill(os.getpid(), signal.SIGKILL)

    def on_epoch_end(self, epoch, logs=None):
        with open(os.path.join(out, f"epochs-{restart}.txt"), "a") as f:
            f.write(f"epoch={epoch} rank={hvd.rank()}\n")


@hvd.elastic.run
def train(state):
    with open(os.path.join(out, "starts.txt"), "a") as f:
        f.write(f"restart={restart} size={hvd.size()} rank={hvd.rank()} start={state.epoch}\n")
    callbacks = [
        hvd.elastic.CommitStateCallback(state, batches_per_commit=4),
        hvd.elastic.UpdateBatchStateCallback(state),
        hvd.elastic.UpdateEpochStateCallback(state),
        Record(),
    ]
    model.fit(x, y, batch_size=4, initial_epoch=state.epoch, epochs=epochs, shuffle=False,
              callbacks=callbacks, verbose=0)  # fmt: skip


train(state)
if hvd.rank() == 0:
    weights = np.concatenate([w.ravel() for w in model.get_weights()])
    with open(os.path.join(out, "weights.txt"), "w") as f:
        f.write(" ".join(repr(float(w)) for w in weights))
