"""Keras model.fit with the elastic callbacks: argv: epochs, the epoch in which every rank dies
after its second batch (-1: never). Four batches per epoch, a commit at each epoch's end."""

import os
import sys

import horovodlite.keras as hvd
import keras
import numpy as np

epochs, die_in = int(sys.argv[1]), int(sys.argv[2])
hvd.init()
keras.utils.set_random_seed(hvd.rank())  # rank 0's weights win at the first sync
model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2), keras.layers.Dense(1)])
optimizer = hvd.DistributedOptimizer(keras.optimizers.SGD(0.05, momentum=0.9))
model.compile(optimizer=optimizer, loss="mse")
rng = np.random.default_rng(10 + hvd.rank())
x, y = rng.normal(size=(16, 3)), rng.normal(size=(16, 1))
state = hvd.elastic.KerasState(model, epoch=0, batch=0)


class Die(keras.callbacks.Callback):
    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_end(self, batch, logs=None):
        if self.epoch == die_in and batch == 1:
            os._exit(3)


@hvd.elastic.run
def train(state):
    print(f"rank {hvd.rank()} starts at epoch {state.epoch}", flush=True)
    callbacks = [
        hvd.elastic.CommitStateCallback(state, batches_per_commit=4),
        hvd.elastic.UpdateBatchStateCallback(state),
        hvd.elastic.UpdateEpochStateCallback(state),
        Die(),
    ]
    model.fit(x, y, batch_size=4, initial_epoch=state.epoch, epochs=epochs, shuffle=False,
              callbacks=callbacks, verbose=0)  # fmt: skip


train(state)
if hvd.rank() == 0:
    weights = np.concatenate([w.ravel() for w in model.get_weights()])
    print("weights", ", ".join(f"{w:.9e}" for w in weights), flush=True)
