"""A hypothesis property: allreduce equals numpy's reduction, for random arguments.

Rank 0 runs hypothesis and broadcasts each example's parameters; the other ranks serve those
examples until rank 0 sends None. So every rank runs the same example, whatever hypothesis
decides (shrinking included), and rank 0 checks every rank's result.
"""

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import array_shapes
from oracle import ALGORITHMS, DTYPES, OPS, WORLD, assert_reduced, rank_values, reduce_expected

import horovodlite as hvd

DTYPES_BY_NAME = {str(d): d for d in DTYPES}
FORMS = ["allreduce", "allreduce_", "allreduce_ on a strided view"]


@st.composite
def examples(draw) -> dict:
    dtype = draw(st.sampled_from([str(d) for d in DTYPES]))
    ops = [op for op in OPS if not (dtype == "bool" and op == hvd.Average)]
    scaled = dtype != "bool"
    return {
        "shape": draw(array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=7)),
        "dtype": dtype,
        "op": draw(st.sampled_from(ops)).name,
        "algorithm": draw(st.sampled_from(ALGORITHMS)),
        "form": draw(st.sampled_from(FORMS)),
        # Powers of two keep float sums and products exact; integers truncate toward zero.
        "prescale": draw(st.sampled_from([1.0, 0.5])) if scaled else 1.0,
        "postscale": draw(st.sampled_from([1.0, 0.5, 2.0])) if scaled else 1.0,
        "seed": draw(st.integers(0, 2**16)),
    }


def run_example(params: dict):
    """Run one example on this rank; return (input, result or the error's text)."""
    dtype = DTYPES_BY_NAME[params["dtype"]]
    x = rank_values(params["shape"], dtype, hvd.rank(), params["seed"])
    kwargs = dict(
        op=hvd.ReduceOp[params["op"]],
        algorithm=params["algorithm"],
        prescale_factor=params["prescale"],
        postscale_factor=params["postscale"],
        name="property",
    )
    try:
        if params["form"] == "allreduce":
            return x, hvd.allreduce(x, **kwargs)
        if params["form"] == "allreduce_":
            target = x.copy()
            hvd.allreduce_(target, **kwargs)
            return x, target
        base = np.zeros((*x.shape, 2), dtype)
        view = base[..., 1]
        view[...] = x
        hvd.allreduce_(view, **kwargs)
        assert not base[..., 0].any(), "allreduce_ wrote outside the view"
        return x, view.copy()
    except Exception as exc:  # reported to rank 0, which fails the example
        return x, f"{type(exc).__name__}: {exc}"


@settings(
    max_examples=30,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=list(HealthCheck),
)
@given(params=examples())
def check_example_on_every_rank(params):
    hvd.broadcast_object(params, root_rank=0, name="property.params")
    reports = WORLD.gather(run_example(params), root=0)
    inputs = [x for x, _ in reports]
    op = hvd.ReduceOp[params["op"]]
    expected = reduce_expected(inputs, op, params["prescale"], params["postscale"])
    for k, (_, out) in enumerate(reports):
        assert not isinstance(out, str), f"rank {k} raised {out}"
        try:
            assert_reduced(out, expected, op)
        except AssertionError as exc:
            raise AssertionError(f"rank {k}: {exc}") from None
    assert len({out.tobytes() for _, out in reports}) == 1, "ranks got different bits"


def test_allreduce_matches_numpy_for_random_arguments():
    if hvd.rank() == 0:
        try:
            check_example_on_every_rank()
        finally:
            hvd.broadcast_object(None, root_rank=0, name="property.params")
        return
    while True:
        params = hvd.broadcast_object(None, root_rank=0, name="property.params")
        if params is None:
            break
        WORLD.gather(run_example(params), root=0)
