"""horovodlite.jax on every rank: collectives eagerly and inside jax.jit against numpy oracles,
errors on every rank, what JAX cannot do (vmap, handles in a trace), and DistributedOptimizer.
"""

import re

import ml_dtypes
import numpy as np
import pytest
from oracle import everyone, rank_values, reduce_expected

jax = pytest.importorskip("jax")
optax = pytest.importorskip("optax")
jax.config.update("jax_enable_x64", True)  # float64 and int64 arrays, as the other tests use
import horovodlite.jax as hvd  # noqa: E402
import jax.numpy as jnp  # noqa: E402

DTYPES = [np.uint8, np.int8, np.int16, np.int32, np.int64, np.float16, ml_dtypes.bfloat16,
          np.float32, np.float64]  # fmt: skip
OPS = [hvd.Average, hvd.Sum, hvd.Min, hvd.Max, hvd.Product]
MODES = ["eager", "jit"]


def run(mode: str, fn, *args):
    """Call `fn(*args)` eagerly or as a jitted function; return numpy results."""
    out = (jax.jit(fn) if mode == "jit" else fn)(*args)
    return jax.tree.map(np.asarray, out)


def raised_everywhere(call, *fragments) -> str:
    """Run `call`, which must raise on every rank (inside jit, JAX's RuntimeError wraps the
    collective's error); check its text names `fragments`; return the text."""
    with pytest.raises(RuntimeError) as info:
        call()
    text = str(info.value)
    for fragment in fragments:
        assert fragment in text, f"{fragment!r} missing from: {text[-2000:]}"
    return text


class JittedCall:
    """A jitted function and its arguments, called to the end of its computation."""

    def __init__(self, fn, *args):
        self.fn, self.args = jax.jit(fn), args

    def __call__(self):
        return jax.block_until_ready(self.fn(*self.args))


def still_in_step() -> None:
    n = hvd.size()
    assert float(hvd.allreduce(jnp.ones(()), op=hvd.Sum, name="after.error")) == n
    assert hvd.allgather_object(hvd.rank()) == list(range(n))


# -- all-reduce -------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_allreduce_every_dtype_and_op(dtype, mode):
    r = hvd.rank()
    x = rank_values((3, 4), dtype, r)
    inputs = everyone(x)
    for op in OPS:
        for pre, post in ((1.0, 1.0), (0.5, 3.0)):
            out = run(mode, lambda a, op=op, pre=pre, post=post: hvd.allreduce(
                a, op=op, prescale_factor=pre, postscale_factor=post), jnp.asarray(x))  # fmt: skip
            expected = reduce_expected(inputs, op, pre, post)
            assert out.dtype == expected.dtype
            if op == hvd.Average or post != 1.0:
                tolerance = 2e-2 if np.dtype(dtype).itemsize == 2 else 1e-6
                if np.dtype(dtype).kind in "iu":
                    tolerance = 1  # scaled in float64 and truncated: one unit at most
                np.testing.assert_allclose(out.astype(float), expected.astype(float),
                                           rtol=tolerance, atol=tolerance)  # fmt: skip
            else:
                np.testing.assert_array_equal(out, expected)


@pytest.mark.parametrize("mode", MODES)
def test_grouped_allreduce_mixed_dtypes_and_async(mode):
    n, r = hvd.size(), hvd.rank()
    tensors = [jnp.ones(3), jnp.full((2, 2), r, dtype=jnp.int32), jnp.arange(2.0)]
    out = run(mode, lambda ts: hvd.grouped_allreduce(ts, op=hvd.Sum, name="g"), tensors)
    assert out[0].tolist() == [n] * 3
    assert out[1].dtype == np.int32 and out[1].tolist() == [[n * (n - 1) // 2] * 2] * 2
    assert out[2].tolist() == [0.0, n]
    assert run(mode, lambda ts: hvd.grouped_allreduce(ts), []) == []
    handle = hvd.grouped_allreduce_async([jnp.ones(1), jnp.ones(2)], name="ga", op=hvd.Sum)
    assert [o.tolist() for o in hvd.synchronize(handle)] == [[n], [n, n]]
    handle = hvd.allreduce_async(jnp.full((2,), float(r)), name="a.async")
    assert hvd.synchronize(handle).tolist() == [(n - 1) / 2] * 2 and hvd.poll(handle)


@pytest.mark.parametrize("mode", MODES)
def test_compression_round_trip(mode):
    n = hvd.size()
    x = jnp.full((4,), 1.5, dtype=jnp.float32)
    for compression in (hvd.Compression.fp16, hvd.Compression.bf16):
        out = run(mode, lambda a, c=compression: hvd.allreduce(a, op=hvd.Sum, compression=c), x)
        assert out.dtype == np.float32 and out.tolist() == [1.5 * n] * 4
    ints = jnp.ones(2, dtype=jnp.int32)
    compressed = run(mode, lambda a: hvd.allreduce(a, compression=hvd.Compression.fp16), ints)
    assert compressed.dtype == np.int32


@pytest.mark.parametrize("mode", MODES)
def test_process_set_of_even_ranks(mode):
    n, r = hvd.size(), hvd.rank()
    if n == 1:
        pytest.skip("needs two ranks")
    even = hvd.add_process_set(list(range(0, n, 2)))
    try:
        if r % 2 == 0:
            out = run(mode, lambda a: hvd.allreduce(a, op=hvd.Sum, process_set=even),
                      jnp.full((2,), float(r)))  # fmt: skip
            assert out.tolist() == [float(sum(range(0, n, 2)))] * 2
            gathered = run(mode, lambda a: hvd.allgather(a, process_set=even), jnp.ones((1, 2)))
            assert gathered.shape == (len(range(0, n, 2)), 2)
    finally:
        hvd.remove_process_set(even)


def test_mismatched_shape_inside_jit_raises_on_every_rank():
    r = hvd.rank()
    if hvd.size() == 1:
        pytest.skip("needs two ranks")
    call = JittedCall(lambda a: hvd.allreduce(a, name="bad.shape"), jnp.ones(3 + (r == 1)))
    raised_everywhere(call, "rank 1", "(4,)")
    still_in_step()


# -- allgather, broadcast, reduce-scatter, alltoall --------------------------------------------


@pytest.mark.parametrize("mode", MODES)
def test_allgather_uneven_rows(mode):
    r, n = hvd.rank(), hvd.size()
    rows = [k + 1 for k in range(n)]
    x = jnp.full((r + 1, 2), float(r))
    out = run(mode, lambda a: hvd.allgather(a, rows=rows), x)
    assert out[:, 0].tolist() == [float(k) for k in range(n) for _ in range(k + 1)]
    equal = run(mode, hvd.allgather, jnp.full((2,), r, dtype=jnp.int64))
    assert equal.tolist() == [k for k in range(n) for _ in range(2)]
    first, second = run(mode, lambda a, b: hvd.grouped_allgather([a, b], rows=[None, rows]),
                        jnp.ones((1, 3)), x)  # fmt: skip
    assert first.shape == (n, 3) and second.shape == (sum(rows), 2)
    handle = hvd.grouped_allgather_async([jnp.ones(1), jnp.ones(r)], name="gag")
    a, b = hvd.synchronize(handle)
    assert a.shape[0] == n and b.shape[0] == sum(range(n))
    assert hvd.synchronize(hvd.allgather_async(x)).shape == (sum(rows), 2)


def test_allgather_rows_that_differ_from_the_trace_raise_on_every_rank():
    r, n = hvd.rank(), hvd.size()
    if n == 1:
        pytest.skip("needs two ranks")
    call = JittedCall(lambda a: hvd.allgather(a, name="bad.rows"), jnp.ones((r + 1, 2)))
    held = [k + 1 for k in range(n)]
    raised_everywhere(call, "fixed when traced", f"hold {held}", f"rows={held}")
    still_in_step()
    # One rank alone states wrong rows (an entry too many), eagerly and inside jit: every rank
    # raises, none is left waiting in the allgather.
    rows = [1] * (n + 1) if r == n - 1 else [1] * n
    with pytest.raises(ValueError, match=f"rank {n - 1} expected {n + 1} rows"):
        hvd.allgather(jnp.ones(1), name="bad.rows.eager", rows=rows)
    call = JittedCall(lambda a: hvd.allgather(a, name="bad.rows.one", rows=rows), jnp.ones(1))
    raised_everywhere(call, f"rank {n - 1} expected {n + 1} rows", f"rows={[1] * n}")
    still_in_step()


@pytest.mark.parametrize("mode", MODES)
def test_broadcast(mode):
    r, n = hvd.rank(), hvd.size()
    root = n - 1
    out = run(mode, lambda a: hvd.broadcast(a, root), jnp.arange(3) * (r + 1))
    assert out.tolist() == [0, n, 2 * n]
    handle = hvd.broadcast_async(jnp.full((1,), float(r)), 0, name="b.async")
    assert hvd.synchronize(handle).tolist() == [0.0]


def test_bad_root_raises_on_every_rank():
    n = hvd.size()
    call = JittedCall(lambda a: hvd.broadcast(a, n + 3, name="bad.root"), jnp.ones(2))
    raised_everywhere(call, f"root_rank {n + 3}")
    still_in_step()


@pytest.mark.parametrize("mode", MODES)
def test_reducescatter_uneven_rows(mode):
    r, n = hvd.rank(), hvd.size()
    rows = 2 * n + 1
    out = run(mode, lambda a: hvd.reducescatter(a, op=hvd.Sum), jnp.ones((rows, 3)))
    assert out.shape == (rows // n + (1 if r < rows % n else 0), 3)
    assert np.unique(out).tolist() == [float(n)]
    both = run(mode, lambda a, b: hvd.grouped_reducescatter([a, b]),
               jnp.full((n, 1), 2.0), jnp.ones((n + 1,)))  # fmt: skip
    assert both[0].tolist() == [[2.0]]
    assert both[1].shape == ((n + 1) // n + (1 if r < (n + 1) % n else 0),)
    averaged = hvd.synchronize(hvd.reducescatter_async(jnp.full((n, 1), 2.0), name="rs"))
    assert averaged.tolist() == [[2.0]]
    pair = hvd.synchronize(hvd.grouped_reducescatter_async([jnp.ones((n,))], op=hvd.Sum))
    assert pair[0].tolist() == [float(n)]


@pytest.mark.parametrize("mode", MODES)
def test_alltoall_even_and_with_splits(mode):
    r, n = hvd.rank(), hvd.size()
    out = run(mode, hvd.alltoall, jnp.arange(2 * n) + 100 * r)
    assert out.tolist() == [100 * k + 2 * r + j for k in range(n) for j in range(2)]
    splits = [r + 1 if k == (r + 1) % n else 0 for k in range(n)]
    sender = (r - 1) % n
    expected = [sender + 1 if k == sender else 0 for k in range(n)]
    x = jnp.full((sum(splits), 2), float(r))
    received, received_splits = run(
        mode, lambda a: hvd.alltoall(a, splits, received_splits=expected), x
    )
    assert received_splits.dtype == np.int32 and received_splits.tolist() == expected
    assert received[:, 0].tolist() == [float(sender)] * (sender + 1)
    out, got = hvd.synchronize(hvd.alltoall_async(x, splits, name="a2a.async"))
    assert got.tolist() == expected and out.shape == (sender + 1, 2)


def test_alltoall_splits_that_differ_from_the_trace_raise_on_every_rank():
    r, n = hvd.rank(), hvd.size()
    if n == 1:
        pytest.skip("needs two ranks")
    # Every rank sends all its rows to rank 0, and wrongly expects one row from each rank.
    splits = [r + 1] + [0] * (n - 1)
    call = JittedCall(lambda a: hvd.alltoall(a, splits, received_splits=[1] * n),
                      jnp.ones((r + 1,)))  # fmt: skip
    raised_everywhere(call, "expected [1", "received_splits must hold")
    indivisible = JittedCall(hvd.alltoall, jnp.ones((n + (r == 0),)))
    raised_everywhere(indivisible, "rank 0's", "do not divide")
    still_in_step()
    with pytest.raises(TypeError, match="needs received_splits"):
        jax.jit(lambda a: hvd.alltoall(a, [1] * n))(jnp.ones(n))


# -- what JAX cannot do -----------------------------------------------------------------------


def test_vmap_of_a_collective_raises_a_clear_error():
    batch = jnp.ones((2, 3))
    step = jax.jit(lambda x: hvd.allreduce(x))
    for transformed in (
        jax.vmap(hvd.allreduce),
        jax.jit(jax.vmap(hvd.allreduce)),
        jax.vmap(step),
        jax.vmap(jax.grad(lambda x: hvd.allreduce(x).sum())),
    ):
        with pytest.raises(ValueError, match="allreduce cannot run under jax.vmap"):
            transformed(batch)  # fmt: skip
    still_in_step()


def test_forward_mode_raises_as_documented_and_remat_recomputes():
    # docs/jax.md, "What does not work": JAX's own error, raised before any collective runs.
    x = jnp.ones(3)
    with pytest.raises(TypeError, match="can't apply forward-mode autodiff"):
        jax.jvp(lambda v: hvd.allreduce(v), (x,), (x,))
    # jax.checkpoint runs the collective again in the backward pass, on every rank alike: the
    # gradient of the sum of the ranks' losses, as without it.
    r, n = hvd.rank(), hvd.size()
    x = jnp.arange(3.0) + r

    def loss(v):
        return (jnp.sin(hvd.allreduce(v * v, op=hvd.Sum)) * (r + 1)).sum()

    plain = jax.jit(jax.grad(loss))(x)
    remat = jax.jit(jax.grad(jax.checkpoint(loss)))(x)
    total = sum((jnp.arange(3.0) + k) ** 2 for k in range(n))
    expected = 2 * x * jnp.cos(total) * sum(k + 1 for k in range(n))
    np.testing.assert_allclose(np.asarray(remat), np.asarray(expected), rtol=1e-6)
    np.testing.assert_array_equal(np.asarray(remat), np.asarray(plain))
    still_in_step()


def test_handles_and_objects_refuse_a_trace():
    for call in (lambda x: hvd.synchronize(hvd.allreduce_async(x)),
                 lambda x: hvd.broadcast_object(x),
                 lambda x: hvd.allgather_object(1) and x,
                 lambda x: hvd.join() and x):  # fmt: skip
        with pytest.raises(TypeError, match="cannot run inside jax.jit"):
            jax.jit(call)(jnp.ones(2))


def test_objects_and_join():
    r, n = hvd.rank(), hvd.size()
    assert hvd.broadcast_object({"r": r}, root_rank=0) == {"r": 0}
    assert hvd.allgather_object(r) == list(range(n))
    for i in range(r):  # uneven work: rank r runs r extra all-reduces before joining
        out = hvd.synchronize(hvd.allreduce_async(jnp.ones(2), name="uneven", op=hvd.Sum))
        assert out.tolist() == [float(sum(1 for k in range(n) if k >= i + 1))] * 2
    assert hvd.join() == n - 1


def test_barrier_inside_jit_and_collectives_in_program_order():
    n, r = hvd.size(), hvd.rank()

    @jax.jit
    def many(x):
        hvd.barrier()
        for i in range(8):  # each rank's later collectives depend on none of the earlier ones
            x = x + hvd.allreduce(jnp.full((3,), float(i + r)), op=hvd.Sum, name=f"order.{i}")
        return x

    pending = many(jnp.zeros(3))  # dispatched; the eager collective below must wait for it
    eager = hvd.allreduce(jnp.full((2,), float(r)), op=hvd.Sum, name="order.eager")
    total = sum(n * i + n * (n - 1) / 2 for i in range(8))
    assert np.asarray(pending).tolist() == [total] * 3
    assert eager.tolist() == [n * (n - 1) / 2] * 2
    hvd.barrier()


def test_an_eager_collective_waits_for_a_step_still_running_on_xlas_thread():
    # On rank 0 a computation long enough that JAX returns before XLA has run it (on XLA's own
    # thread), elsewhere a short one that runs at once: rank 0's eager collective must not
    # start before its step's collective has run, or it would meet the others' step.
    n, r = hvd.size(), hvd.rank()
    side = 1000 if r == 0 else 6
    m = jnp.full((side, side), 1.0 / side)  # m @ m is m

    @jax.jit
    def slow_step(m, x):
        for _ in range(4):
            m = m @ m
        return hvd.allreduce(x + m[0, 0], op=hvd.Sum, name="slow.step")

    mine = jax.block_until_ready(jnp.full((2,), float(r)))  # (made after the step, it would
    for i in range(3):  # wait for the step anyway: JAX runs a device's work in order)
        pending = slow_step(m, jnp.full((2,), float(r + i)))
        eager = hvd.allreduce(mine, op=hvd.Max, name="after.slow.step")
        assert eager.tolist() == [float(n - 1)] * 2
        total = sum(k + i + (1 / 1000 if k == 0 else 1 / 6) for k in range(n))
        np.testing.assert_allclose(np.asarray(pending), [total] * 2, rtol=1e-6)


def test_collectives_inside_scan_and_cond():
    n, r = hvd.size(), hvd.rank()

    @jax.jit
    def loop(x):
        def body(carry, i):
            return carry + hvd.allreduce(jnp.zeros_like(carry) + i + r, op=hvd.Sum), None

        out, _ = jax.lax.scan(body, x, jnp.arange(3.0))
        # Every rank takes the same branch: its all-reduce runs on every rank or on none.
        return jax.lax.cond(out.sum() > 0, lambda: hvd.allreduce(out, op=hvd.Max), lambda: out)

    expected = sum(n * i + n * (n - 1) / 2 for i in range(3))
    assert np.asarray(loop(jnp.zeros(2))).tolist() == [expected] * 2


def test_large_arrays_inside_jit_match_eager():
    # Inside jit the core reads and writes XLA's own buffers (xla_ffi.py); arrays of half a MiB
    # and more give the same results as eagerly, beside small ones, inside scan, under grad,
    # and errors on every rank.
    r, n = hvd.rank(), hvd.size()
    rows = 64 * 1024 // 8 + r  # float64 rows of 8 bytes
    x = jnp.arange(rows * 4, dtype=jnp.float64).reshape(rows, 4) + r
    even = jnp.arange(64 * 1024 * n, dtype=jnp.float32).reshape(-1, 4) * (r + 1)
    every = [64 * 1024 // 8 + k for k in range(n)]
    cases = {
        "allreduce": lambda a, e: hvd.allreduce(e, op=hvd.Average, prescale_factor=2.0),
        "grouped": lambda a, e: hvd.grouped_allreduce(
            [e, (e % 1000).astype(jnp.float16), jnp.ones(3) * r], op=hvd.Sum),
        "allgather": lambda a, e: hvd.allgather(a, rows=every),
        "broadcast": lambda a, e: hvd.broadcast(e, root_rank=n - 1),
        "reducescatter": lambda a, e: hvd.reducescatter(e, op=hvd.Sum),
        "alltoall": lambda a, e: hvd.alltoall(e),
        "small then large": lambda a, e: (hvd.allreduce(jnp.ones(2) * r, op=hvd.Max),
                                          hvd.allreduce(e, op=hvd.Min)),
    }  # fmt: skip
    for name, case in cases.items():
        eager = jax.tree.map(np.asarray, case(x, even))
        jitted = jax.tree.map(np.asarray, jax.jit(case)(x, even))
        assert jax.tree.structure(eager) == jax.tree.structure(jitted), name
        for a, b in zip(jax.tree.leaves(eager), jax.tree.leaves(jitted)):
            assert a.dtype == b.dtype and np.array_equal(a, b), name

    # The in-place all-reduce works in a buffer XLA lends it: never in the caller's arrays.
    assert np.array_equal(np.asarray(even), np.arange(even.size).reshape(-1, 4) * (r + 1))

    def body(carry, _):
        return hvd.allreduce(carry, op=hvd.Average), None

    looped = jax.jit(lambda e: jax.lax.scan(body, e, None, length=3)[0])(even)
    mean = np.asarray(hvd.allreduce(even, op=hvd.Average))
    np.testing.assert_allclose(np.asarray(looped), mean, rtol=1e-6)
    grad = jax.jit(jax.grad(lambda e: jnp.sum(hvd.allreduce(e, op=hvd.Sum) * 2.0)))(even)
    assert np.asarray(grad).min() == np.asarray(grad).max() == 2.0 * n
    if n > 1:
        base = 64 * 1024 // 8
        bad = jnp.ones((base + (r == 1), 4))
        call = JittedCall(lambda a: hvd.allreduce(a, name="large.bad.shape"), bad)
        raised_everywhere(call, "rank 1", f"({base + 1}, 4)")
        still_in_step()


def test_a_failure_after_successful_calls_names_the_horovodlite_error():
    # The second call of a jitted function runs on JAX's C++ dispatch, which raises every
    # failure as a ValueError (jax-ml/jax#34083): the text still names the problem, and
    # collective_failure (hvd.elastic.run's) finds the horovodlite error behind it.
    from horovodlite.jax.host import collective_failure

    from horovodlite.exceptions import HorovodLiteError

    r = hvd.rank()
    step = jax.jit(lambda x, k: hvd.allreduce(x * k, name="fails.later"))
    assert np.asarray(step(jnp.ones(2), 1.0)).tolist() == [1.0, 1.0]
    if hvd.size() == 1:
        return
    bad = jnp.ones(2 + (r == 1))  # a new shape on rank 1: a new trace there, the same name
    with pytest.raises((ValueError, RuntimeError)) as info:
        jax.block_until_ready(step(bad, 1.0) if r == 1 else step(jnp.ones(2), 2.0))
    failure = collective_failure(info.value)
    assert isinstance(failure, HorovodLiteError), repr(info.value)
    assert "rank 1" in str(failure) and "(3,)" in str(failure)
    still_in_step()


def test_metric_averaged_in_a_jitted_eval_step():
    r, n = hvd.rank(), hvd.size()
    weights = jnp.arange(3.0)

    @jax.jit
    def evaluate(w, x, y):
        accuracy = jnp.mean((x @ w > 1.0) == y)
        return hvd.allreduce(accuracy, name="accuracy")

    x = jnp.eye(3) * (r + 1)
    y = jnp.array([False, r > 0, True])
    mine = [float(np.mean((np.eye(3) * (k + 1) @ np.arange(3.0) > 1.0) == [False, k > 0, True]))
            for k in range(n)]  # fmt: skip
    assert float(evaluate(weights, x, y)) == pytest.approx(sum(mine) / n)


# -- parameters, optimizer state, DistributedOptimizer ----------------------------------------


def test_broadcast_parameters_and_optimizer_state():
    r = hvd.rank()
    key = jax.random.key(r)
    params = {"w": jnp.full((2, 3), float(r)), "b": (np.arange(2) + r, 3.5 + r), "key": key}
    got = hvd.broadcast_parameters(params, root_rank=0)
    assert jax.random.key_impl(got["key"]) == jax.random.key_impl(key)
    assert (
        np.asarray(jax.random.key_data(got["key"])).tolist()
        == np.asarray(jax.random.key_data(jax.random.key(0))).tolist()
    )
    assert isinstance(got["w"], jax.Array) and np.asarray(got["w"]).tolist() == [[0.0] * 3] * 2
    assert isinstance(got["b"][0], np.ndarray) and got["b"][0].tolist() == [0, 1]
    assert got["b"][1] == 3.5
    tx = optax.adam(0.1)
    state = tx.init({"w": jnp.ones(2) * r})
    state = jax.tree.map(lambda a: a + r, state)
    root_state = hvd.broadcast_optimizer_state(state, root_rank=0)
    assert jax.tree.structure(root_state) == jax.tree.structure(state)
    assert all(float(jnp.max(leaf)) == 0.0 for leaf in jax.tree.leaves(root_state))


def test_broadcast_parameters_of_different_trees_raises_on_every_rank():
    r, n = hvd.rank(), hvd.size()
    if n == 1:
        pytest.skip("needs two ranks")
    params = {"w": jnp.ones(2 + (r == n - 1))}
    with pytest.raises(ValueError, match=rf"rank\(s\) \[{n - 1}\] differs from root rank 0"):
        hvd.broadcast_parameters(params, root_rank=0)
    tree = {"w": jnp.ones(2)} if r else {"v": jnp.ones(2)}
    with pytest.raises(ValueError, match="its structure is"):
        hvd.broadcast_parameters(tree, root_rank=0)
    # One rank names another root, then one outside the set: every rank raises.
    roots = [0] * n
    roots[n - 1] = n - 1
    with pytest.raises(ValueError, match=re.escape(f"name the roots {roots}")):
        hvd.broadcast_parameters({"w": jnp.ones(2)}, root_rank=roots[r])
    with pytest.raises(ValueError, match=f"root_rank {n} is not in the process set"):
        hvd.broadcast_optimizer_state({"w": jnp.ones(2)}, root_rank=n)
    still_in_step()


def _gradients(r):
    return {"w": jnp.full((2, 2), float(r)), "b": jnp.full((3,), r, dtype=jnp.float32)}


def test_donated_inputs_are_reduced_in_their_own_buffers():
    # A step jitted with donate_argnums lends XLA the caller's buffers: the in-place all-reduce
    # then works in the donated buffer itself (no copy). Results fed back call after call, small
    # and large (from 64 KiB a buffer of its own), single and grouped, and a donated train step.
    r, n = hvd.rank(), hvd.size()
    small = jnp.arange(12, dtype=jnp.float32).reshape(3, 4) + r
    large = jnp.arange(64 * 1024 // 4 * 2, dtype=jnp.float32) * (r + 1)
    mean_small = np.arange(12, dtype=np.float32).reshape(3, 4) + (n - 1) / 2
    mean_large = np.arange(large.size, dtype=np.float32) * (n + 1) / 2
    single = jax.jit(lambda a: hvd.allreduce(a, op=hvd.Average), donate_argnums=0)
    grouped = jax.jit(lambda a, b: hvd.grouped_allreduce([a, b], op=hvd.Average),
                      donate_argnums=(0, 1))  # fmt: skip
    a, b = single(small.copy()), single(large.copy())
    c, d = grouped(small.copy(), large.copy())
    for _ in range(2):  # the mean of equal arrays is themselves: each result feeds the next call
        a, b = single(a), single(b)
        c, d = grouped(c, d)
    for got, want in ((a, mean_small), (b, mean_large), (c, mean_small), (d, mean_large)):
        np.testing.assert_allclose(np.asarray(got), want, rtol=1e-6)
    assert np.array_equal(np.asarray(large), np.arange(large.size) * (r + 1))  # not donated

    params = {"w": jnp.ones((256, 128), jnp.float32), "b": jnp.ones(5, jnp.float32)}
    tx = hvd.DistributedOptimizer(optax.adam(0.1))

    def step(params, state):
        grads = jax.tree.map(lambda p: p * (r + 1), params)
        updates, state = tx.update(grads, state, params)
        return optax.apply_updates(params, updates), state

    kept, donating = jax.jit(step), jax.jit(step, donate_argnums=(0, 1))
    one = two = (params, tx.init(params))
    for _ in range(3):
        one, two = kept(*one), donating(*jax.tree.map(jnp.copy, two))
    for x, y in zip(jax.tree.leaves(one), jax.tree.leaves(two)):
        assert np.array_equal(np.asarray(x), np.asarray(y))


@pytest.mark.parametrize("mode", MODES)
def test_distributed_optimizer_averages_the_gradients(mode):
    r, n = hvd.rank(), hvd.size()
    params = {"w": jnp.zeros((2, 2)), "b": jnp.zeros(3, dtype=jnp.float32)}
    mean = (n - 1) / 2
    for kwargs, factor in (({}, 1.0), ({"op": hvd.Sum}, n), ({"gradient_predivide_factor": 2.0}, 1),
                           ({"compression": hvd.Compression.fp16}, 1.0)):  # fmt: skip
        tx = hvd.DistributedOptimizer(optax.sgd(1.0), **kwargs)
        state = tx.init(params)
        updates, _ = run(mode, tx.update, _gradients(r), state, params)
        assert updates["b"].dtype == np.float32
        assert updates["w"].tolist() == [[-mean * factor] * 2] * 2, kwargs
        assert updates["b"].tolist() == [-mean * factor] * 3, kwargs


@pytest.mark.parametrize("mode", MODES)
def test_distributed_optimizer_compresses_only_what_travels(mode):
    # fp16 on the wire rounds 1/3 and flushes 1e-8 to zero; alone in its set a rank sends
    # nothing, so its update is the plain optimizer's, as one process's.
    tx = hvd.DistributedOptimizer(optax.sgd(1.0), compression=hvd.Compression.fp16)
    params = {"w": jnp.zeros(2)}
    grads = {"w": jnp.array([1e-8, 1 / 3], dtype=jnp.float32)}
    updates, _ = run(mode, tx.update, grads, tx.init(params), params)
    if hvd.size() == 1:
        assert updates["w"].tolist() == (-grads["w"]).tolist()
    else:
        assert updates["w"].tolist() == [0.0, -float(np.float16(1 / 3))]


def test_distributed_optimizer_packs_small_gradients_inside_jit():
    # Inside jit the gradients under 64 KiB travel packed, one array per dtype; large ones and
    # a dtype's only small one as they are: every leaf still gets its own average.
    r, n = hvd.rank(), hvd.size()
    shapes = {"big": ((160, 128), jnp.float32), "w": ((3, 4), jnp.float32),
              "b": ((4,), jnp.float32), "s": ((), jnp.float32), "h": ((5,), jnp.float16),
              "d": ((2, 2), jnp.float64), "e": ((3,), jnp.float64)}  # fmt: skip
    grads = {k: jnp.arange(np.prod(shape), dtype=dtype).reshape(shape) * (r + 1) + r
             for k, (shape, dtype) in shapes.items()}  # fmt: skip
    params = jax.tree.map(jnp.zeros_like, grads)
    tx = hvd.DistributedOptimizer(optax.sgd(1.0))
    updates, _ = run("jit", tx.update, grads, tx.init(params), params)
    mean = (n + 1) / 2
    for k, (shape, dtype) in shapes.items():
        expected = -(np.arange(np.prod(shape)).reshape(shape) * mean + (n - 1) / 2)
        assert updates[k].dtype == dtype and updates[k].shape == shape, k
        tolerance = 1e-3 if dtype == jnp.float16 else 1e-6
        np.testing.assert_allclose(updates[k], expected, rtol=tolerance, atol=tolerance)


@pytest.mark.parametrize("mode", MODES)
def test_distributed_optimizer_accumulates_backward_passes(mode):
    r, n = hvd.rank(), hvd.size()
    params = {"w": jnp.zeros((2, 2)), "b": jnp.zeros(3, dtype=jnp.float32)}
    tx = hvd.DistributedOptimizer(optax.sgd(1.0), backward_passes_per_step=2)
    state = tx.init(params)
    assert isinstance(state, hvd.DistributedState)
    update = jax.jit(tx.update) if mode == "jit" else tx.update
    first, state = update(_gradients(r), state, params)
    assert all(float(jnp.abs(u).max()) == 0 for u in jax.tree.leaves(first))
    second, state = update(_gradients(r + 1), state, params)
    mean = (n - 1) / 2 * 2 + 1  # the sum of the two passes, averaged over the ranks
    assert np.asarray(second["w"]).tolist() == [[-mean] * 2] * 2
    assert int(state.passes) == 0
    assert all(float(jnp.abs(a).max()) == 0 for a in jax.tree.leaves(state.accumulated))


def test_distributed_optimizer_checks_its_arguments_before_communicating():
    with pytest.raises(ValueError, match="Average, Sum or Adasum"):
        hvd.DistributedOptimizer(optax.sgd(1.0), op=hvd.Max)
    with pytest.raises(ValueError, match="backward_passes_per_step must be >= 1"):
        hvd.DistributedOptimizer(optax.sgd(1.0), backward_passes_per_step=0)
    with pytest.raises(NotImplementedError, match="Adasum"):
        hvd.DistributedOptimizer(optax.sgd(1.0), op=hvd.Adasum)
