"""At size 1 the gradient all-reduce of horovodlite.keras (and .tensorflow) is the identity.

Run on one process, with KERAS_BACKEND set: training with the wrapped optimizer must give the
plain optimizer's weights and submit nothing to the engine. Prints OK at the end.
"""

import horovodlite.keras as hvd
import keras
import numpy as np

import horovodlite

hvd.init()
assert hvd.size() == 1
engine = horovodlite.state.current().engine
submitted = []
submit, submit_one = engine.submit, engine.submit_one  # (a single all-reduce takes the second)
engine.submit = lambda *args, **kwargs: submitted.append(args) or submit(*args, **kwargs)
engine.submit_one = lambda plan: submitted.append(plan) or submit_one(plan)


def trained(optimizer, **compile_kwargs):
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)])
    model.compile(optimizer, "mse", **compile_kwargs)
    x = np.arange(32, dtype="float32").reshape(8, 4) / 32
    model.fit(x, np.ones((8, 3), "float32"), batch_size=2, epochs=2, shuffle=False, verbose=0)
    return model.get_weights()


for plain, wrapped in zip(
    trained(keras.optimizers.SGD(0.1, momentum=0.9)),
    trained(hvd.DistributedOptimizer(keras.optimizers.SGD(0.1, momentum=0.9))),
):
    np.testing.assert_array_equal(plain, wrapped)
# backward_passes_per_step=2 sums two passes (Keras averages them): the scale stays.
for plain, wrapped in zip(
    trained(keras.optimizers.SGD(0.2, gradient_accumulation_steps=2)),
    trained(hvd.DistributedOptimizer(keras.optimizers.SGD(0.1), backward_passes_per_step=2)),
):
    np.testing.assert_allclose(plain, wrapped, rtol=1e-6)

if keras.backend.backend() == "tensorflow":
    import horovodlite.tensorflow as hvd_tf
    import tensorflow as tf

    w = tf.Variable([1.0, 2.0])
    for scale in (1.0, 3.0):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(w * w)
        tape = hvd_tf.DistributedGradientTape(tape, gradient_predivide_factor=scale)
        np.testing.assert_array_equal(tape.gradient(loss, [w])[0].numpy(), [2.0, 4.0])

assert submitted == [], f"{len(submitted)} engine request(s) at size 1"
# The control: a collective still reaches the engine at size 1, so the spy above would see one.
horovodlite.synchronize(horovodlite.allreduce_async(np.ones(2), name="control"))
assert len(submitted) == 1
print("OK", flush=True)
