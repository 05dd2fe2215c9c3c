"""horovodlite.keras on every rank, on whichever Keras backend KERAS_BACKEND names (tests/
test_keras_backends.py runs this module again with the torch backend): model.fit and custom
loops equal one process on the whole batch, callbacks, load_model."""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import pytest  # noqa: E402

keras = pytest.importorskip("keras")
hvd = pytest.importorskip("horovodlite.keras")

BACKEND = keras.backend.backend()


def test_runs_on_the_requested_backend():
    assert BACKEND == os.environ.get("KERAS_BACKEND", "tensorflow")


def _same_everywhere(arrays) -> bool:
    flat = np.concatenate([np.ravel(a) for a in arrays])
    everyone = hvd.allgather_object(flat)
    return all(np.array_equal(everyone[0], a) for a in everyone)


def _model(seed=0):
    keras.utils.set_random_seed(seed)
    return keras.Sequential(
        [keras.Input((6,)), keras.layers.Dense(5, activation="tanh"), keras.layers.Dense(1)]
    )


def _global_data(batches, rows, seed=3):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(batches, rows, 6)).astype(np.float32)
    y = rng.normal(size=(batches, rows, 1)).astype(np.float32)
    return x, y


def _my_rows(array, per_rank):
    """This rank's rows of every global batch: (batches, n * b, ...) -> (batches * b, ...)."""
    r = hvd.rank()
    return array[:, r * per_rank : (r + 1) * per_rank].reshape(-1, *array.shape[2:])


def _flat(array):
    return array.reshape(-1, *array.shape[2:])


@pytest.mark.parametrize(
    "make_optimizer",
    [lambda: keras.optimizers.SGD(0.05, momentum=0.9), lambda: keras.optimizers.Adam(0.01)],
    ids=["sgd-momentum", "adam"],
)
def test_fit_matches_one_process_on_the_whole_batch(make_optimizer):
    n, b, batches = hvd.size(), 4, 5
    x, y = _global_data(batches, n * b)
    model = _model()
    reference = _model()
    reference.set_weights(model.get_weights())
    model.compile(hvd.DistributedOptimizer(make_optimizer()), "mse")
    reference.compile(make_optimizer(), "mse")
    model.fit(_my_rows(x, b), _my_rows(y, b), batch_size=b, epochs=2, shuffle=False, verbose=0)
    reference.fit(_flat(x), _flat(y), batch_size=n * b, epochs=2, shuffle=False, verbose=0)
    for got, want in zip(model.get_weights(), reference.get_weights()):
        np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-6)
    assert _same_everywhere(model.optimizer.variables)  # optimizer state too


def test_backward_passes_per_step_matches_the_combined_batch():
    n, b, updates, passes = hvd.size(), 3, 3, 2
    rng = np.random.default_rng(5)
    x = rng.normal(size=(updates, passes, n, b, 6)).astype(np.float32)
    y = rng.normal(size=(updates, passes, n, b, 1)).astype(np.float32)
    model = _model()
    reference = _model()
    reference.set_weights(model.get_weights())
    opt = hvd.DistributedOptimizer(
        keras.optimizers.SGD(0.05, momentum=0.9),
        backward_passes_per_step=passes,
        average_aggregated_gradients=True,
    )
    model.compile(opt, "mse")
    reference.compile(keras.optimizers.SGD(0.05, momentum=0.9), "mse")
    r = hvd.rank()
    mine_x, mine_y = x[:, :, r].reshape(-1, 6), y[:, :, r].reshape(-1, 1)
    model.fit(mine_x, mine_y, batch_size=b, epochs=1, shuffle=False, verbose=0)
    reference.fit(
        x.reshape(-1, 6), y.reshape(-1, 1), batch_size=passes * n * b, shuffle=False, verbose=0
    )
    for got, want in zip(model.get_weights(), reference.get_weights()):
        np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-6)


def test_custom_loop_matches_one_process_on_the_whole_batch():
    n, b, batches = hvd.size(), 4, 3
    x, y = _global_data(batches, n * b, seed=9)
    model = _model()
    reference = _model()
    reference.set_weights(model.get_weights())
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(0.1))
    ref_opt = keras.optimizers.SGD(0.1)
    r = hvd.rank()
    for s in range(batches):
        _step(model, opt, x[s, r * b : (r + 1) * b], y[s, r * b : (r + 1) * b])
        _step(reference, ref_opt, x[s], y[s])
    for got, want in zip(model.get_weights(), reference.get_weights()):
        np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-6)


def _step(model, optimizer, xb, yb):
    """One hand-written training step on the backend's own autodiff."""
    if BACKEND == "tensorflow":
        import tensorflow as tf

        with tf.GradientTape() as tape:
            loss = keras.ops.mean((model(xb) - yb) ** 2)
        grads = tape.gradient(loss, model.trainable_variables)
    else:
        model.zero_grad()
        loss = keras.ops.mean((model(xb) - keras.ops.convert_to_tensor(yb)) ** 2)
        loss.backward()
        grads = [v.value.grad for v in model.trainable_variables]
    optimizer.apply(grads, model.trainable_variables)


def test_fp16_compression_is_close_to_uncompressed():
    n, b = hvd.size(), 4
    x, y = _global_data(3, n * b, seed=4)
    results = []
    for compression in (hvd.Compression.none, hvd.Compression.fp16):
        model = _model()
        model.compile(
            hvd.DistributedOptimizer(keras.optimizers.SGD(0.05), compression=compression), "mse"
        )
        model.fit(_my_rows(x, b), _my_rows(y, b), batch_size=b, shuffle=False, verbose=0)
        results.append(model.get_weights())
    for plain, fp16 in zip(*results):
        np.testing.assert_allclose(fp16, plain, rtol=1e-2, atol=1e-3)
    assert _same_everywhere(results[1])


def test_broadcast_callback_makes_weights_and_optimizer_state_identical():
    b = 4
    model = _model(seed=100 + hvd.rank())  # different initial weights on every rank
    model.compile(hvd.DistributedOptimizer(keras.optimizers.Adam(0.01)), "mse")
    rng = np.random.default_rng(hvd.rank())
    x = rng.normal(size=(3 * b, 6)).astype(np.float32)
    y = rng.normal(size=(3 * b, 1)).astype(np.float32)
    model.fit(
        x, y, batch_size=b, verbose=0, callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)]
    )
    assert _same_everywhere(model.get_weights())
    assert _same_everywhere(model.optimizer.variables)


def test_broadcast_variables_copies_the_root():
    model = _model(seed=hvd.rank())
    hvd.broadcast_variables(model.variables, root_rank=hvd.size() - 1)
    assert _same_everywhere(model.get_weights())
    expected = _model(seed=hvd.size() - 1).get_weights()
    for got, want in zip(model.get_weights(), expected):
        np.testing.assert_array_equal(got, want)


def test_metric_average_callback_averages_in_a_fixed_order():
    r, n = hvd.rank(), hvd.size()
    callback = hvd.callbacks.MetricAverageCallback()
    logs = {"loss": float(r), "mae": 10.0 * r, "val_loss": np.float32(r + 1)}
    callback.on_epoch_end(0, logs)
    assert logs == {"loss": (n - 1) / 2, "mae": 10.0 * (n - 1) / 2, "val_loss": (n + 1) / 2}


def test_metric_average_callback_in_fit_logs_the_same_everywhere():
    b = 4
    model = _model()
    model.compile(hvd.DistributedOptimizer(keras.optimizers.SGD(0.01)), "mse", metrics=["mae"])
    rng = np.random.default_rng(hvd.rank())  # a different shard, so different local metrics
    x = rng.normal(size=(2 * b, 6)).astype(np.float32)
    y = rng.normal(size=(2 * b, 1)).astype(np.float32)
    history = model.fit(
        x,
        y,
        batch_size=b,
        epochs=2,
        verbose=0,
        callbacks=[hvd.callbacks.MetricAverageCallback()],
    )
    logged = [history.history["loss"], history.history["mae"]]
    everyone = hvd.allgather_object(logged)
    assert all(theirs == logged for theirs in everyone)


def test_metric_average_callback_mismatched_metrics_raise_on_every_rank():
    if hvd.size() == 1:
        pytest.skip("needs two ranks to disagree")
    logs = {"loss": 1.0}
    if hvd.rank() == 0:
        logs["extra"] = 2.0
    with pytest.raises(ValueError, match="same metrics on every rank"):
        hvd.callbacks.MetricAverageCallback().on_epoch_end(0, logs)


class _FakeModel:
    def __init__(self, optimizer):
        self.optimizer = optimizer


def _drive(callback, optimizer, epochs, steps):
    """Run the callback's hooks as fit would; return the lr seen at each batch."""
    callback.set_model(_FakeModel(optimizer))
    callback.set_params({"steps": steps, "epochs": epochs})
    callback.on_train_begin()
    seen = []
    for epoch in range(epochs):
        callback.on_epoch_begin(epoch)
        for batch in range(steps):
            callback.on_train_batch_begin(batch)
            seen.append(float(keras.ops.convert_to_numpy(optimizer.learning_rate)))
            callback.on_train_batch_end(batch)
        callback.on_epoch_end(epoch, {})
    return seen


def test_warmup_follows_horovods_formula():
    n, lr, warmup, steps = hvd.size(), 0.4, 2, 4
    optimizer = keras.optimizers.SGD(lr, momentum=0.9)
    callback = hvd.callbacks.LearningRateWarmupCallback(lr, warmup_epochs=warmup)
    seen = _drive(callback, optimizer, epochs=3, steps=steps)
    expected = []
    for epoch in range(3):
        for batch in range(steps):
            if epoch < warmup:
                e = epoch + batch / steps + 1 / steps
                expected.append(lr / n * (e * (n - 1) / warmup + 1))
            else:
                expected.append(expected[-1])  # after the warm-up the lr is left alone
    np.testing.assert_allclose(seen, expected, rtol=1e-6)
    assert optimizer.momentum == 0.9  # momentum correction is undone after each batch


def test_schedule_callback_staircase():
    optimizer = keras.optimizers.SGD(1.0)
    callback = hvd.callbacks.LearningRateScheduleCallback(
        initial_lr=1.0, multiplier=lambda epoch: 0.1**epoch, start_epoch=1, end_epoch=3
    )
    seen = _drive(callback, optimizer, epochs=4, steps=2)
    np.testing.assert_allclose(seen, [1.0, 1.0, 0.1, 0.1, 0.01, 0.01, 0.01, 0.01], rtol=1e-6)


def test_load_model_rewraps_the_optimizer_keeping_its_state(tmp_path_factory):
    b = 4
    path = hvd.broadcast_object(str(tmp_path_factory.mktemp("model") / "m.keras"), root_rank=0)
    x, y = _global_data(2, hvd.size() * b, seed=1)
    if hvd.rank() == 0:
        model = _model()
        model.compile(keras.optimizers.Adam(0.01), "mse")
        model.fit(_flat(x), _flat(y), batch_size=b, verbose=0)
        model.save(path)
    hvd.allgather_object(None)  # the file exists before anyone loads it
    loaded = hvd.load_model(path)
    assert isinstance(loaded.optimizer, keras.optimizers.Adam)
    iterations = int(keras.ops.convert_to_numpy(loaded.optimizer.iterations))
    assert iterations == 2 * hvd.size()
    # Training on different shards keeps the ranks in step: the gradients are all-reduced.
    loaded.fit(_my_rows(x, b), _my_rows(y, b), batch_size=b, shuffle=False, verbose=0)
    assert _same_everywhere(loaded.get_weights())


def test_collectives_on_backend_tensors():
    r, n = hvd.rank(), hvd.size()
    total = hvd.allreduce(np.full(3, float(r)), op=hvd.Sum)
    np.testing.assert_allclose(keras.ops.convert_to_numpy(total), np.full(3, n * (n - 1) / 2))
    gathered = hvd.allgather(np.full((1, 2), r))
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(gathered)[:, 0], np.arange(n))
    root = hvd.broadcast(np.full(2, r), root_rank=n - 1)
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(root), [n - 1, n - 1])
    mine = hvd.reducescatter(np.ones((n, 2), np.float32), op=hvd.Sum)
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(mine), np.full((1, 2), n))


def _value_and_gradients(loss_of, arrays: list):
    """Return loss_of(tensors) and its gradients with respect to `arrays`, on the backend."""
    if BACKEND == "torch":
        import torch

        xs = [torch.tensor(a, requires_grad=True) for a in arrays]
        loss = loss_of(xs)
        grads = torch.autograd.grad(loss, xs, allow_unused=True)
        return [None if g is None else g.numpy() for g in grads]
    import tensorflow as tf

    xs = [tf.Variable(a) for a in arrays]
    with tf.GradientTape() as tape:
        loss = loss_of(xs)
    return [None if g is None else g.numpy() for g in tape.gradient(loss, xs)]


@pytest.mark.parametrize("collective", ["allreduce", "allgather", "broadcast", "reducescatter"])
def test_collective_gradients_equal_one_process(collective):
    # Through horovodlite.keras to the backend's binding: the gradient of the sum of the ranks'
    # losses, against the backend's autograd of one process over every rank's data.
    from gradient_cases import Case, Ops, fit, inputs, output_shapes, outputs, upstream

    ops = Ops(
        concat=lambda ts: keras.ops.concatenate(ts, axis=0),
        stack=lambda ts: keras.ops.stack(ts, axis=0),
        reduce={"SUM": lambda s: keras.ops.sum(s, axis=0)},
    )
    rows = {"allgather": (1, 3, 0, 2), "reducescatter": (5,) * 4}.get(collective, (3,) * 4)
    case = fit(Case(collective, (rows,), ((2,),), root=1 % hvd.size(), seed=11), hvd.size())
    n, me = hvd.size(), hvd.rank()
    weights = [upstream(case, i, shapes) for i, shapes in enumerate(output_shapes(case, n))]

    def job_loss(everyone_flat):
        everyone = [[x] for x in everyone_flat]
        ys = outputs(case, everyone, ops)
        return sum(keras.ops.sum(keras.ops.convert_to_tensor(w[0]) * y[0])
                   for w, y in zip(weights, ys))  # fmt: skip

    expected = _value_and_gradients(job_loss, [inputs(case, i)[0] for i in range(n)])[me]

    def my_loss(xs):
        call = {
            "allreduce": lambda x: hvd.allreduce(x, op=hvd.Sum),
            "allgather": hvd.allgather,
            "broadcast": lambda x: hvd.broadcast(x, root_rank=case.root),
            "reducescatter": lambda x: hvd.reducescatter(x, op=hvd.Sum),
        }[collective]
        return keras.ops.sum(keras.ops.convert_to_tensor(weights[me][0]) * call(xs[0]))

    (got,) = _value_and_gradients(my_loss, inputs(case, me))
    unused = np.zeros_like(inputs(case, me)[0])  # a broadcast's non-root input
    np.testing.assert_allclose(
        unused if got is None else got, unused if expected is None else expected, atol=1e-12
    )


def test_arguments_are_checked_before_any_communication():
    with pytest.raises(RuntimeError, match="BroadcastGlobalVariablesCallback"):
        hvd.broadcast_global_variables(0)
    with pytest.raises(TypeError, match="Keras 3 optimizer"):
        hvd.DistributedOptimizer(object())
    with pytest.raises(ValueError, match="backward_passes_per_step"):
        hvd.DistributedOptimizer(keras.optimizers.SGD(), backward_passes_per_step=0)
    with pytest.raises(ValueError, match="not both"):
        hvd.DistributedOptimizer(
            keras.optimizers.SGD(gradient_accumulation_steps=2), backward_passes_per_step=2
        )
    with pytest.raises(ValueError, match="got op=MAX"):
        hvd.DistributedOptimizer(keras.optimizers.SGD(), op=hvd.Max)
    with pytest.raises(ValueError, match="legacy_opts"):
        hvd.load_model("unused.keras", legacy_opts=True)
    with pytest.raises(TypeError, match="local_layers"):
        hvd.PartialDistributedOptimizer(keras.optimizers.SGD(), local_layers=[object()])


@pytest.mark.skipif(BACKEND != "tensorflow", reason="Horovod's path is TensorFlow's")
def test_horovods_keras_module_path_is_the_same_api():
    import horovodlite.tensorflow.keras as tf_hvd
    import horovodlite.tensorflow.keras.callbacks as tf_callbacks

    assert tf_hvd.DistributedOptimizer is hvd.DistributedOptimizer
    assert tf_callbacks.MetricAverageCallback is hvd.callbacks.MetricAverageCallback
    assert tf_hvd.callbacks.BroadcastGlobalVariablesCallback is (
        hvd.callbacks.BroadcastGlobalVariablesCallback
    )
    assert set(tf_hvd.__all__) == set(hvd.__all__)
    total = tf_hvd.allreduce(np.full(2, float(hvd.rank())), op=tf_hvd.Sum)
    n = hvd.size()
    np.testing.assert_allclose(keras.ops.convert_to_numpy(total), np.full(2, n * (n - 1) / 2))


def _two_layers():
    shared, local = keras.layers.Dense(1, use_bias=False), keras.layers.Dense(1, use_bias=False)
    shared.build((None, 2))
    local.build((None, 2))
    return shared, local


def test_partial_distributed_optimizer_keeps_local_layers_local():
    r, n = hvd.rank(), hvd.size()
    shared, local = _two_layers()
    variables = [shared.kernel, local.kernel]
    start = [keras.ops.convert_to_numpy(v.value) for v in variables]
    opt = hvd.PartialDistributedOptimizer(keras.optimizers.SGD(1.0), local_layers=[local])
    grads = [keras.ops.convert_to_tensor(np.full((2, 1), r + 1.0, np.float32))] * 2
    opt.apply(grads, variables)
    got = [keras.ops.convert_to_numpy(v.value) for v in variables]
    np.testing.assert_allclose(got[0], start[0] - (n + 1) / 2, rtol=1e-6)  # averaged
    np.testing.assert_allclose(got[1], start[1] - (r + 1) / n, rtol=1e-6)  # local, scaled
    # register_local_var on a DistributedOptimizer, without the scaling.
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(1.0), scale_local_gradients=False)
    opt.register_local_var(local.kernel)
    opt.apply(grads, variables)
    again = [keras.ops.convert_to_numpy(v.value) for v in variables]
    np.testing.assert_allclose(again[1], got[1] - (r + 1), rtol=1e-6)


def test_local_variables_with_backward_passes_per_step():
    r, n = hvd.rank(), hvd.size()
    shared, local = _two_layers()
    variables = [shared.kernel, local.kernel]
    start = [keras.ops.convert_to_numpy(v.value) for v in variables]
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(1.0), backward_passes_per_step=2)
    opt.register_local_var(local.kernel)
    grads = [keras.ops.convert_to_tensor(np.full((2, 1), r + 1.0, np.float32))] * 2
    opt.apply(grads, variables)
    opt.apply(grads, variables)
    got = [keras.ops.convert_to_numpy(v.value) for v in variables]
    # The sum of the two passes: averaged over the ranks, or this rank's divided by the size.
    np.testing.assert_allclose(got[0], start[0] - (n + 1), rtol=1e-6)
    np.testing.assert_allclose(got[1], start[1] - 2 * (r + 1) / n, rtol=1e-6)


def test_broadcast_callback_leaves_local_variables_alone():
    model = _model(seed=200 + hvd.rank())  # different initial weights on every rank
    mine = model.layers[0].kernel
    before = keras.ops.convert_to_numpy(mine.value)
    model.compile(hvd.DistributedOptimizer(keras.optimizers.SGD(0.0)), "mse")
    callback = hvd.callbacks.BroadcastGlobalVariablesCallback(0, local_variables=[mine])
    x, y = np.ones((4, 6), np.float32), np.ones((4, 1), np.float32)
    model.fit(x, y, batch_size=4, verbose=0, callbacks=[callback])
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(mine.value), before)  # lr 0
    others = [keras.ops.convert_to_numpy(v.value) for v in model.variables if v is not mine]
    assert _same_everywhere(others)
    if hvd.size() > 1:
        assert not _same_everywhere([before])
    with pytest.raises(TypeError, match="local_variables"):
        hvd.callbacks.BroadcastGlobalVariablesCallback(0, local_variables=[1.0])


def test_keras_state_sync_commits_the_broadcast_weights():
    # A restore() right after sync() keeps rank 0's weights, as Horovod's state does.
    model = _model(seed=300 + hvd.rank())  # different initial weights on every rank
    model.compile(hvd.DistributedOptimizer(keras.optimizers.SGD(0.1)), "mse")
    state = hvd.elastic.KerasState(model, batch=hvd.rank())
    state.sync()
    synced = model.get_weights()
    assert _same_everywhere(synced)
    assert state.batch == 0
    model.set_weights([w + 1 for w in synced])
    state.batch = 5
    state.restore()
    for got, want in zip(model.get_weights(), synced):
        np.testing.assert_array_equal(got, want)
    assert state.batch == 0
