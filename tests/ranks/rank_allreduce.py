"""allreduce and allreduce_ on every rank: every algorithm, dtype, op and awkward shape."""

import ml_dtypes
import numpy as np
import pytest
from oracle import (
    ALGORITHMS,
    DTYPES,
    OPS,
    WORLD,
    assert_reduced,
    dtype_id,
    everyone,
    expect_error_everywhere,
    rank_values,
    reduce_expected,
    still_in_step,
)

import horovodlite as hvd
from horovodlite import algorithms, small_allreduce
from horovodlite.agreement import inline_bytes


def forms(x, **kwargs):
    """Yield (form, result) for the out-of-place and the in-place all-reduce of `x`."""
    yield "allreduce", hvd.allreduce(x.copy(), **kwargs)
    inplace = x.copy()
    result = hvd.allreduce_(inplace, **kwargs)
    assert result is inplace
    yield "allreduce_", inplace


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_every_dtype_and_op(algorithm, dtype):
    x = rank_values((3, 5), dtype, hvd.rank(), seed=1)
    inputs = everyone(x)
    for op in OPS:
        if dtype == np.bool_ and op == hvd.Average:
            with pytest.raises(TypeError, match="Average of bool"):
                hvd.allreduce(x, op=op, algorithm=algorithm)
            continue
        for form, out in forms(x, op=op, algorithm=algorithm, name=f"{dtype}.{op.name}"):
            try:
                assert_reduced(out, reduce_expected(inputs, op), op)
            except AssertionError as exc:
                raise AssertionError(f"{form} op={op.name}: {exc}") from None


def awkward_shapes(n: int) -> list:
    return [
        (0,),  # empty
        (0, 3),  # empty with trailing dimensions
        (),  # 0-d
        (1,),
        (max(n - 1, 1),),  # fewer elements than ranks
        (n + 1,),  # not divisible by the rank count
        (2 * n + 1, 3),
        (4, 1, 5),
    ]


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_awkward_shapes(algorithm):
    for shape in awkward_shapes(hvd.size()):
        for dtype, op in ((np.float32, hvd.Sum), (np.int32, hvd.Max), (np.float64, hvd.Average)):
            x = rank_values(shape, dtype, hvd.rank(), seed=2)
            expected = reduce_expected(everyone(x), op)
            for form, out in forms(x, op=op, algorithm=algorithm):
                try:
                    assert_reduced(out, expected, op)
                except AssertionError as exc:
                    raise AssertionError(f"{form} shape={shape} {np.dtype(dtype)}: {exc}") from None


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_non_contiguous_views(algorithm):
    base = rank_values((6, 8), np.float64, hvd.rank(), seed=3)
    views = {
        "transposed": lambda a: a.T,
        "strided": lambda a: a[::2, 1::3],
        "reversed": lambda a: a[::-1, ::-2],
    }
    for label, view in views.items():
        expected = reduce_expected(everyone(view(base).copy()), hvd.Sum)
        out = hvd.allreduce(view(base), op=hvd.Sum, algorithm=algorithm)
        assert_reduced(out, expected)
        target = base.copy()
        untouched = np.ones(target.shape, bool)
        view(untouched)[...] = False
        result = hvd.allreduce_(view(target), op=hvd.Sum, algorithm=algorithm)
        assert_reduced(view(target), expected)
        assert np.shares_memory(result, target), f"{label}: allreduce_ did not return the view"
        np.testing.assert_array_equal(target[untouched], base[untouched], err_msg=label)


@pytest.mark.parametrize("algorithm", ["ring", None])
def test_large_buffer_crosses_ring_segments(algorithm):
    n, r = hvd.size(), hvd.rank()
    # Each rank's ring chunk is over the 1 MiB segment, so chunks travel as several segments.
    count = n * (5 << 20) // (4 * 4) + 3
    pattern = np.arange(count, dtype=np.int64) % 251
    x = (pattern + r).astype(np.float32)
    out = hvd.allreduce(x, op=hvd.Sum, algorithm=algorithm)
    np.testing.assert_array_equal(out, (n * pattern + n * (n - 1) // 2).astype(np.float32))
    hvd.allreduce_(x, op=hvd.Average, algorithm=algorithm)
    np.testing.assert_allclose(x, pattern + (n - 1) / 2, rtol=1e-6)


@pytest.mark.parametrize("segment_bytes", ["1", "8", "20"])
def test_small_ring_segments(monkeypatch, segment_bytes):
    monkeypatch.setenv("HOROVODLITE_RING_SEGMENT_BYTES", segment_bytes)
    reinit()  # init() reads the settings
    try:
        assert hvd.state.current().settings.ring_segment_bytes == int(segment_bytes)
        for dtype in (np.float64, np.float16, ml_dtypes.bfloat16, np.uint8):
            x = rank_values((37,), dtype, hvd.rank(), seed=4)
            expected = reduce_expected(everyone(x), hvd.Sum)
            for _, out in forms(x, op=hvd.Sum, algorithm="ring"):
                assert_reduced(out, expected)
    finally:
        monkeypatch.delenv("HOROVODLITE_RING_SEGMENT_BYTES")
        reinit()


@pytest.mark.parametrize("dtype", [np.float32, np.float16, ml_dtypes.bfloat16], ids=dtype_id)
@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_bitwise_identical_on_every_rank(algorithm, dtype):
    n = hvd.size()
    rng = np.random.default_rng([5, hvd.rank()])
    for count in (1000, 100_003):
        x = rng.standard_normal(count).astype(dtype)
        exact = np.sum([v.astype(np.float64) for v in everyone(x)], axis=0)
        for op in (hvd.Sum, hvd.Average):
            out = hvd.allreduce(x, op=op, algorithm=algorithm)
            results = WORLD.allgather(out.tobytes())
            differ = [k for k in range(n) if results[k] != results[0]]
            assert not differ, f"ranks {differ} got other bits than rank 0 ({op.name}, {count})"
            scale = 1 / n if op == hvd.Average else 1
            eps = float(ml_dtypes.finfo(dtype).eps)
            np.testing.assert_allclose(
                out.astype(np.float64), exact * scale, rtol=4 * n * eps, atol=16 * n * eps
            )


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_prescale_and_postscale(algorithm):
    cases = [
        (np.float32, hvd.Sum, 2.0, 0.5),
        (np.float64, hvd.Average, 3.0, 0.25),
        (np.float16, hvd.Max, -1.0, 2.0),
        (np.int32, hvd.Sum, 3.0, 0.5),  # integers truncate toward zero after each scaling
        (np.int64, hvd.Average, 1.0, 3.0),
        (np.uint8, hvd.Sum, 1.0, 0.5),
    ]
    for dtype, op, pre, post in cases:
        x = rank_values((11,), dtype, hvd.rank(), seed=6)
        expected = reduce_expected(everyone(x), op, pre, post)
        kwargs = dict(op=op, prescale_factor=pre, postscale_factor=post, algorithm=algorithm)
        for form, out in forms(x, **kwargs):
            try:
                assert_reduced(out, expected, op)
            except AssertionError as exc:
                raise AssertionError(f"{form} {np.dtype(dtype)} {kwargs}: {exc}") from None


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_integer_average_truncates_toward_zero(algorithm):
    n, r = hvd.size(), hvd.rank()
    # The sums are -(n + 1) and n + 1: their averages lie strictly between two integers.
    values = np.array([-(n + 1), n + 1] if r == 0 else [0, 0], dtype=np.int64)
    expected = [int(np.trunc(-(n + 1) / n)), int(np.trunc((n + 1) / n))]
    for dtype in (np.int8, np.int32, np.int64):
        out = hvd.allreduce(values.astype(dtype), op=hvd.Average, algorithm=algorithm)
        assert out.dtype == dtype
        assert out.tolist() == expected, f"{np.dtype(dtype)}: {out.tolist()} != {expected}"


def test_default_op_is_average():
    n = hvd.size()
    out = hvd.allreduce(np.full(3, float(hvd.rank())))
    np.testing.assert_allclose(out, np.full(3, (n - 1) / 2))


def test_deprecated_average_argument():
    n, r = hvd.size(), hvd.rank()
    x = np.full(4, float(r + 1))
    with pytest.warns(DeprecationWarning, match="average= is deprecated"):
        out = hvd.allreduce(x, average=True)
    np.testing.assert_allclose(out, np.full(4, (n + 1) / 2))
    with pytest.warns(DeprecationWarning, match="op=Average or op=Sum"):
        out = hvd.allreduce(x, average=False)
    np.testing.assert_array_equal(out, np.full(4, n * (n + 1) / 2))
    with pytest.warns(DeprecationWarning):
        hvd.allreduce_(x, average=False)
    np.testing.assert_array_equal(x, np.full(4, n * (n + 1) / 2))
    with pytest.raises(ValueError, match="not both"):
        hvd.allreduce(x, op=hvd.Sum, average=True)
    still_in_step()


class Spy:
    """Wrap an all-reduce algorithm and count its calls."""

    def __init__(self, function):
        self.function, self.calls = function, 0

    def __call__(self, *args, **kwargs):
        self.calls += 1
        return self.function(*args, **kwargs)


class ShortPathSpy:
    """Count the all-reduces that took the short path to MPI_Allreduce (small_allreduce.py)."""

    def __init__(self, spy: Spy, inline: Spy, function):
        self.spy, self.inline, self.function = spy, inline, function

    def __call__(self, *args, **kwargs):
        inline_before = self.inline.calls
        out = self.function(*args, **kwargs)
        self.spy.calls += out is not None and self.inline.calls == inline_before
        return out


def spy_on_algorithms(monkeypatch) -> dict:
    """Count each algorithm's runs; "mpi" counts the short path's MPI_Allreduce calls too, and
    "inline" the all-reduces that travelled inside the metadata check."""
    spies = {name: Spy(function) for name, function in algorithms.ALLREDUCE.items()}
    for name, spy in spies.items():
        monkeypatch.setitem(algorithms.ALLREDUCE, name, spy)
    spies["inline"] = Spy(small_allreduce.inline_allreduce)
    monkeypatch.setattr(small_allreduce, "inline_allreduce", spies["inline"])
    short = ShortPathSpy(spies["mpi"], spies["inline"], small_allreduce.short_allreduce)
    monkeypatch.setattr(small_allreduce, "short_allreduce", short)
    return spies


def test_requested_algorithm_runs(monkeypatch):
    spies = spy_on_algorithms(monkeypatch)
    x = np.arange(10, dtype=np.float32)
    for name in ("ring", "naive", "mpi"):
        hvd.allreduce(x, op=hvd.Sum, algorithm=name)
        assert spies[name].calls == 1, {k: s.calls for k, s in spies.items()}
        spies[name].calls = 0
    # The MPI library cannot reduce bfloat16 on its own, but a user-defined op can on the host.
    hvd.allreduce(x.astype(ml_dtypes.bfloat16), op=hvd.Sum, algorithm="mpi")
    assert spies["mpi"].calls == 1
    spies["mpi"].calls = 0
    hvd.allreduce(x, op=hvd.Sum)  # auto: a tiny message travels inside the metadata check
    assert (spies["inline"].calls, spies["mpi"].calls) == (1, 0)
    small = np.zeros(inline_bytes(hvd.size()) // 4 + 1, dtype=np.float32)
    hvd.allreduce(small, op=hvd.Sum)  # auto: small messages go to the MPI library
    assert (spies["inline"].calls, spies["mpi"].calls) == (1, 1)
    spies["mpi"].calls = 0
    big = np.zeros(algorithms.SMALL_MESSAGE_BYTES // 4 + 1, dtype=np.float32)
    hvd.allreduce(big, op=hvd.Sum, algorithm="auto")  # auto: large messages go round the ring
    assert spies["ring"].calls == 1


def reinit() -> None:
    """Shut down and initialize again: init() reads the environment."""
    hvd.shutdown()
    hvd.init()


def test_algorithm_from_environment(monkeypatch):
    spies = spy_on_algorithms(monkeypatch)
    n = hvd.size()
    x = np.ones(6, dtype=np.int64)
    monkeypatch.setenv("HOROVODLITE_ALLREDUCE_ALGORITHM", "naive")
    np.testing.assert_array_equal(hvd.allreduce(x, op=hvd.Sum), np.full(6, n))
    assert spies["naive"].calls == 0  # read by init(), not per call
    reinit()
    np.testing.assert_array_equal(hvd.allreduce(x, op=hvd.Sum), np.full(6, n))
    assert spies["naive"].calls == 1
    # An explicit argument wins over the environment.
    np.testing.assert_array_equal(hvd.allreduce(x, op=hvd.Sum, algorithm="ring"), np.full(6, n))
    assert (spies["naive"].calls, spies["ring"].calls) == (1, 1)
    monkeypatch.setenv("HOROVODLITE_ALLREDUCE_ALGORITHM", "auto")
    reinit()
    hvd.allreduce(x, op=hvd.Sum)
    assert (spies["naive"].calls, spies["ring"].calls) == (1, 1)  # small: MPI_Allreduce
    monkeypatch.setenv("HOROVODLITE_ALLREDUCE_ALGORITHM", "butterfly")
    hvd.shutdown()
    with pytest.raises(ValueError, match="HOROVODLITE_ALLREDUCE_ALGORITHM='butterfly': unknown"):
        hvd.init()
    assert not hvd.is_initialized()
    monkeypatch.delenv("HOROVODLITE_ALLREDUCE_ALGORITHM")
    hvd.init()
    still_in_step()


def test_unchecked_allreduce(monkeypatch):
    """HOROVODLITE_CHECK_METADATA=0: no agreement round, the same results."""
    monkeypatch.setenv("HOROVODLITE_CHECK_METADATA", "0")
    reinit()
    try:
        assert not hvd.state.current().settings.check_metadata
        n, r = hvd.size(), hvd.rank()
        for count in (0, 1, 5, 1000):
            x = np.full(count, r + 1, dtype=np.float64)
            expected = np.full(count, n * (n + 1) / 2)
            np.testing.assert_array_equal(hvd.allreduce(x, op=hvd.Sum), expected)
            big = np.full(algorithms.SMALL_MESSAGE_BYTES // 8 + 3, r, dtype=np.float64)
            np.testing.assert_allclose(hvd.allreduce(big), np.full(big.size, (n - 1) / 2))
    finally:
        monkeypatch.delenv("HOROVODLITE_CHECK_METADATA")
        reinit()
    assert hvd.state.current().settings.check_metadata
    still_in_step()


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_grouped_allreduce(algorithm):
    r = hvd.rank()
    arrays = [rank_values(shape, np.float32, r, seed=7 + i) for i, shape in
              enumerate([(3,), (0,), (2, 5), (), (hvd.size() + 2, 1)])]  # fmt: skip
    expected = [reduce_expected(everyone(a), hvd.Sum) for a in arrays]
    outs = hvd.grouped_allreduce(arrays, op=hvd.Sum, name="group", algorithm=algorithm)
    assert len(outs) == len(arrays)
    for out, want in zip(outs, expected):
        assert_reduced(out, want)
    copies = [a.copy() for a in arrays]
    outs = hvd.grouped_allreduce(copies, op=hvd.Sum, algorithm=algorithm, inplace=True)
    for copy, out, want in zip(copies, outs, expected):
        assert out is copy
        assert_reduced(copy, want)
    assert hvd.grouped_allreduce([]) == []
    # Mixed dtypes, as the async form takes them: one fused buffer per dtype, results in order.
    n = hvd.size()
    mixed = [np.full(2, r, np.float32), np.full(3, r, np.int64), np.full(1, 2 * r, np.float32)]
    outs = hvd.grouped_allreduce(mixed, op=hvd.Sum, algorithm=algorithm)
    total = n * (n - 1) // 2
    for out, want in zip(outs, [np.full(2, total, np.float32), np.full(3, total, np.int64),
                                np.full(1, 2 * total, np.float32)]):  # fmt: skip
        assert out.dtype == want.dtype
        np.testing.assert_array_equal(out, want)
    still_in_step()


def test_accepts_buffer_protocol_objects():
    n = hvd.size()
    out = hvd.allreduce([1.0, 2.0], op=hvd.Sum)  # anything numpy can view
    np.testing.assert_array_equal(out, [n, 2.0 * n])
    out = hvd.allreduce(memoryview(np.arange(3, dtype=np.int16)), op=hvd.Sum)
    assert out.dtype == np.int16
    np.testing.assert_array_equal(out, np.arange(3) * n)
    readonly = np.ones(2)
    readonly.flags.writeable = False  # fine out of place, refused in place
    np.testing.assert_array_equal(hvd.allreduce(readonly, op=hvd.Sum), [n, n])
    with pytest.raises(ValueError, match="read-only"):
        hvd.allreduce_(readonly, op=hvd.Sum)
    still_in_step()


def test_mismatched_shape_fails_on_every_rank():
    n = hvd.size()
    if n == 1:
        pytest.skip("a mismatch needs two ranks")
    odd = n - 1
    shape = (4,) if hvd.rank() == odd else (3,)
    expect_error_everywhere(
        lambda: hvd.allreduce(np.ones(shape), name="w"), set(), None,
        f"rank {odd} sent", "shape", "(4,)", "(3,)", "allreduce 'w'",
    )  # fmt: skip
    still_in_step()


# Small all-reduces travel inside the metadata check (small_allreduce.inline_allreduce). Whether
# one does depends only on what the ranks agree on, never on how each rank holds its array.


def test_inline_allreduce_whatever_form_each_rank_passes(monkeypatch):
    spies = spy_on_algorithms(monkeypatch)
    n, r = hvd.size(), hvd.rank()
    base = np.arange(24, dtype=np.int32).reshape(4, 6) * (r + 1)
    expected = np.arange(24, dtype=np.int32).reshape(4, 6)[:, ::2] * (n * (n + 1) // 2)
    # Rank by rank: a contiguous array, a strided view, a memoryview, in place into a view.
    form = r % 4
    if form == 0:
        out = hvd.allreduce(np.ascontiguousarray(base[:, ::2]), op=hvd.Sum, name="forms")
    elif form == 1:
        out = hvd.allreduce(base[:, ::2], op=hvd.Sum, name="forms")
    elif form == 2:
        view = memoryview(np.ascontiguousarray(base[:, ::2]))
        out = hvd.allreduce(view, op=hvd.Sum, name="forms")
    else:
        out = hvd.allreduce_(base[:, ::2], op=hvd.Sum, name="forms")
        assert np.shares_memory(out, base)
    np.testing.assert_array_equal(out, expected)
    assert spies["inline"].calls == 1 and spies["mpi"].calls == 0
    still_in_step()


def test_inline_allreduce_is_bitwise_identical_and_wraps_like_mpi():
    n, r = hvd.size(), hvd.rank()
    # float32 sums that round differently in another order: every rank must get the same bits.
    x = np.random.default_rng(r).standard_normal(7).astype(np.float32) * 10.0 ** (r % 3)
    out = hvd.allreduce(x, op=hvd.Sum)
    outs = everyone(out)
    assert all(o.tobytes() == outs[0].tobytes() for o in outs)
    # Small integers wrap around as MPI's would, instead of widening.
    wrapped = hvd.allreduce(np.full(3, 100, dtype=np.int8), op=hvd.Sum)
    assert wrapped.dtype == np.int8
    np.testing.assert_array_equal(wrapped, np.full(3, 100 * n, dtype=np.int64).astype(np.int8))
    for x in (np.float64(r), np.zeros((0, 3), np.float32)):  # 0-d and empty arrays
        out = hvd.allreduce(x)
        assert out.shape == np.shape(x) and out.dtype == x.dtype
        np.testing.assert_allclose(out, np.full(np.shape(x), (n - 1) / 2))


def test_mismatch_across_the_inline_limit_fails_on_every_rank():
    """One rank's array fits in the check, another's does not: both must still raise."""
    n = hvd.size()
    if n == 1:
        pytest.skip("a mismatch needs two ranks")
    fits = inline_bytes(n) // 8
    count = fits + 1 if hvd.rank() == n - 1 else fits
    expect_error_everywhere(
        lambda: hvd.allreduce(np.ones(count), name="edge"), set(), None,
        f"rank {n - 1} sent", f"({fits + 1},)", f"({fits},)", "allreduce 'edge'",
    )  # fmt: skip
    # An argument error on one rank, a valid inline all-reduce on the others.
    bad = n - 1
    x = np.ones(3)
    if hvd.rank() == bad:
        x.flags.writeable = False
    expect_error_everywhere(
        lambda: hvd.allreduce_(x, name="ro"), {bad}, ValueError,
        f"rank {bad} failed before sending", "read-only",
    )  # fmt: skip
    still_in_step()


def test_hierarchical_on_one_host_is_the_ring():
    # One host (or one rank per host): nothing to split, so the flat ring runs, bit for bit.
    rng = np.random.default_rng([7, hvd.rank()])
    x = rng.standard_normal(1001).astype(np.float32)
    ring = hvd.allreduce(x, op=hvd.Sum, algorithm="ring", name="flat")
    hierarchical = hvd.allreduce(x, op=hvd.Sum, algorithm="hierarchical", name="hier")
    assert ring.tobytes() == hierarchical.tobytes()
