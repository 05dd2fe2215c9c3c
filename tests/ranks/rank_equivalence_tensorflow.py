"""The guarantee for TensorFlow: n ranks train exactly as one process on the whole batch.

Every rank starts from different initial weights; after the documented broadcast (the
variables before the first step in TF2, BroadcastGlobalVariablesHook in TF1), training with
DistributedGradientTape (eagerly and in tf.function) or the TF1 DistributedOptimizer ends
where one process ends after the same steps on the concatenated batch from rank 0's initial
weights, to 1e-9 in float64. (Eagerly with one optimizer: the ops are the same.)
"""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import numpy as np  # noqa: E402
import pytest  # noqa: E402

tf = pytest.importorskip("tensorflow")
hvd = pytest.importorskip("horovodlite.tensorflow")
keras = pytest.importorskip("keras")

tf1 = tf.compat.v1
TOLERANCE = 1e-9

OPTIMIZERS = {
    "sgd": lambda: keras.optimizers.SGD(0.05, momentum=0.9, nesterov=True, weight_decay=0.01),
    "adam": lambda: keras.optimizers.Adam(0.01, weight_decay=0.01),
    "adamw": lambda: keras.optimizers.AdamW(0.01, weight_decay=0.05),
    "rmsprop": lambda: keras.optimizers.RMSprop(0.01, momentum=0.5, weight_decay=0.01),
    "adagrad": lambda: keras.optimizers.Adagrad(0.1, weight_decay=0.01),
    "lion": lambda: keras.optimizers.Lion(0.01, weight_decay=0.05),
}
TF1_OPTIMIZERS = {
    "momentum": lambda: tf1.train.MomentumOptimizer(0.05, momentum=0.9),
    "adam": lambda: tf1.train.AdamOptimizer(0.01),
}


def _weights(seed: int) -> list:
    rng = np.random.default_rng(seed)
    return [rng.normal(size=(4, 5)), rng.normal(size=5), rng.normal(size=(5, 1))]


def _predict(w, x):
    return tf.matmul(tf.tanh(tf.matmul(x, w[0]) + w[1]), w[2])


def _data(steps: int, rows: int, seed: int):
    rng = np.random.default_rng(seed)
    n = hvd.size()
    return rng.normal(size=(steps, n * rows, 4)), rng.normal(size=(steps, n * rows, 1))


def _rows(array, step: int, rows: int):
    r = hvd.rank()
    return array[step, r * rows : (r + 1) * rows]


def _largest_difference(got: list, want: list) -> float:
    here = max(float(np.max(np.abs(np.asarray(a) - b))) for a, b in zip(got, want))
    return max(hvd.allgather_object(here))


def _tape_step(variables, optimizer, x, y, *, distributed: bool):
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean((_predict(variables, x) - y) ** 2)
    if distributed:
        tape = hvd.DistributedGradientTape(tape)
    grads = tape.gradient(loss, variables)
    optimizer.apply_gradients(zip(grads, variables))


def tape_difference(make_optimizer, *, function: bool, rows=3, steps=3, seed=5) -> float:
    """Train with DistributedGradientTape and in one process; return the largest difference."""
    x, y = _data(steps, rows, seed)
    start = _weights(0)
    variables = [tf.Variable(w) for w in _weights(hvd.rank())]  # apart on every rank
    hvd.broadcast_variables(variables, root_rank=0)  # the documented start: before any step
    optimizer = make_optimizer()
    reference = [tf.Variable(w) for w in start]
    reference_optimizer = make_optimizer()

    def step(x, y):
        _tape_step(variables, optimizer, x, y, distributed=True)

    def reference_step(x, y):
        _tape_step(reference, reference_optimizer, x, y, distributed=False)

    if function:
        step, reference_step = tf.function(step), tf.function(reference_step)
    for s in range(steps):
        step(tf.constant(_rows(x, s, rows)), tf.constant(_rows(y, s, rows)))
        reference_step(tf.constant(x[s]), tf.constant(y[s]))
    return _largest_difference([v.numpy() for v in variables], [v.numpy() for v in reference])


def _tf1_train(weights, make_optimizer, batches, *, distributed: bool) -> list:
    """Train in a TF1 graph, the hook broadcasting when distributed; return the weights."""
    graph = tf.Graph()
    with graph.as_default():
        variables = [tf1.get_variable(f"w{i}", initializer=w) for i, w in enumerate(weights)]
        x = tf1.placeholder(tf.float64, [None, 4])
        y = tf1.placeholder(tf.float64, [None, 1])
        loss = tf.reduce_mean((_predict(variables, x) - y) ** 2)
        optimizer = make_optimizer()
        if distributed:
            optimizer = hvd.DistributedOptimizer(optimizer)
        train = optimizer.minimize(loss, global_step=tf1.train.get_or_create_global_step())
        hooks = [hvd.BroadcastGlobalVariablesHook(0)] if distributed else []
        with tf1.train.MonitoredTrainingSession(hooks=hooks) as session:
            for xb, yb in batches:
                session.run(train, {x: xb, y: yb})
            return session.run(variables)


def hook_difference(make_optimizer, *, rows=3, steps=3, seed=6) -> float:
    """Train with the TF1 hook and DistributedOptimizer, and in one process; return the gap."""
    x, y = _data(steps, rows, seed)
    mine = [(_rows(x, s, rows), _rows(y, s, rows)) for s in range(steps)]
    got = _tf1_train(_weights(hvd.rank()), make_optimizer, mine, distributed=True)
    whole = [(x[s], y[s]) for s in range(steps)]
    want = _tf1_train(_weights(0), make_optimizer, whole, distributed=False)
    return _largest_difference(got, want)


@pytest.mark.parametrize("name", OPTIMIZERS)
def test_distributed_gradient_tape_equals_one_process(name):
    assert tape_difference(OPTIMIZERS[name], function=True) < TOLERANCE


def test_distributed_gradient_tape_equals_one_process_eagerly():
    assert tape_difference(OPTIMIZERS["adam"], function=False) < TOLERANCE


@pytest.mark.parametrize("name", TF1_OPTIMIZERS)
def test_tf1_hook_and_optimizer_equal_one_process(name):
    assert hook_difference(TF1_OPTIMIZERS[name]) < TOLERANCE
