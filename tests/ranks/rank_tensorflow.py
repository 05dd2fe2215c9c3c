"""horovodlite.tensorflow on every rank: collectives eagerly, in tf.function and in TF1 graphs,
their gradients, and synchronous-SGD equivalence of DistributedGradientTape and the TF1
DistributedOptimizer with one process on the whole batch."""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import pytest  # noqa: E402

tf = pytest.importorskip("tensorflow")
hvd = pytest.importorskip("horovodlite.tensorflow")
import horovodlite as core  # noqa: E402

tf1 = tf.compat.v1


def _allgather_py(obj):
    return hvd.allgather_object(obj)


def _same_everywhere(array) -> bool:
    everyone = _allgather_py(np.asarray(array))
    return all(np.array_equal(everyone[0], a) for a in everyone)


def _in_graph(build, feed=None):
    """Build ops in a fresh TF1 graph and run them in a Session; return the fetched values."""
    graph = tf.Graph()
    with graph.as_default():
        fetches = build()
        with tf1.Session(graph=graph) as session:
            session.run(tf1.global_variables_initializer())
            return session.run(fetches, feed_dict=feed)


MODES = ["eager", "function", "graph"]


def _run(mode, build):
    """Run `build()` (returning tensors) eagerly, as a tf.function, or in a TF1 graph."""
    if mode == "eager":
        return tf.nest.map_structure(lambda t: t.numpy(), build())
    if mode == "function":
        return tf.nest.map_structure(lambda t: t.numpy(), tf.function(build)())
    return _in_graph(build)


# -- collectives ----------------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", [tf.float32, tf.float64, tf.int32, tf.bfloat16, tf.float16])
def test_allreduce_sum_and_average(mode, dtype):
    r, n = hvd.rank(), hvd.size()

    def build():
        x = tf.cast(tf.reshape(tf.range(6), [2, 3]) + r, dtype)
        return hvd.allreduce(x, op=hvd.Sum), hvd.allreduce(x, op=hvd.Average)

    total, mean = _run(mode, build)
    base = np.arange(6).reshape(2, 3)
    expected = n * base + n * (n - 1) // 2
    np.testing.assert_allclose(np.asarray(total, np.float64), expected, rtol=1e-2)
    if dtype.is_integer:
        np.testing.assert_array_equal(mean, expected // n)
    else:
        np.testing.assert_allclose(np.asarray(mean, np.float64), expected / n, rtol=1e-2)


@pytest.mark.parametrize("mode", MODES)
def test_min_max_product_and_scaling(mode):
    r, n = hvd.rank(), hvd.size()

    def build():
        x = tf.constant([1.0, 2.0]) + r
        return (
            hvd.allreduce(x, op=hvd.Min),
            hvd.allreduce(x, op=hvd.Max),
            hvd.allreduce(x, op=hvd.Product),
            hvd.allreduce(x, op=hvd.Sum, prescale_factor=2.0, postscale_factor=0.5),
        )

    lo, hi, prod, scaled = _run(mode, build)
    ranks = np.arange(n)[:, None] + np.array([1.0, 2.0])
    np.testing.assert_allclose(lo, ranks.min(0))
    np.testing.assert_allclose(hi, ranks.max(0))
    np.testing.assert_allclose(prod, ranks.prod(0), rtol=1e-6)
    np.testing.assert_allclose(scaled, ranks.sum(0))


@pytest.mark.parametrize("mode", MODES)
def test_grouped_allreduce_mixed_dtypes(mode):
    r, n = hvd.rank(), hvd.size()

    def build():
        return hvd.grouped_allreduce(
            [tf.fill([3], float(r)), tf.fill([2, 2], r), tf.fill([1], tf.cast(r, tf.float64))],
            op=hvd.Sum,
        )

    a, b, c = _run(mode, build)
    s = n * (n - 1) // 2
    np.testing.assert_array_equal(a, np.full(3, s, np.float32))
    np.testing.assert_array_equal(b, np.full((2, 2), s, np.int32))
    assert c.dtype == np.float64 and c[0] == s


@pytest.mark.parametrize("mode", MODES)
def test_allgather_uneven_rows(mode):
    r, n = hvd.rank(), hvd.size()

    def build():
        mine = tf.fill([r + 1, 2], r)
        return hvd.allgather(mine), hvd.grouped_allgather([mine, tf.fill([1], float(r))])

    gathered, (again, floats) = _run(mode, build)
    expected = np.concatenate([np.full((k + 1, 2), k) for k in range(n)])
    np.testing.assert_array_equal(gathered, expected)
    np.testing.assert_array_equal(again, expected)
    np.testing.assert_array_equal(floats, np.arange(n, dtype=np.float32))


@pytest.mark.parametrize("mode", MODES)
def test_broadcast_alltoall_reducescatter(mode):
    r, n = hvd.rank(), hvd.size()
    root = n - 1

    def build():
        b = hvd.broadcast(tf.fill([2], r), root)
        splits = [1] * n
        splits[0] += 1
        out, received = hvd.alltoall(tf.fill([n + 1], r), splits=splits)
        even = hvd.alltoall(tf.reshape(tf.range(2 * n) + 100 * r, [2 * n, 1]))
        rs = hvd.reducescatter(tf.ones([2 * n + 1, 2]) * (r + 1), op=hvd.Sum)
        return b, out, received, even, rs

    b, out, received, even, rs = _run(mode, build)
    np.testing.assert_array_equal(b, [root, root])
    mine = 2 if r == 0 else 1
    np.testing.assert_array_equal(out, np.repeat(np.arange(n), mine))
    np.testing.assert_array_equal(received, np.full(n, mine))
    assert received.dtype == np.int32
    np.testing.assert_array_equal(
        even.ravel(), [100 * k + 2 * r + j for k in range(n) for j in (0, 1)]
    )
    rows = 3 if r == 0 else 2  # 2n + 1 rows: rank 0 gets the extra one
    np.testing.assert_allclose(rs, np.full((rows, 2), n * (n + 1) / 2))


@pytest.mark.parametrize("mode", MODES)
def test_eager_collectives_skip_the_engine(mode, monkeypatch):
    # Eagerly a collective is a blocking call, without the engine's round trip; in a graph
    # (tf.function, TF1) each goes to the engine, which matches requests by name.
    from horovodlite.state import current

    engine, submitted = current().engine, []
    submit, submit_one = engine.submit, engine.submit_one

    def counted(plans, *args):
        submitted.extend(plans)
        return submit(plans, *args)

    def counted_one(plan):
        submitted.append(plan)
        return submit_one(plan)

    monkeypatch.setattr(engine, "submit", counted)
    monkeypatch.setattr(engine, "submit_one", counted_one)
    r, n = hvd.rank(), hvd.size()

    def build():
        x = tf.fill([3], float(r))
        if mode == "graph":
            y = hvd.allreduce(x, op=hvd.Sum)
            grad = tf.gradients(y, x)[0]
        else:
            with tf.GradientTape() as tape:
                tape.watch(x)
                y = hvd.allreduce(x, op=hvd.Sum)
            grad = tape.gradient(y, x)
        return (y, grad, hvd.allgather(tf.fill([1], r)), hvd.broadcast(tf.fill([1], r), 0),
                hvd.grouped_allreduce([x, tf.cast(x, tf.int32)], op=hvd.Sum))  # fmt: skip

    y, grad, gathered, root, grouped = _run(mode, build)
    total = n * (n - 1) / 2
    np.testing.assert_array_equal(y, np.full(3, total))
    np.testing.assert_array_equal(grad, np.full(3, float(n)))
    np.testing.assert_array_equal(gathered, np.arange(n))
    np.testing.assert_array_equal(root, [0])
    np.testing.assert_array_equal(grouped[1], np.full(3, total))
    kinds = {plan.kind for plan in submitted}
    if mode == "eager":
        assert not submitted, kinds
    else:
        assert {"allreduce", "allgather", "broadcast"} <= kinds, kinds


@pytest.mark.parametrize("mode", ["eager", "function"])
def test_all_reduces_beside_a_joined_rank(mode):
    # Rank 0 joins; the others' all-reduces (eagerly blocking calls, in a tf.function unnamed
    # requests to the engine) get zeros from it. Unnamed on purpose: the joined rank counts the
    # unnamed requests it answers, so the later tests' automatic names stay in step.
    r, n = hvd.rank(), hvd.size()
    if r == 0:
        last = hvd.join()
    else:
        total, grouped = _run(mode, lambda: (
            hvd.allreduce(tf.fill([2], float(r)), op=hvd.Sum),
            hvd.grouped_allreduce([tf.ones([3]), tf.ones([1], tf.int32)], op=hvd.Sum),
        ))  # fmt: skip
        np.testing.assert_array_equal(total, np.full(2, n * (n - 1) / 2))
        np.testing.assert_array_equal(grouped[0], np.full(3, n - 1.0))
        np.testing.assert_array_equal(grouped[1], [n - 1])
        last = hvd.join()
    assert _same_everywhere(int(last)) and int(last) in (range(1, n) if n > 1 else [0])


def test_fact_ops_run_in_a_graph():
    size, rank, lsize, lrank = _in_graph(
        lambda: (hvd.size_op(), hvd.rank_op(), hvd.local_size_op(), hvd.local_rank_op())
    )
    assert (size, rank, lsize, lrank) == (
        hvd.size(),
        hvd.rank(),
        hvd.local_size(),
        hvd.local_rank(),
    )


def test_graph_collectives_in_any_order_match_by_name():
    # Ops that do not depend on each other may run in any order in a TF1 graph; they are
    # matched by their place in the graph, so several in one run() must not hang or mix up.
    r, n = hvd.rank(), hvd.size()

    def build():
        return [hvd.allreduce(tf.fill([4], float(r * 10 + i)), op=hvd.Sum) for i in range(6)]

    results = _in_graph(build)
    for i, result in enumerate(results):
        np.testing.assert_array_equal(result, np.full(4, sum(k * 10 + i for k in range(n))))


def test_indexed_slices_are_allgathered():
    r, n = hvd.rank(), hvd.size()
    slices = tf.IndexedSlices(
        tf.fill([1, 2], float(r + 1)), tf.constant([r]), dense_shape=tf.constant([n, 2])
    )
    reduced = hvd.allreduce(slices)
    assert isinstance(reduced, tf.IndexedSlices)
    np.testing.assert_array_equal(reduced.indices.numpy(), np.arange(n))
    np.testing.assert_allclose(reduced.values.numpy()[:, 0], (np.arange(n) + 1) / n)
    with pytest.raises(NotImplementedError, match="Average and Sum"):
        hvd.allreduce(slices, op=hvd.Max)
    # Horovod takes no scale factors with IndexedSlices.
    for factors in ({"prescale_factor": 2.0}, {"postscale_factor": 0.5}):
        with pytest.raises(NotImplementedError, match="prescale_factor"):
            hvd.allreduce(slices, op=hvd.Sum, **factors)


@pytest.mark.parametrize("mode", MODES)
def test_indexed_slices_of_integers_average_to_floats(mode):
    # Horovod divides the gathered values by the size: integers average to floats, not zeros.
    r, n = hvd.rank(), hvd.size()

    def build():
        slices = tf.IndexedSlices(
            tf.fill([1, 2], r + 1), tf.constant([r]), dense_shape=tf.constant([n, 2])
        )
        return hvd.allreduce(slices).values

    values = _run(mode, build)
    assert values.dtype == np.float64
    np.testing.assert_allclose(values[:, 0], (np.arange(n) + 1) / n)


# -- gradients ------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["eager", "function"])
def test_gradients_are_those_of_the_ranks_summed_losses(mode):
    r, n = hvd.rank(), hvd.size()

    def grads():
        x = tf.ones([r + 1, 2]) * (r + 1)
        with tf.GradientTape(persistent=True) as tape:
            tape.watch(x)
            weights = tf.constant([1.0, 3.0])
            summed = tf.reduce_sum(hvd.allreduce(x[:1], op=hvd.Sum) * weights)
            gathered = hvd.allgather(x)
            ramp = tf.reshape(tf.range(tf.size(gathered), dtype=tf.float32), tf.shape(gathered))
            picked = tf.reduce_sum(gathered * ramp)
            bcast = tf.reduce_sum(hvd.broadcast(x[:1], 0) * weights)
        return [tape.gradient(y, x) for y in (summed, picked, bcast)]

    g_sum, g_gather, g_bcast = grads() if mode == "eager" else tf.function(grads)()
    # all-reduce: the gradient is the all-reduce (Sum) of the upstream gradients
    np.testing.assert_allclose(g_sum.numpy()[0], n * np.array([1.0, 3.0]))
    # allgather: this rank's rows of the upstream gradient summed over the n ranks
    offset = r * (r + 1) // 2
    ramp = np.arange(2 * (offset + r + 1)).reshape(-1, 2)[offset:]
    np.testing.assert_allclose(g_gather.numpy(), n * ramp)
    # broadcast: the upstream gradient summed over the ranks on the root, zero elsewhere
    expected = n * np.array([1.0, 3.0]) if r == 0 else np.zeros(2)
    np.testing.assert_allclose(g_bcast.numpy()[0], expected)


@pytest.mark.parametrize("mode", ["eager", "function"])
def test_reducescatter_gradients_are_those_of_the_ranks_summed_losses(mode):
    # The allgather of the upstream gradients, times the prescale and postscale factors, over
    # the size for Average; grouped alike. (Horovod's is n times this for Sum, #2654.)
    r, n = hvd.rank(), hvd.size()

    def grads():
        x = tf.ones([2 * n, 1])
        with tf.GradientTape(persistent=True) as tape:
            tape.watch(x)
            total = tf.reduce_sum(hvd.reducescatter(x, op=hvd.Sum)) * (r + 1)
            mean = tf.reduce_sum(
                hvd.reducescatter(x, op=hvd.Average, prescale_factor=2.0, postscale_factor=1.5)
            ) * (r + 1)
            a, b = hvd.grouped_reducescatter([x, 2 * x], op=hvd.Sum)
            grouped = tf.reduce_sum(a) * (r + 1) + tf.reduce_sum(b)
        return [tape.gradient(y, x) for y in (total, mean, grouped)]

    total, mean, grouped = grads() if mode == "eager" else tf.function(grads)()
    # Each rank's 2 rows come from every rank; rank k's upstream gradient is k + 1.
    gathered = np.repeat(np.arange(n) + 1.0, 2)
    np.testing.assert_allclose(total.numpy().ravel(), gathered)
    np.testing.assert_allclose(mean.numpy().ravel(), 3.0 * gathered / n, rtol=1e-6)
    np.testing.assert_allclose(grouped.numpy().ravel(), gathered + 2.0)


def test_reducescatter_and_alltoall_gradients():
    r, n = hvd.rank(), hvd.size()
    x = tf.ones([2 * n, 1])
    with tf.GradientTape(persistent=True) as tape:
        tape.watch(x)
        out = hvd.alltoall(x * tf.reshape(tf.range(2 * n, dtype=tf.float32), [-1, 1]))
        y_a2a = tf.reduce_sum(out * (r + 1))
    # Rows 2k, 2k+1 went to rank k, whose upstream gradient is k + 1.
    expected = np.repeat(np.arange(n) + 1, 2) * np.arange(2 * n)
    np.testing.assert_allclose(tape.gradient(y_a2a, x).numpy().ravel(), expected)


def test_tf1_graph_gradient_of_allreduce():
    n = hvd.size()

    def build():
        x = tf1.placeholder(tf.float32, [2])
        y = tf.reduce_sum(hvd.allreduce(x, op=hvd.Sum) * tf.constant([1.0, 2.0]))
        return tf1.gradients(y, x)[0], x

    graph = tf.Graph()
    with graph.as_default():
        grad, x = build()
        with tf1.Session() as session:
            value = session.run(grad, {x: [1.0, 1.0]})
    np.testing.assert_allclose(value, n * np.array([1.0, 2.0]))


# -- errors ---------------------------------------------------------------------------------


def test_shape_mismatch_raises_on_every_rank_eagerly():
    r = hvd.rank()
    if hvd.size() == 1:
        pytest.skip("needs two ranks to disagree")
    with pytest.raises(hvd.HorovodLiteError, match="shape") as caught:
        hvd.allreduce(tf.zeros([2 + (r == 0)]))
    # What a Horovod user catches: TensorFlow's FailedPreconditionError.
    assert isinstance(caught.value, tf.errors.FailedPreconditionError)
    assert isinstance(caught.value, core.MismatchError)
    with pytest.raises(tf.errors.FailedPreconditionError, match="shape"):
        hvd.grouped_allgather([tf.zeros([1, 2 + (r == 0)])])
    # The engine still works afterwards.
    assert hvd.allreduce(tf.ones([1]), op=hvd.Sum).numpy()[0] == hvd.size()


MISMATCHES = {
    "allreduce shape": lambda r: hvd.allreduce(tf.zeros([2 + (r == 0)])),
    "allreduce dtype": lambda r: hvd.allreduce(tf.zeros([2], tf.int32 if r else tf.float32)),
    "allgather shape": lambda r: hvd.allgather(tf.zeros([1, 2 + (r == 0)])),
    "allgather dtype": lambda r: hvd.allgather(tf.zeros([1], tf.int32 if r else tf.float32)),
    "broadcast shape": lambda r: hvd.broadcast(tf.zeros([2 + (r == 0)]), 0),
    "broadcast dtype": lambda r: hvd.broadcast(tf.zeros([2], tf.int32 if r else tf.float32), 0),
    "alltoall shape": lambda r: hvd.alltoall(tf.zeros([hvd.size()] + [1] * (1 + (r == 0)))),
    "alltoall dtype": lambda r: hvd.alltoall(tf.zeros([hvd.size()], tf.int32 if r else tf.float32)),
    "reducescatter shape": lambda r: hvd.reducescatter(tf.zeros([4, 1 + (r == 0)])),
    "reducescatter dtype": lambda r: hvd.reducescatter(
        tf.zeros([4], tf.int32 if r else tf.float32), op=hvd.Sum
    ),
}


@pytest.mark.parametrize("mode", MODES)
def test_mismatches_are_failed_precondition_errors_in_every_mode(mode):
    # Horovod's class for ranks that disagree, inside tf.function and TF1 graphs too.
    if hvd.size() == 1:
        pytest.skip("needs two ranks to disagree")
    for case, build in MISMATCHES.items():
        with pytest.raises(tf.errors.FailedPreconditionError, match="rank 0 sent") as caught:
            _run(mode, lambda build=build: build(hvd.rank()))
        assert "dtype" in str(caught.value) or "shape" in str(caught.value), case
    assert _run(mode, lambda: hvd.allreduce(tf.ones([1]), op=hvd.Sum))[0] == hvd.size()


@pytest.mark.parametrize("mode", MODES)
def test_bad_alltoall_splits_are_invalid_argument_errors(mode):
    n = hvd.size()
    with pytest.raises(tf.errors.InvalidArgumentError, match="add up to"):
        _run(mode, lambda: hvd.alltoall(tf.ones([n + 1]), splits=[1] * n)[0])
    if n > 1:  # (n + 1 rows divide evenly by one rank)
        with pytest.raises(tf.errors.InvalidArgumentError, match="evenly"):
            _run(mode, lambda: hvd.alltoall(tf.ones([n + 1, 1])))
    with pytest.raises(ValueError, match="integers"):
        _run(mode, lambda: hvd.alltoall(tf.ones([n]), splits=tf.ones([n], tf.float32))[0])
    if mode == "eager":  # still a ValueError, as every bad argument of horovodlite
        with pytest.raises(ValueError, match="add up to"):
            hvd.alltoall(tf.ones([n + 1]), splits=[1] * n)


@pytest.mark.parametrize("mode", ["eager", "function"])
@pytest.mark.parametrize("dims", [1, 3])
def test_alltoall_where_a_rank_sends_or_receives_nothing(mode, dims):
    r, n = hvd.rank(), hvd.size()
    silent = n - 1  # sends nothing in the first exchange, receives nothing in the second

    def build():
        rows = 0 if r == silent else r + 1
        sends = tf.reshape(tf.repeat(tf.range(n), rows), [-1] + [1] * (dims - 1))
        sends = tf.tile(tf.cast(sends, tf.float32), [1] + [2] * (dims - 1))
        first = hvd.alltoall(sends, splits=[rows] * n)
        to_all_but = [0 if k == silent else r + 1 for k in range(n)]
        values = tf.fill([sum(to_all_but)] + [2] * (dims - 1), float(r))
        second = hvd.alltoall(values, splits=to_all_but)
        return first, second

    (got, got_splits), (again, again_splits) = _run(mode, build)
    expected = [0 if k == silent else k + 1 for k in range(n)]
    assert got_splits.tolist() == expected
    assert got.shape == (sum(expected),) + (2,) * (dims - 1)
    np.testing.assert_array_equal(got, r)  # every sender sent this rank its number
    want = [0] * n if r == silent else [k + 1 for k in range(n)]
    assert again_splits.tolist() == want
    assert again.shape == (sum(want),) + (2,) * (dims - 1)
    first_column = again[(slice(None),) + (0,) * (dims - 1)]
    np.testing.assert_array_equal(first_column, np.repeat(np.arange(n), want))


def test_elastic_is_an_attribute_of_the_package():
    import horovodlite.tensorflow as package

    assert package.elastic.TensorFlowKerasState.__name__ == "TensorFlowKerasState"
    assert package.elastic.TensorFlowState is not None


def test_bad_root_raises_on_every_rank():
    with pytest.raises(ValueError, match="root_rank"):
        hvd.broadcast(tf.ones([1]), hvd.size())


# -- variables, objects, training -----------------------------------------------------------


def test_broadcast_variables_eager_and_graph():
    r = hvd.rank()
    v = tf.Variable(tf.fill([3], float(r)))
    w = tf.Variable(r, dtype=tf.int64)
    assert hvd.broadcast_variables([v, w], root_rank=0) is None
    np.testing.assert_array_equal(v.numpy(), np.zeros(3))
    assert w.numpy() == 0
    graph = tf.Graph()
    with graph.as_default():
        g = tf1.Variable(tf.fill([2], float(r)))
        op = hvd.broadcast_global_variables(hvd.size() - 1)
        with tf1.Session() as session:
            session.run(tf1.global_variables_initializer())
            session.run(op)
            np.testing.assert_array_equal(session.run(g), np.full(2, hvd.size() - 1.0))
    with pytest.raises(RuntimeError, match="broadcast_variables"):
        hvd.broadcast_global_variables(0)


def test_objects():
    assert hvd.broadcast_object({"rank": hvd.rank()}, root_rank=0) == {"rank": 0}
    assert hvd.allgather_object(hvd.rank()) == list(range(hvd.size()))


def _data(steps, per_rank, seed=7):
    n = hvd.size()
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(steps, n * per_rank, 5)).astype(np.float32)
    y = rng.normal(size=(steps, n * per_rank, 1)).astype(np.float32)
    return x, y


def _shard(batch, per_rank):
    r = hvd.rank()
    return batch[r * per_rank : (r + 1) * per_rank]


def test_distributed_gradient_tape_matches_one_process_on_the_whole_batch():
    steps, b = 4, 3
    x, y = _data(steps, b)
    init = np.random.default_rng(1).normal(size=(5, 1)).astype(np.float32)

    def train(distributed: bool):
        w = tf.Variable(init)
        bias = tf.Variable(tf.zeros([1]))
        opt = tf.keras.optimizers.SGD(0.1, momentum=0.5)

        @tf.function
        def step(xb, yb):
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean((xb @ w + bias - yb) ** 2)
            if distributed:
                tape = hvd.DistributedGradientTape(tape)
            grads = tape.gradient(loss, [w, bias])
            opt.apply_gradients(zip(grads, [w, bias]))

        for s in range(steps):
            if distributed:
                step(_shard(x[s], b), _shard(y[s], b))
            else:
                step(x[s], y[s])
        return np.concatenate([w.numpy().ravel(), bias.numpy()])

    np.testing.assert_allclose(train(True), train(False), rtol=1e-5, atol=1e-6)


def test_tf1_distributed_optimizer_matches_one_process_on_the_whole_batch():
    steps, b = 4, 3
    x, y = _data(steps, b, seed=11)
    init = np.random.default_rng(2).normal(size=(5, 1)).astype(np.float32)

    def train(distributed: bool):
        graph = tf.Graph()
        with graph.as_default():
            xb = tf1.placeholder(tf.float32, [None, 5])
            yb = tf1.placeholder(tf.float32, [None, 1])
            w = tf1.Variable(init)
            loss = tf.reduce_mean((tf.matmul(xb, w) - yb) ** 2)
            opt = tf1.train.MomentumOptimizer(0.1, momentum=0.5)
            if distributed:
                opt = hvd.DistributedOptimizer(opt)
            train_op = opt.minimize(loss)
            with tf1.Session() as session:
                session.run(tf1.global_variables_initializer())
                for s in range(steps):
                    if distributed:
                        feed = {xb: _shard(x[s], b), yb: _shard(y[s], b)}
                    else:
                        feed = {xb: x[s], yb: y[s]}
                    session.run(train_op, feed)
                return session.run(w)

    np.testing.assert_allclose(train(True), train(False), rtol=1e-5, atol=1e-6)


class _RecordWeights(tf1.train.SessionRunHook):
    def __init__(self, variable):
        self.variable, self.value = variable, None

    def end(self, session):
        self.value = session.run(self.variable)


def test_monitored_training_session_with_the_broadcast_hook():
    # The four-step template: init, pin a device, wrap the optimizer, broadcast with a hook.
    r = hvd.rank()
    graph = tf.Graph()
    with graph.as_default():
        tf1.set_random_seed(r)  # different initial weights on every rank
        w = tf1.get_variable("w", [4, 1])
        xb = tf.constant(np.ones((2, 4), np.float32) * (r + 1))
        loss = tf.reduce_mean(tf.matmul(xb, w) ** 2)
        global_step = tf1.train.get_or_create_global_step()
        config = tf1.ConfigProto()
        config.gpu_options.visible_device_list = str(hvd.local_rank())
        opt = hvd.DistributedOptimizer(tf1.train.GradientDescentOptimizer(0.01 * hvd.size()))
        train_op = opt.minimize(loss, global_step=global_step)
        record = _RecordWeights(w)
        hooks = [hvd.BroadcastGlobalVariablesHook(0), tf1.train.StopAtStepHook(last_step=3), record]
        steps = 0
        with tf1.train.MonitoredTrainingSession(hooks=hooks, config=config) as session:
            while not session.should_stop():
                session.run(train_op)
                steps += 1
    assert steps == 3
    # The ranks started from rank 0's weights and applied the same averaged gradients.
    assert _same_everywhere(record.value)
    assert not np.allclose(record.value, 0)


def test_distributed_optimizer_validates_before_communicating():
    with pytest.raises(ValueError, match="backward_passes_per_step"):
        hvd.DistributedOptimizer(
            tf1.train.GradientDescentOptimizer(0.1), backward_passes_per_step=0
        )
    with pytest.raises(TypeError, match="local_layers"):
        hvd.PartialDistributedGradientTape(tf.GradientTape(), local_layers=[object()])
    with pytest.raises(TypeError, match="DistributedOptimizer wraps"):
        hvd.DistributedOptimizer(object())
    with pytest.raises(ValueError, match="gradient_predivide_factor"):
        hvd.DistributedGradientTape(tf.GradientTape(), op=hvd.Sum, gradient_predivide_factor=2.0)


# -- worker-local variables, TF1 gradient aggregation, SyncBatchNormalization ----------------


@pytest.mark.parametrize("mode", ["eager", "function"])
def test_register_local_source_keeps_its_gradient_on_the_rank(mode):
    r, n = hvd.rank(), hvd.size()
    w, v, u = tf.Variable(1.0), tf.Variable(2.0), tf.Variable(3.0)

    def grads(scale_local):
        with tf.GradientTape() as tape:
            loss = (r + 1.0) * (w + v + u)
        tape = hvd.DistributedGradientTape(tape, scale_local_gradients=scale_local)
        tape.register_local_source(v)
        tape.register_local_source(u)
        local, shared = tape.get_local_and_global_gradients(loss, [w, v, u])
        assert [s is v for s, _ in local] == [True, False] and shared[0][0] is w
        return [g for _, g in shared + local]

    run = grads if mode == "eager" else tf.function(grads)
    # w is averaged; v and u keep this rank's gradient, divided by the size by default.
    np.testing.assert_allclose([g.numpy() for g in run(True)], [(n + 1) / 2] + [(r + 1) / n] * 2)
    np.testing.assert_allclose([g.numpy() for g in run(False)], [(n + 1) / 2] + [r + 1.0] * 2)


def test_partial_distributed_gradient_tape_keeps_local_layers_local():
    r, n = hvd.rank(), hvd.size()
    shared_layer, local_layer = tf.keras.layers.Dense(1), tf.keras.layers.Dense(1)
    x = tf.fill([2, 3], r + 1.0)
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(shared_layer(x) + local_layer(x))
    tape = hvd.PartialDistributedGradientTape(tape, local_layers=local_layer)
    variables = shared_layer.trainable_weights + local_layer.trainable_weights
    kernel, bias, local_kernel, local_bias = tape.gradient(loss, variables)
    np.testing.assert_allclose(kernel.numpy(), np.full((3, 1), n + 1.0))  # mean of 2 (r + 1)
    np.testing.assert_allclose(bias.numpy(), [2.0])
    np.testing.assert_allclose(local_kernel.numpy(), np.full((3, 1), 2 * (r + 1.0) / n))
    np.testing.assert_allclose(local_bias.numpy(), [2.0 / n])


def test_tf1_optimizer_register_local_var():
    r, n = hvd.rank(), hvd.size()

    def build():
        w, v = tf1.Variable(0.0), tf1.Variable(0.0)
        opt = hvd.DistributedOptimizer(tf1.train.GradientDescentOptimizer(1.0))
        opt.register_local_var(v)
        with tf.control_dependencies([opt.minimize((r + 1.0) * (w + v))]):
            return w.read_value(), v.read_value()

    w, v = _in_graph(build)
    np.testing.assert_allclose([w, v], [-(n + 1) / 2, -(r + 1) / n])


@pytest.mark.parametrize("average", [False, True])
def test_tf1_backward_passes_per_step_aggregates_locally(average):
    # Two passes per update: each update applies the all-reduced sum (or mean) of the ranks'
    # accumulated gradients, as one process would with the combined batch; global_step counts
    # every pass, as in Horovod.
    n, b, passes, updates = hvd.size(), 2, 2, 2
    rng = np.random.default_rng(13)
    x = rng.normal(size=(updates, passes, n, b, 5)).astype(np.float32)
    y = rng.normal(size=(updates, passes, n, b, 1)).astype(np.float32)
    init = np.random.default_rng(3).normal(size=(5, 1)).astype(np.float32)
    r = hvd.rank()
    graph = tf.Graph()
    with graph.as_default():
        xb, yb = tf1.placeholder(tf.float32, [None, 5]), tf1.placeholder(tf.float32, [None, 1])
        w = tf1.Variable(init)
        step = tf1.train.get_or_create_global_step()
        opt = hvd.DistributedOptimizer(
            tf1.train.MomentumOptimizer(0.1, momentum=0.5),
            backward_passes_per_step=passes,
            average_aggregated_gradients=average,
        )
        train_op = opt.minimize(tf.reduce_mean((tf.matmul(xb, w) - yb) ** 2), global_step=step)
        with tf1.Session() as session:
            session.run([tf1.global_variables_initializer(), tf1.local_variables_initializer()])
            seen = []
            for u in range(updates):
                for p in range(passes):
                    session.run(train_op, {xb: x[u, p, r], yb: y[u, p, r]})
                    seen.append(session.run(w))
            got, global_step = session.run([w, step])
    assert global_step == updates * passes
    np.testing.assert_array_equal(seen[0], init)  # nothing applied on the first pass
    # One process: the gradient of each pass's mean loss is the mean over the ranks; the
    # update applies the sum over the passes (or their mean).
    expected, velocity = init.astype(np.float64), 0.0
    for u in range(updates):
        grad = 0.0
        for p in range(passes):
            xs, ys = x[u, p].reshape(-1, 5), y[u, p].reshape(-1, 1)
            grad = grad + 2 * xs.T @ (xs @ expected - ys) / len(xs)
        if average:
            grad = grad / passes
        velocity = 0.5 * velocity + grad
        expected = expected - 0.1 * velocity
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)
    assert _same_everywhere(got)


def test_sync_batch_normalization_uses_the_global_batch():
    # Ranks hold batches of different sizes: the statistics are those of the concatenation.
    r, n = hvd.rank(), hvd.size()
    rng = np.random.default_rng(21)
    batches = [rng.normal(size=(k + 2, 3)).astype(np.float32) * (k + 1) for k in range(n)]
    layer = hvd.SyncBatchNormalization(momentum=0.5)
    reference = tf.keras.layers.BatchNormalization(momentum=0.5)
    x = tf.constant(batches[r])
    with tf.GradientTape() as tape:
        tape.watch(x)
        out = layer(x, training=True)
        loss = tf.reduce_sum(out * tf.range(1.0, 4.0))
    grad = tape.gradient(loss, x)
    everything = tf.constant(np.concatenate(batches))
    with tf.GradientTape() as tape:
        tape.watch(everything)
        want = reference(everything, training=True)
        want_loss = tf.reduce_sum(want * tf.range(1.0, 4.0))
    want_grad = tape.gradient(want_loss, everything)
    rows = slice(sum(k + 2 for k in range(r)), sum(k + 2 for k in range(r + 1)))
    np.testing.assert_allclose(out.numpy(), want.numpy()[rows], rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(grad.numpy(), want_grad.numpy()[rows], rtol=1e-3, atol=1e-4)
    np.testing.assert_allclose(layer.moving_mean.numpy(), reference.moving_mean.numpy(), rtol=1e-5)
    np.testing.assert_allclose(
        layer.moving_variance.numpy(), reference.moving_variance.numpy(), rtol=1e-4
    )
    with pytest.raises(ValueError, match="fused"):
        hvd.SyncBatchNormalization(fused=True)


def test_broadcast_object_fn():
    broadcast = hvd.broadcast_object_fn(root_rank=hvd.size() - 1)
    assert broadcast({"rank": hvd.rank()}) == {"rank": hvd.size() - 1}
