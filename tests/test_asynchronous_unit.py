"""The asynchronous collectives are plain functions that show their real arguments.

Each `*_async` takes its blocking twin's plan function's arguments (less `inplace` for the
in-place forms; a list `tensors` for the grouped ones), so a reader, `help()` and a static tool
can follow it; one rank runs each and checks the result and the grouped members' names.
"""

import inspect

import numpy as np
import pytest

import horovodlite as hvd
from horovodlite import asynchronous, collectives
from horovodlite.handles import Handle, Request

# (async function, the plan it submits, whether it is in place, whether it is grouped)
FORMS = [
    ("allreduce_async", "allreduce_plan", False, False),
    ("allreduce_async_", "allreduce_plan", True, False),
    ("grouped_allreduce_async", "allreduce_plan", False, True),
    ("grouped_allreduce_async_", "allreduce_plan", True, True),
    ("allgather_async", "allgather_plan", False, False),
    ("grouped_allgather_async", "allgather_plan", False, True),
    ("broadcast_async", "broadcast_plan", False, False),
    ("broadcast_async_", "broadcast_plan", True, False),
    ("reducescatter_async", "reducescatter_plan", False, False),
    ("grouped_reducescatter_async", "reducescatter_plan", False, True),
    ("alltoall_async", "alltoall_plan", False, False),
]


def test_every_async_name_is_covered():
    names = {n for n in asynchronous.__all__ if n.endswith(("_async", "_async_"))}
    assert names == {form[0] for form in FORMS}


@pytest.mark.parametrize("name, plan, inplace, grouped", FORMS)
def test_an_async_function_shows_its_plan_functions_arguments(name, plan, inplace, grouped):
    function = getattr(hvd, name)
    assert function is getattr(asynchronous, name) and function.__name__ == name
    assert inspect.getmodule(function) is asynchronous and not hasattr(function, "__wrapped__")
    shown = inspect.signature(function)
    expected = inspect.signature(getattr(collectives, plan)).parameters.values()
    expected = [p for p in expected if not (inplace and p.name == "inplace")]
    if grouped:
        expected[0] = expected[0].replace(name="tensors")
    assert list(shown.parameters.values()) == expected
    # A collective submitted alone is its own handle (its Request); a grouped one a Handle.
    assert shown.return_annotation is (Handle if grouped else Request)
    assert function.__doc__ and function.__doc__.startswith("Start ")


@pytest.fixture
def one_rank():
    hvd.init()
    yield
    hvd.shutdown()


def test_each_async_form_runs_and_a_group_names_its_members(one_rank):
    x = np.arange(6.0).reshape(3, 2)
    assert np.array_equal(hvd.synchronize(hvd.allreduce_async(x, op=hvd.Sum)), x)
    y = x.copy()
    assert hvd.synchronize(hvd.allreduce_async_(y, name="y")) is y
    group = hvd.grouped_allreduce_async([x, x + 1], name="g")
    with pytest.raises(ValueError, match="'g.1'"):  # the members' names are held until done
        hvd.allreduce_async(x, name="g.1")
    assert [r.tolist() for r in hvd.synchronize(group)] == [x.tolist(), (x + 1).tolist()]
    z = [x.copy()]
    assert hvd.synchronize(hvd.grouped_allreduce_async_(z))[0] is z[0]
    assert np.array_equal(hvd.synchronize(hvd.allgather_async(x)), x)
    assert len(hvd.synchronize(hvd.grouped_allgather_async([x, x], name="ga"))) == 2
    assert np.array_equal(hvd.synchronize(hvd.broadcast_async(x, 0)), x)
    assert hvd.synchronize(hvd.broadcast_async_(y, root_rank=0)) is y
    assert np.array_equal(hvd.synchronize(hvd.reducescatter_async(x)), x)
    assert len(hvd.synchronize(hvd.grouped_reducescatter_async([x, x]))) == 2
    received, splits = hvd.synchronize(hvd.alltoall_async(x, [3]))
    assert np.array_equal(received, x) and splits.tolist() == [3]
    with pytest.raises(TypeError, match="allreduce_async"):
        hvd.allreduce_async(x, root_rank=0)
