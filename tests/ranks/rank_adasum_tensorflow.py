"""horovodlite.tensorflow and .keras with Adasum, against numpy's Adasum of the local values.

A TF1 optimizer with op=Adasum combines the ranks' updates (Horovod's Adasum optimizer), in a
graph and eagerly; DistributedGradientTape and the Keras DistributedOptimizer combine gradients.
"""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import pytest  # noqa: E402
from oracle import WORLD, adasum_expected, everyone  # noqa: E402

tf = pytest.importorskip("tensorflow")
hvd = pytest.importorskip("horovodlite.tensorflow")

tf1 = tf.compat.v1
POWER_OF_TWO = WORLD.size & (WORLD.size - 1) == 0
power_of_two = pytest.mark.skipif(not POWER_OF_TWO, reason="Adasum needs a power of two")


def local_data():
    rng = np.random.default_rng(10 + hvd.rank())
    return rng.normal(size=(6, 4)).astype(np.float32), rng.normal(size=(6, 1)).astype(np.float32)


INIT = np.random.default_rng(0).normal(size=(4, 1)).astype(np.float32)


def local_gradient(w, x, y):
    """The gradient of mean((x w - y)^2) on this rank's data, in float64."""
    x, y, w = x.astype(np.float64), y.astype(np.float64), w.astype(np.float64)
    return 2.0 / len(x) * x.T @ (x @ w - y)


@power_of_two
@pytest.mark.parametrize("graph", [True, False], ids=["graph", "eager"])
def test_tf1_optimizer_combines_the_updates(graph):
    x, y = local_data()
    lr = 0.1

    def build():
        w = tf1.Variable(INIT)
        opt = hvd.DistributedOptimizer(tf1.train.GradientDescentOptimizer(lr), op=hvd.Adasum)
        loss = lambda: tf.reduce_mean((tf.matmul(x, w) - y) ** 2)  # noqa: E731
        return w, opt, loss

    if graph:
        with tf.Graph().as_default():
            w, opt, loss = build()
            train = opt.minimize(loss())
            with tf1.Session() as session:
                session.run(tf1.global_variables_initializer())
                session.run(train)
                out = session.run(w)
    else:
        w, opt, loss = build()
        grads_and_vars = opt.compute_gradients(loss, var_list=[w])
        # The gradients stay local: Adasum combines the updates in apply_gradients.
        np.testing.assert_allclose(grads_and_vars[0][0].numpy(), local_gradient(INIT, x, y), 1e-5)
        opt.apply_gradients(grads_and_vars)
        out = w.numpy()
    updates = everyone(-lr * local_gradient(INIT, x, y))
    np.testing.assert_allclose(out, INIT + adasum_expected(updates), rtol=1e-5, atol=1e-6)
    assert all(np.array_equal(out, other) for other in everyone(out))


@power_of_two
def test_gradient_tape_combines_the_gradients():
    x, y = local_data()
    w = tf.Variable(INIT)
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean((tf.matmul(x, w) - y) ** 2)
    tape = hvd.DistributedGradientTape(tape, op=hvd.Adasum)
    (grad,) = tape.gradient(loss, [w])
    expected = adasum_expected(everyone(local_gradient(INIT, x, y)))
    np.testing.assert_allclose(grad.numpy(), expected, rtol=1e-5, atol=1e-6)


@power_of_two
def test_keras_optimizer_combines_the_gradients():
    keras = pytest.importorskip("keras")
    import horovodlite.keras as hvd_keras

    x, y = local_data()
    w = keras.Variable(INIT)
    opt = hvd_keras.DistributedOptimizer(keras.optimizers.SGD(0.1), op=hvd.Adasum)
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean((tf.matmul(x, w) - y) ** 2)
    opt.apply_gradients(zip(tape.gradient(loss, [w]), [w]))
    expected = INIT - 0.1 * adasum_expected(everyone(local_gradient(INIT, x, y)))
    np.testing.assert_allclose(w.numpy(), expected, rtol=1e-5, atol=1e-6)


@pytest.mark.skipif(POWER_OF_TWO, reason="checks the error of a non-power-of-two size")
def test_non_power_of_two_is_refused():
    match = f"power-of-two number of ranks .* has {WORLD.size}"
    with pytest.raises(ValueError, match=match):
        hvd.DistributedOptimizer(tf1.train.GradientDescentOptimizer(0.1), op=hvd.Adasum)
    w = tf.Variable(INIT)
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(w * w)
    with pytest.raises(ValueError, match=match):
        hvd.DistributedGradientTape(tape, op=hvd.Adasum).gradient(loss, [w])
