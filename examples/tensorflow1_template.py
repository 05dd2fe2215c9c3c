"""Horovod's four-step TF1 template, as written, on scikit-learn's digits.

    1. hvd.init()
    2. config.gpu_options.visible_device_list = str(hvd.local_rank())
    3. opt = hvd.DistributedOptimizer(opt)
    4. hooks = [hvd.BroadcastGlobalVariablesHook(0)], with MonitoredTrainingSession

Run: mpiexec -n 2 python examples/tensorflow1_template.py --steps 600
Reaches a test accuracy of about 0.98 (needs >= 0.90 to exit 0) in 600 steps at 2 ranks.
"""

import argparse
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import horovodlite.tensorflow as hvd  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from sklearn.datasets import load_digits  # noqa: E402

tf1 = tf.compat.v1
tf1.disable_eager_execution()

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--steps", type=int, default=600, help="training steps")
parser.add_argument("--batch-size", type=int, default=32, help="per rank")
parser.add_argument("--lr", type=float, default=0.05, help="per rank; scaled by the size")
parser.add_argument("--target", type=float, default=0.90, help="test accuracy to reach")
args = parser.parse_args()

# 1. Initialize horovodlite.
hvd.init()
tf1.set_random_seed(1000 + hvd.rank())  # different on purpose: the hook fixes it

# 2. Pin one GPU per process (harmless on a CPU-only machine).
config = tf1.ConfigProto()
config.gpu_options.visible_device_list = str(hvd.local_rank())

digits = load_digits()
x = (digits.data / 16.0).astype("float32")
y = digits.target.astype("int64")
order = np.random.default_rng(0).permutation(len(x))
x, y = x[order], y[order]
x_train, y_train, x_test, y_test = x[:1400], y[:1400], x[1400:], y[1400:]
x_shard, y_shard = x_train[hvd.rank() :: hvd.size()], y_train[hvd.rank() :: hvd.size()]

images = tf1.placeholder(tf.float32, [None, 64])
labels = tf1.placeholder(tf.int64, [None])


def dense(inputs, units, name):
    w = tf1.get_variable(f"{name}_w", [inputs.shape[1], units])
    b = tf1.get_variable(f"{name}_b", [units], initializer=tf1.zeros_initializer())
    return tf.matmul(inputs, w) + b


logits = dense(tf.nn.relu(dense(images, 64, "hidden")), 10, "out")
loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits))
accuracy = tf.reduce_mean(tf.cast(tf.equal(tf.argmax(logits, 1), labels), tf.float32))

# 3. Scale the learning rate by the number of ranks, and wrap the optimizer.
opt = tf1.train.MomentumOptimizer(args.lr * hvd.size(), momentum=0.9)
opt = hvd.DistributedOptimizer(opt)
global_step = tf1.train.get_or_create_global_step()
train_op = opt.minimize(loss, global_step=global_step)


class TestAccuracy(tf1.train.SessionRunHook):
    """Measure the test accuracy when the session ends."""

    def end(self, session):
        self.result = session.run(accuracy, {images: x_test, labels: y_test})


# 4. Broadcast rank 0's initial variables; only rank 0 writes checkpoints.
test_accuracy = TestAccuracy()
hooks = [
    hvd.BroadcastGlobalVariablesHook(0),
    tf1.train.StopAtStepHook(last_step=args.steps),
    test_accuracy,
]
checkpoint_dir = None  # e.g. "/tmp/train_logs" if hvd.rank() == 0 else None

rng = np.random.default_rng(hvd.rank())
with tf1.train.MonitoredTrainingSession(
    checkpoint_dir=checkpoint_dir, config=config, hooks=hooks
) as session:
    while not session.should_stop():
        batch = rng.integers(0, len(x_shard), args.batch_size)
        session.run(train_op, {images: x_shard[batch], labels: y_shard[batch]})

result = test_accuracy.result
if hvd.rank() == 0:
    print(f"test accuracy {result:.4f} on {hvd.size()} ranks")
if result < args.target:
    raise SystemExit(f"test accuracy {result:.4f} is below the target {args.target}")
