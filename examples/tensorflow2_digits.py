"""A TensorFlow 2 custom training loop on scikit-learn's digits with DistributedGradientTape.

Run: mpiexec -n 2 python examples/tensorflow2_digits.py --epochs 10
Reaches a test accuracy of about 0.97 (needs >= 0.90 to exit 0) in 10 epochs at 2 ranks.
"""

import argparse
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import horovodlite.tensorflow as hvd  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from sklearn.datasets import load_digits  # noqa: E402

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--epochs", type=int, default=10)
parser.add_argument("--batch-size", type=int, default=32, help="per rank")
parser.add_argument("--lr", type=float, default=0.05, help="per rank; scaled by the size")
parser.add_argument("--target", type=float, default=0.90, help="test accuracy to reach")
args = parser.parse_args()

hvd.init()

digits = load_digits()
x = (digits.data / 16.0).astype("float32")
y = digits.target.astype("int64")
order = np.random.default_rng(0).permutation(len(x))
x, y = x[order], y[order]
x_train, y_train, x_test, y_test = x[:1400], y[:1400], x[1400:], y[1400:]
shard = tf.data.Dataset.from_tensor_slices((x_train, y_train)).shard(hvd.size(), hvd.rank())
batches = shard.shuffle(1000, seed=hvd.rank()).batch(args.batch_size)

tf.random.set_seed(1000 + hvd.rank())  # different on purpose: broadcast_variables fixes it
model = tf.keras.Sequential(
    [
        tf.keras.Input((64,)),
        tf.keras.layers.Dense(64, activation="relu"),
        tf.keras.layers.Dense(10),
    ]
)
loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
optimizer = tf.keras.optimizers.SGD(args.lr * hvd.size(), momentum=0.9)
optimizer.build(model.trainable_variables)
hvd.broadcast_variables(model.variables, root_rank=0)
hvd.broadcast_variables(optimizer.variables, root_rank=0)


@tf.function
def train_step(images, labels):
    with tf.GradientTape() as tape:
        loss = loss_fn(labels, model(images, training=True))
    tape = hvd.DistributedGradientTape(tape)
    grads = tape.gradient(loss, model.trainable_variables)
    optimizer.apply_gradients(zip(grads, model.trainable_variables))
    return loss


# Every rank must run the same number of steps: the shortest shard decides.
steps = hvd.allreduce(tf.constant(len(list(batches))), op=hvd.Min).numpy()
for epoch in range(args.epochs):
    for images, labels in batches.take(steps):
        loss = train_step(images, labels)
    mean_loss = hvd.allreduce(loss).numpy()
    if hvd.rank() == 0 and (epoch + 1) % 5 == 0:
        print(f"epoch {epoch + 1}: loss {mean_loss:.4f}")

logits = model(x_test)
accuracy = float(np.mean(np.argmax(logits, axis=1) == y_test))
if hvd.rank() == 0:
    print(f"test accuracy {accuracy:.4f} on {hvd.size()} ranks")
if accuracy < args.target:
    raise SystemExit(f"test accuracy {accuracy:.4f} is below the target {args.target}")
