"""Keras 3 model.fit on scikit-learn's digits, data-parallel with horovodlite.keras.

Each rank trains on its own shard; gradients are averaged by the DistributedOptimizer; the
callbacks start every rank from rank 0's weights, warm the learning rate up, and average the
logged metrics. Works with KERAS_BACKEND=tensorflow (default) or torch.

Run: mpiexec -n 2 python examples/keras_digits.py --epochs 10
Reaches a test accuracy of about 0.96 (needs >= 0.90 to exit 0) in 10 epochs at 2 ranks.
"""

import argparse
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import horovodlite.keras as hvd  # noqa: E402
import keras  # noqa: E402
import numpy as np  # noqa: E402
from sklearn.datasets import load_digits  # noqa: E402

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--epochs", type=int, default=10)
parser.add_argument("--batch-size", type=int, default=32, help="per rank")
parser.add_argument("--lr", type=float, default=0.05, help="per rank; scaled by the size")
parser.add_argument("--target", type=float, default=0.90, help="test accuracy to reach")
args = parser.parse_args()

# 1. Initialize horovodlite.
hvd.init()

# The same split on every rank, then each rank keeps every size-th training example.
digits = load_digits()
x = (digits.data / 16.0).astype("float32")
y = digits.target.astype("int64")
order = np.random.default_rng(0).permutation(len(x))
x, y = x[order], y[order]
x_train, y_train, x_test, y_test = x[:1400], y[:1400], x[1400:], y[1400:]
x_shard, y_shard = x_train[hvd.rank() :: hvd.size()], y_train[hvd.rank() :: hvd.size()]

keras.utils.set_random_seed(1000 + hvd.rank())  # different on purpose: the callback fixes it
model = keras.Sequential(
    [
        keras.Input((64,)),
        keras.layers.Dense(64, activation="relu"),
        keras.layers.Dense(10, activation="softmax"),
    ]
)

# 2. Scale the learning rate by the number of ranks, and wrap the optimizer.
lr = args.lr * hvd.size()
optimizer = hvd.DistributedOptimizer(keras.optimizers.SGD(lr, momentum=0.9))
model.compile(optimizer, "sparse_categorical_crossentropy", metrics=["accuracy"])

# 3. Start from rank 0's weights, average metrics, warm the learning rate up.
callbacks = [
    hvd.callbacks.BroadcastGlobalVariablesCallback(0),
    hvd.callbacks.MetricAverageCallback(),
    hvd.callbacks.LearningRateWarmupCallback(initial_lr=lr, warmup_epochs=3, verbose=0),
]
model.fit(
    x_shard,
    y_shard,
    batch_size=args.batch_size,
    epochs=args.epochs,
    callbacks=callbacks,
    verbose=2 if hvd.rank() == 0 else 0,
)

_, accuracy = model.evaluate(x_test, y_test, verbose=0)
if hvd.rank() == 0:
    print(f"test accuracy {accuracy:.4f} on {hvd.size()} ranks ({keras.backend.backend()})")
if accuracy < args.target:
    raise SystemExit(f"test accuracy {accuracy:.4f} is below the target {args.target}")
