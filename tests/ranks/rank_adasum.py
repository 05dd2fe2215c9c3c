"""Adasum on every rank: the numpy formula as oracle, its motivating property, and its errors.

At 1, 2 and 4 ranks the results must equal a numpy reference of Horovod's tree of pairwise
combinations, be bitwise equal on every rank, add orthogonal vectors and average parallel ones.
At 3 ranks (not a power of two) every call must raise on every rank.
"""

import ml_dtypes
import numpy as np
import pytest
from oracle import WORLD, adasum_expected, everyone, still_in_step

import horovodlite as hvd
from horovodlite.algorithms import adasum_allreduce

FLOATS = [np.float16, ml_dtypes.bfloat16, np.float32, np.float64]
# The reference combines in float64; the ranks round each level's result to the dtype.
RTOL = {np.float16: 1e-2, ml_dtypes.bfloat16: 6e-2, np.float32: 1e-5, np.float64: 1e-12}

power_of_two = pytest.mark.skipif(
    WORLD.size & (WORLD.size - 1) != 0, reason="Adasum needs a power-of-two number of ranks"
)
not_power_of_two = pytest.mark.skipif(
    WORLD.size & (WORLD.size - 1) == 0, reason="checks the error of a non-power-of-two size"
)


def assert_adasum(out, inputs, dtype, name=""):
    expected = adasum_expected(inputs)
    assert out.dtype == np.dtype(dtype) and out.shape == expected.shape, name
    scale = max(1.0, float(np.abs(expected).max(initial=0.0)))
    np.testing.assert_allclose(
        out.astype(np.float64), expected, rtol=RTOL[dtype], atol=RTOL[dtype] * scale, err_msg=name
    )
    gathered = everyone(out.view(np.uint8) if out.size else out)
    assert all(np.array_equal(g, gathered[0]) for g in gathered), f"{name}: ranks differ"


def values(shape, dtype, seed=0):
    rng = np.random.default_rng([seed, hvd.rank()])
    return rng.standard_normal(shape).astype(dtype)


def test_numpy_reference_itself():
    a, b = np.array([1.0, 0.0]), np.array([0.0, 2.0])
    np.testing.assert_allclose(adasum_expected([a, b]), a + b)  # orthogonal: the sum
    np.testing.assert_allclose(adasum_expected([a, 3 * a]), 2 * a)  # parallel: the average
    np.testing.assert_allclose(adasum_expected([a, np.zeros(2)]), a)  # a zero vector adds nothing


@power_of_two
@pytest.mark.parametrize("dtype", FLOATS, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("shape", [(0,), (1,), (3,), (5, 7), (1000,), (2, 3, 4)])
def test_matches_numpy_reference(dtype, shape):
    x = values(shape, dtype, seed=sum(shape))
    inputs = everyone(x)
    out = hvd.allreduce(x, op=hvd.Adasum, name=f"adasum.{shape}")
    assert_adasum(out, inputs, dtype, f"allreduce {shape}")
    np.testing.assert_array_equal(x, inputs[hvd.rank()])  # the input is left alone
    inplace = x.copy()
    assert hvd.allreduce_(inplace, op="adasum", name=f"adasum_.{shape}") is inplace
    np.testing.assert_array_equal(inplace.view(np.uint8), out.view(np.uint8))


@power_of_two
def test_orthogonal_vectors_add_and_parallel_ones_average():
    n, r = hvd.size(), hvd.rank()
    orthogonal = np.zeros(2 * n)
    orthogonal[2 * r] = r + 1.0
    out = hvd.allreduce(orthogonal, op=hvd.Adasum)
    np.testing.assert_allclose(out, hvd.allreduce(orthogonal, op=hvd.Sum), rtol=1e-15)
    direction = np.linspace(-1.0, 1.0, 11)
    parallel = direction * (r + 1.0)  # same direction, different lengths
    out = hvd.allreduce(parallel, op=hvd.Adasum)
    np.testing.assert_allclose(out, direction * (n + 1) / 2, rtol=1e-12)
    # Identical vectors stay as they are, at any scale; Sum would multiply them by n.
    same = np.full(5, 3.0)
    np.testing.assert_allclose(hvd.allreduce(same, op=hvd.Adasum), same, rtol=1e-15)


@power_of_two
def test_zero_vectors():
    r = hvd.rank()
    zeros = np.zeros(7, np.float32)
    np.testing.assert_array_equal(hvd.allreduce(zeros, op=hvd.Adasum), zeros)
    x = values(7, np.float32) if r == 0 else zeros  # only rank 0 has a gradient
    out = hvd.allreduce(x, op=hvd.Adasum)
    np.testing.assert_array_equal(out, everyone(x)[0])


@power_of_two
def test_scaling():
    x = values(9, np.float64, seed=3)
    out = hvd.allreduce(x, op=hvd.Adasum, prescale_factor=0.5, postscale_factor=3.0)
    expected = 3.0 * adasum_expected([0.5 * v for v in everyone(x)])
    np.testing.assert_allclose(out, expected, rtol=1e-12)


@power_of_two
def test_grouped_allreduce_combines_each_tensor_alone():
    n, r = hvd.size(), hvd.rank()
    orthogonal = np.zeros(n)
    orthogonal[r] = 1.0
    parallel = np.ones(3) * (r + 1)
    mixed = [values((4, 5), np.float32, seed=7), values(0, np.float32), values(6, np.float32)]
    results = hvd.grouped_allreduce([orthogonal, parallel, *mixed], op=hvd.Adasum, name="g")
    # Fused, a pair of tensors is still combined by its own angle: the sum and the average.
    np.testing.assert_allclose(results[0], np.ones(n), rtol=1e-15)
    np.testing.assert_allclose(results[1], np.ones(3) * (n + 1) / 2, rtol=1e-12)
    for i, (x, out) in enumerate(zip(mixed, results[2:])):
        assert_adasum(out, everyone(x), np.float32, f"grouped {i}")


@power_of_two
def test_asynchronous_and_fused_by_the_engine():
    tensors = [values(s, np.float32, seed=s) for s in (1, 17, 300, 4096)]
    tensors.append(values(33, np.float16, seed=5))
    handles = [
        hvd.allreduce_async(t, op=hvd.Adasum, name=f"async.{i}") for i, t in enumerate(tensors)
    ]
    in_place = tensors[1].copy()
    handles.append(hvd.allreduce_async_(in_place, op=hvd.Adasum, name="async.inplace"))
    results = [hvd.synchronize(h) for h in handles]
    assert results[-1] is in_place
    for i, (t, out) in enumerate(zip([*tensors, tensors[1]], results)):
        assert_adasum(out, everyone(t), t.dtype.type, f"async {i}")
    grouped = hvd.grouped_allreduce_async(tensors[:3], op=hvd.Adasum, name="async.group")
    for i, (t, out) in enumerate(zip(tensors, hvd.synchronize(grouped))):
        assert_adasum(out, everyone(t), np.float32, f"async grouped {i}")


@power_of_two
def test_algorithm_argument_does_not_change_adasum():
    x = values(50, np.float64, seed=11)
    outs = [hvd.allreduce(x, op=hvd.Adasum, algorithm=a) for a in ("ring", "naive", "mpi", None)]
    assert all(np.array_equal(o, outs[0]) for o in outs)


def test_on_a_power_of_two_process_set():
    # At 3 ranks too: ranks 0 and 1 form a set of two.
    if WORLD.size < 2:
        pytest.skip("needs two ranks")
    pair_set = hvd.add_process_set([0, 1])
    x = values(10, np.float64, seed=2)
    inputs = everyone(x)[:2]
    try:
        if hvd.rank() in (0, 1):
            out = hvd.allreduce(x, op=hvd.Adasum, process_set=pair_set)
            np.testing.assert_allclose(out, adasum_expected(inputs), rtol=1e-12)
    finally:
        hvd.remove_process_set(pair_set)
    still_in_step()


def test_single_rank_is_the_identity():
    from mpi4py import MPI

    x = values(8, np.float32)
    buf = x.copy()
    adasum_allreduce(MPI.COMM_SELF, buf)
    np.testing.assert_array_equal(buf, x)
    if WORLD.size == 1:
        np.testing.assert_array_equal(hvd.allreduce(x, op=hvd.Adasum), x)


@power_of_two
@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.uint8, np.bool_])
def test_integers_are_refused_everywhere(dtype):
    with pytest.raises(TypeError, match=f"got dtype {np.dtype(dtype)}: use float16"):
        hvd.allreduce(np.ones(4, dtype), op=hvd.Adasum)
    still_in_step()


@not_power_of_two
def test_not_a_power_of_two_is_refused_everywhere():
    n = WORLD.size
    for call in (
        lambda: hvd.allreduce(np.ones(4), op=hvd.Adasum),
        lambda: hvd.allreduce_(np.ones(4), op=hvd.Adasum),
        lambda: hvd.grouped_allreduce([np.ones(4), np.ones(2)], op=hvd.Adasum),
        lambda: hvd.synchronize(hvd.allreduce_async(np.ones(4), op=hvd.Adasum, name="npt")),
    ):
        with pytest.raises(ValueError, match=f"power-of-two number of ranks .* has {n}"):
            call()
    still_in_step()


def test_reducescatter_refuses_adasum():
    with pytest.raises(NotImplementedError, match="reducescatter does not support op=Adasum"):
        hvd.reducescatter(np.ones(4), op=hvd.Adasum)
    still_in_step()
