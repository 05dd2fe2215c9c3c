"""horovodlite.tensorflow graphs with many collectives, whatever order TensorFlow runs them in and
however few inter-op threads it has: every case runs inside tf.function with one inter-op thread,
and in TF1 sessions with one and with two."""

import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# A deadlock would otherwise hang until the module's timeout: make it fail within a minute.
os.environ.setdefault("HOROVODLITE_COLLECTIVE_TIMEOUT", "60")

import numpy as np  # noqa: E402
import pytest  # noqa: E402

tf = pytest.importorskip("tensorflow")
hvd = pytest.importorskip("horovodlite.tensorflow")

tf1 = tf.compat.v1
# The hardest case for ops that wait: one thread for every op of a tf.function.
tf.config.threading.set_inter_op_parallelism_threads(1)

DTYPES = [
    tf.uint8,
    tf.int8,
    tf.int16,
    tf.int32,
    tf.int64,
    tf.float16,
    tf.bfloat16,
    tf.float32,
    tf.float64,
    tf.bool,
]
NUMBERS = [d for d in DTYPES if d != tf.bool]
# tf.function (one inter-op thread), and TF1 sessions with one and two inter-op threads.
MODES = ["function", "graph-1", "graph-2"]


def _run(mode, build):
    """Run `build()` (returning tensors) as a tf.function or in a TF1 session; return values."""
    if mode == "function":
        return tf.nest.map_structure(lambda t: t.numpy(), tf.function(build)())
    graph = tf.Graph()
    with graph.as_default():
        fetches = build()
        with _session(graph, int(mode.split("-")[1])) as session:
            return session.run(fetches)


def _session(graph, threads):
    """Return a TF1 session of `graph` with `threads` inter-op threads of its own.

    Without use_per_session_threads every session shares one pool, sized by the first session.
    """
    config = tf1.ConfigProto(
        inter_op_parallelism_threads=threads,
        intra_op_parallelism_threads=1,
        use_per_session_threads=True,
    )
    return tf1.Session(graph=graph, config=config)


def _rows(r, dims, dtype):
    """Rank r's tensor of r + 1 rows, `dims` dimensions, every element r + 1."""
    return tf.cast(tf.fill([r + 1] + [2] * (dims - 1), r + 1), dtype)


def _expected_rows(n, dims, dtype):
    parts = [np.full([k + 1] + [2] * (dims - 1), k + 1) for k in range(n)]
    return np.concatenate(parts).astype(dtype.as_numpy_dtype)


@pytest.mark.parametrize("mode", MODES)
def test_allgathers_of_every_dtype_and_rank(mode):
    r, n = hvd.rank(), hvd.size()

    def build():
        single = [hvd.allgather(_rows(r, dims, d)) for d in DTYPES for dims in (1, 2, 3)]
        fused = hvd.grouped_allgather([_rows(r, dims, d) for d in DTYPES for dims in (1, 2, 3)])
        return single, fused

    single, fused = _run(mode, build)
    expected = [_expected_rows(n, dims, d) for d in DTYPES for dims in (1, 2, 3)]
    for got in (single, fused):
        assert len(got) == len(expected)
        for g, e in zip(got, expected):
            assert g.dtype == e.dtype
            np.testing.assert_array_equal(g, e)


@pytest.mark.parametrize("mode", MODES)
def test_variable_size_fused_allgathers(mode):
    r, n = hvd.rank(), hvd.size()

    def build():
        return [
            hvd.grouped_allgather([_rows(r + i, 2, tf.float32), _rows(r, 1, tf.int64)])
            for i in range(4)
        ]

    results = _run(mode, build)
    for i, (floats, ints) in enumerate(results):
        parts = [np.full((k + i + 1, 2), k + i + 1) for k in range(n)]
        np.testing.assert_array_equal(floats, np.concatenate(parts))
        np.testing.assert_array_equal(ints, _expected_rows(n, 1, tf.int64))


@pytest.mark.parametrize("mode", MODES)
def test_allreduces_of_every_dtype(mode):
    r, n = hvd.rank(), hvd.size()

    def build():
        xs = [tf.cast(tf.fill([3], r + 1), d) for d in NUMBERS]
        flags = tf.fill([2], r == 0)
        single = [hvd.allreduce(x, op=hvd.Sum) for x in xs]
        fused = hvd.grouped_allreduce(xs, op=hvd.Sum)
        averaged = hvd.grouped_allreduce(xs[5:], op=hvd.Average)
        return single, fused, averaged, hvd.allreduce(flags, op=hvd.Max)

    single, fused, averaged, flags = _run(mode, build)
    total = n * (n + 1) // 2
    for got in (single, fused):
        for g, d in zip(got, NUMBERS):
            assert g.dtype == d.as_numpy_dtype
            np.testing.assert_array_equal(np.asarray(g, np.float64), np.full(3, total))
    for g in averaged:
        np.testing.assert_allclose(np.asarray(g, np.float64), np.full(3, total / n), rtol=1e-2)
    np.testing.assert_array_equal(flags, [True, True])


@pytest.mark.parametrize("mode", MODES)
def test_reducescatters_of_every_dtype(mode):
    r, n = hvd.rank(), hvd.size()

    def build():
        xs = [tf.cast(tf.fill([2 * n + 1, 2], r + 1), d) for d in NUMBERS]
        single = [hvd.reducescatter(x, op=hvd.Sum) for x in xs]
        fused = hvd.grouped_reducescatter(xs, op=hvd.Sum)
        return single, fused

    single, fused = _run(mode, build)
    rows = 3 if r == 0 else 2  # 2n + 1 rows: rank 0 gets the extra one
    for got in (single, fused):
        for g, d in zip(got, NUMBERS):
            assert g.dtype == d.as_numpy_dtype
            np.testing.assert_array_equal(
                np.asarray(g, np.float64), np.full((rows, 2), n * (n + 1) // 2)
            )


def _slices(r, n, dtype=tf.float32):
    """Rank r's gradient of a [n, 2] table: row r, every element r + 1."""
    values = tf.cast(tf.fill([1, 2], r + 1), dtype)
    return tf.IndexedSlices(values, tf.constant([r]), dense_shape=tf.constant([n, 2]))


@pytest.mark.parametrize("mode", MODES)
def test_grouped_allreduce_of_indexed_slices_alone_and_mixed(mode):
    r, n = hvd.rank(), hvd.size()

    def build():
        alone = hvd.grouped_allreduce([_slices(r, n), _slices(r, n, tf.float64)], op=hvd.Sum)
        mixed = hvd.grouped_allreduce(
            [_slices(r, n), tf.fill([2], float(r)), _slices(r, n), tf.fill([3], r)],
            op=hvd.Average,
        )
        return [(s.values, s.indices) for s in alone], [
            (t.values, t.indices) if isinstance(t, tf.IndexedSlices) else t for t in mixed
        ]

    alone, mixed = _run(mode, build)
    ranks = np.arange(n)
    for values, indices in alone:
        np.testing.assert_array_equal(indices, ranks)
        np.testing.assert_array_equal(values[:, 0], ranks + 1)
    for values, indices in (mixed[0], mixed[2]):
        np.testing.assert_array_equal(indices, ranks)
        np.testing.assert_allclose(values[:, 0], (ranks + 1) / n)
    np.testing.assert_allclose(mixed[1], np.full(2, (n - 1) / 2))
    np.testing.assert_array_equal(mixed[3], np.full(3, (n - 1) * n // 2 // n))


@pytest.mark.parametrize("threads", [1, 2])
def test_tf1_collectives_that_feed_each_other_and_their_gradients(threads):
    # Chains (an all-reduce of an allgather), gradients (built after the forward ops), and more
    # independent collectives than threads, fetched together.
    r, n = hvd.rank(), hvd.size()

    def build():
        x = tf.ones([2, 2]) * (r + 1)
        gathered = hvd.allgather(x)
        chained = hvd.allreduce(gathered, op=hvd.Sum)
        loss = tf.reduce_sum(chained) + tf.reduce_sum(hvd.allreduce(x, op=hvd.Sum))
        (grad,) = tf1.gradients(loss, [x])
        others = [hvd.broadcast(tf.fill([2], r + i), i % n) for i in range(4)]
        return chained, grad, others

    chained, grad, others = _run(f"graph-{threads}", build)
    gathered = np.concatenate([np.full((2, 2), k + 1.0) for k in range(n)])
    np.testing.assert_array_equal(chained, n * gathered)
    # The upstream gradient of the gathered rows is n on every rank (the all-reduce's Sum), and
    # the allgather's gradient sums it over the n ranks; the all-reduce of x adds n more.
    np.testing.assert_allclose(grad, np.full((2, 2), n * n + n))
    for i, b in enumerate(others):
        np.testing.assert_array_equal(b, np.full(2, i % n + i))


def test_tf1_runs_that_fetch_part_of_the_graph():
    # Collectives that read different inputs run on their own: fetching the training step
    # does not re-run the broadcast of the variables, and the broadcast needs no feed.
    r, n = hvd.rank(), hvd.size()
    graph = tf.Graph()
    with graph.as_default():
        w = tf1.Variable(tf.fill([3], float(r)))
        sync = hvd.broadcast_([w], root_rank=0)
        x = tf1.placeholder(tf.float32, [2])
        sums = [hvd.allreduce(x * (i + 1), op=hvd.Sum) for i in range(3)]
        config = tf1.ConfigProto(inter_op_parallelism_threads=1)
        with tf1.Session(config=config) as session:
            session.run(tf1.global_variables_initializer())
            session.run(sync)
            np.testing.assert_array_equal(session.run(w), np.zeros(3))
            for step in range(3):
                got = session.run(sums, {x: [r + step, 1.0]})
                expected = np.array([n * step + n * (n - 1) / 2, n])
                for i, g in enumerate(got):
                    np.testing.assert_allclose(g, (i + 1) * expected)
            # Fetching one of the three sums alone still works: the others are submitted and
            # completed without being fetched.
            for _ in range(2):
                got = session.run(sums[1], {x: [1.0, 1.0]})
                np.testing.assert_allclose(got, np.full(2, 2.0 * n))
            got = session.run(sums, {x: [1.0, 2.0]})
            np.testing.assert_allclose(got[2], [3.0 * n, 6.0 * n])


def _alltoall_case(case, r, n, dtype):
    """Rank r's (tensor, splits) and what it receives: values are the sender's rank.

    "sends nothing": rank 1 sends no rows. "receives nothing": nobody sends rank 1 a row.
    """
    if case == "sends nothing":
        sends = [0 if r == 1 else r + 1] * n
        gets = [0 if k == 1 else k + 1 for k in range(n)]
    else:
        sends = [0 if k == 1 else r + 1 for k in range(n)]
        gets = [0 if r == 1 else k + 1 for k in range(n)]
    tensor = tf.cast(tf.fill([sum(sends), 2], r), dtype)
    return tensor, tf.constant(sends, tf.int32), gets


@pytest.mark.parametrize("threads", [1, 2])
def test_tf1_alltoall_outputs_fetched_in_separate_runs(threads):
    # Horovod's graph-mode alltoall tests: one graph, an alltoall named "a2a" per dtype, each
    # output evaluated in its own Session.run. Each run must finish what it submits, and two
    # collectives given one name in a graph are two requests, as Horovod's ops take node names.
    r, n = hvd.rank(), hvd.size()
    graph = tf.Graph()
    with graph.as_default(), _session(graph, threads) as session:
        for case in ("sends nothing", "receives nothing"):
            for dtype in (tf.float32, tf.float64, tf.int32, tf.int64, tf.float16, tf.uint8):
                tensor, splits, gets = _alltoall_case(case, r, n, dtype)
                collected, received_splits = hvd.alltoall(tensor, splits, name="a2a")
                expected = np.repeat(np.arange(n), gets).astype(dtype.as_numpy_dtype)
                got = session.run(collected)
                assert got.dtype == dtype.as_numpy_dtype
                np.testing.assert_array_equal(got, np.stack([expected, expected], axis=1))
                assert session.run(tf.size(collected)) == 2 * sum(gets)
                assert session.run(received_splits).tolist() == gets
                senders = expected[:, None].astype(np.int32)
                assert session.run(tf.reduce_all(tf.equal(tf.cast(collected, tf.int32), senders)))


@pytest.mark.parametrize("threads", [1, 2])
def test_tf1_other_collectives_fetched_one_output_at_a_time(threads):
    # Any subset of a collective's outputs runs the whole collective; names given twice in one
    # graph pair up by their order, as on every rank.
    r, n = hvd.rank(), hvd.size()
    rows = np.concatenate([np.full(k + 1, k) for k in range(n)])
    graph = tf.Graph()
    with graph.as_default(), _session(graph, threads) as session:
        w = tf1.Variable(tf.fill([2], float(r)))
        v = tf1.Variable(tf.fill([3], r), dtype=tf.int32)
        session.run(tf1.global_variables_initializer())
        for i in range(2):
            floats = tf.fill([r + 1, 2], float(r + i))
            ints = tf.cast(tf.fill([r + 1], r), tf.int64)
            gathered = hvd.grouped_allgather([floats, ints], name="g")
            scattered = hvd.grouped_reducescatter(
                [tf.fill([n + 1, 2], float(r)), tf.fill([2 * n], r)], op=hvd.Sum, name="rs"
            )
            sent = hvd.alltoall(tf.fill([n * (i + 1)], r), name="a2a")
            assigns = hvd.broadcast_([w, v], root_rank=n - 1, name="b")
            assert session.run(gathered[1]).tolist() == rows.tolist()
            assert session.run(tf.size(gathered[0])) == 2 * len(rows)
            np.testing.assert_array_equal(session.run(gathered[0])[:, 0], rows + i)
            total = n * (n - 1) // 2
            np.testing.assert_array_equal(session.run(scattered[1]), np.full(2, total))
            first = session.run(scattered[0])
            np.testing.assert_array_equal(first, np.full((2 if r == 0 else 1, 2), total))
            assert session.run(tf.shape(sent)).tolist() == [n * (i + 1)]
            np.testing.assert_array_equal(session.run(sent), np.repeat(np.arange(n), i + 1))
            session.run(assigns[1])
            np.testing.assert_array_equal(session.run(v), np.full(3, n - 1))
            session.run(assigns[0])
            np.testing.assert_array_equal(session.run(w), np.full(2, n - 1.0))


def test_tf1_run_leaves_no_collective_in_flight():
    # Fetching `first` also submits `second` (its wait runs after every submit that reads the
    # same sources), which rank 0 submits at once and the other ranks a second later. The run
    # must wait for it: right after it, eager code may submit a request of the same name.
    r = hvd.rank()

    def slow(x):
        if r != 0:
            time.sleep(1.0)
        return x

    graph = tf.Graph()
    with graph.as_default(), _session(graph, 2) as session:
        x = tf.ones([2])
        first = hvd.allreduce(x, op=hvd.Sum, name="first")
        later = tf.numpy_function(slow, [x], tf.float32, stateful=True)
        hvd.allreduce(later, op=hvd.Sum, name="second")
        np.testing.assert_array_equal(session.run(first), np.full(2, hvd.size()))
    eager = hvd.allreduce(tf.ones([2]), op=hvd.Sum, name="second")
    np.testing.assert_array_equal(eager.numpy(), np.full(2, hvd.size()))
