"""Single-process unit tests of horovodlite.training, with numpy standing in for a framework."""

import dataclasses
import pickle
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import horovodlite as hvd
from horovodlite.training import (
    Casts,
    Compressor,
    ReductionSettings,
    common,
    compression_namespace,
    partition,
    reduce_gradients,
    reduce_kwargs,
    run_per_dtype,
)
from horovodlite.training.updates import combine_updates, combines_updates

# numpy as a framework: what a binding states about its casts. Module-level, so pickle finds
# the classes under the names compression_namespace is told they have.
Compression = compression_namespace(
    Casts(cast=np.ndarray.astype, is_floating=lambda dtype: dtype.kind == "f"),
    float16=np.dtype(np.float16),
    bfloat16=np.dtype(np.float32),  # numpy has no bfloat16; any other floating dtype will do
    module=__name__,
)
FP16Compressor, BF16Compressor = Compression.fp16, Compression.bf16


# ---------------------------------------------------------------------------------------------
# Compression


def test_cast_compressor_round_trip_keeps_integers():
    x = np.arange(4, dtype=np.float64)
    wire, ctx = Compression.fp16.compress(x)
    assert wire.dtype == np.float16 and ctx == np.float64
    assert Compression.fp16.decompress(wire, ctx).dtype == np.float64
    ints = np.arange(4, dtype=np.int32)
    assert Compression.fp16.compress(ints) == (ints, None)
    half = x.astype(np.float16)
    assert Compression.fp16.compress(half) == (half, None)  # already on the wire dtype


def test_compression_namespace_names_classes_after_the_binding():
    assert Compression.none.compress(1.5) == (1.5, None)
    assert issubclass(Compression.fp16, Compressor) and issubclass(Compression.none, Compressor)
    assert Compression.fp16.__name__ == "FP16Compressor"
    assert Compression.fp16.__module__ == __name__
    assert pickle.loads(pickle.dumps(Compression.fp16)) is Compression.fp16
    assert "float16" in Compression.fp16.__doc__


# ---------------------------------------------------------------------------------------------
# Reduction settings


def test_settings_scale_and_mapping():
    settings = ReductionSettings(gradient_predivide_factor=4.0, extra_postscale=2.0)
    assert settings.op == hvd.Average
    assert settings.reduce_kwargs == {
        "op": hvd.Average,
        "prescale_factor": 0.25,
        "postscale_factor": 8.0,
        "process_set": hvd.global_process_set,
    }
    assert ReductionSettings(op="sum", process_set=None).reduce_kwargs["op"] == hvd.Sum
    assert ReductionSettings(process_set=None).process_set is hvd.global_process_set


def test_settings_grouping():
    assert ReductionSettings().grouping is None
    assert ReductionSettings(num_groups=3).grouping == 3
    assert ReductionSettings(groups=2).grouping == 2
    groups = ReductionSettings(groups=(g for g in [["a", "b"], ["c"]])).groups
    assert groups == (("a", "b"), ("c",))  # a generator is read once, into tuples


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({"op": hvd.Max}, ValueError, "Average, Sum or Adasum, got op=MAX"),
        ({"op": hvd.Adasum, "gradient_predivide_factor": 2.0}, ValueError, "only applies to op"),
        ({"op": "nonsense"}, ValueError, "unknown reduce op"),
        ({"op": hvd.Sum, "gradient_predivide_factor": 2.0}, ValueError, "only applies to op=Av"),
        ({"gradient_predivide_factor": 0.0}, ValueError, "must be > 0"),
        ({"backward_passes_per_step": 0}, ValueError, "backward_passes_per_step must be >= 1"),
        ({"backward_passes_per_step": 2.0}, TypeError, "backward_passes_per_step must be an int"),
        ({"backward_passes_per_step": True}, TypeError, "backward_passes_per_step must be an int"),
        ({"num_groups": 2, "groups": [[1]]}, ValueError, "give num_groups or groups, not both"),
        ({"num_groups": -1}, ValueError, "num_groups must be a non-negative int"),
        ({"groups": -1}, ValueError, "non-negative int"),
        ({"groups": 1.5}, TypeError, "groups must be a group count or a list"),
        ({"compression": object()}, TypeError, "compression must be a Compression strategy"),
        ({"process_set": [0, 1]}, TypeError, "process_set must be a ProcessSet, got list"),
    ],
)
def test_settings_refuse_bad_arguments(kwargs, error, match):
    with pytest.raises(error, match=match):
        ReductionSettings(**kwargs)


def test_adasum_settings_and_the_update_step():
    settings = ReductionSettings(op="adasum")
    assert settings.reduce_kwargs["op"] == hvd.Adasum
    assert settings.prescale_factor == settings.postscale_factor == 1.0
    # A DistributedOptimizer combines updates only with Adasum among two or more ranks.
    assert combines_updates(ReductionSettings(op=hvd.Adasum, process_set=_Set(2)))
    assert not combines_updates(ReductionSettings(op=hvd.Adasum, process_set=_Set(1)))
    assert not combines_updates(ReductionSettings(process_set=_Set(2)))
    with pytest.raises(ValueError, match="power-of-two number of ranks .* has 3"):
        combines_updates(ReductionSettings(op=hvd.Adasum, process_set=_Set(3)))
    params = [np.array([1.0, 2.0]), np.array([5.0])]
    calls = []

    def step():
        calls.append("step")
        params[0] -= 0.5
        return "loss"

    def reduce(updates):
        calls.append([u.tolist() for u in updates])
        return [2 * u for u in updates]  # stands in for the Adasum of the ranks' updates

    def assign(param, start, update):
        param[...] = start + update

    result = combine_updates(
        params, step, copy=np.copy, delta=np.subtract, reduce=reduce, assign=assign
    )
    assert result == "loss"
    assert calls == ["step", [[-0.5, -0.5], [0.0]]]  # every parameter takes part, in order
    np.testing.assert_array_equal(params[0], [0.0, 1.0])
    np.testing.assert_array_equal(params[1], [5.0])


def test_replace_checks_again():
    settings = ReductionSettings(backward_passes_per_step=2)
    assert dataclasses.replace(settings, backward_passes_per_step=3).backward_passes_per_step == 3
    with pytest.raises(ValueError, match="backward_passes_per_step"):
        dataclasses.replace(settings, backward_passes_per_step=0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.op = hvd.Sum


def test_reduce_kwargs_takes_horovods_average():
    assert reduce_kwargs()["op"] == hvd.Average
    with pytest.warns(DeprecationWarning, match="average= is deprecated"):
        assert reduce_kwargs(average=False)["op"] == hvd.Sum
    with pytest.raises(ValueError, match="not both"):
        reduce_kwargs(op=hvd.Sum, average=True)


class _Set(hvd.ProcessSet):
    """A process set of a given size that this rank belongs to, with no init needed."""

    def __init__(self, size: int):
        super().__init__(list(range(size)))
        self._size = size

    def size(self) -> int:
        return self._size

    def included(self) -> bool:
        return True


def test_reduce_gradients_alone_only_scales():
    settings = ReductionSettings(extra_postscale=3.0, process_set=_Set(1))

    def reduce(tensors):
        raise AssertionError("alone in the set, nothing is sent")

    out = reduce_gradients([np.ones(2), None], settings, reduce=reduce, scale=np.multiply)
    assert out[1] is None and out[0].tolist() == [3.0, 3.0]
    plain = ReductionSettings(process_set=_Set(1))
    grad = np.ones(2)
    assert reduce_gradients([grad], plain, reduce=reduce, scale=np.multiply)[0] is grad


def test_reduce_gradients_sends_what_is_present_in_order():
    settings = ReductionSettings(process_set=_Set(2))
    sent = []

    def reduce(tensors):
        sent.append(list(tensors))
        return [t * 10 for t in tensors]

    grads = [None, np.ones(1), None, np.full(1, 2.0)]
    out = reduce_gradients(grads, settings, reduce=reduce, scale=np.multiply)
    assert len(sent) == 1 and len(sent[0]) == 2
    assert out[0] is None and out[2] is None
    assert out[1].tolist() == [10.0] and out[3].tolist() == [20.0]


# ---------------------------------------------------------------------------------------------
# Grouping


def test_run_per_dtype_starts_every_group_before_waiting():
    items = [np.ones(1, np.float32), np.ones(1, np.int64), np.full(1, 2, np.float32)]
    events = []

    def start(group, suffix):
        events.append(("start", suffix, len(group)))
        return [g + 1 for g in group]

    def wait(handle):
        events.append(("wait",))
        return handle

    out = run_per_dtype(items, start, wait)
    assert [e[0] for e in events] == ["start", "start", "wait", "wait"]
    assert {e[1] for e in events if e[0] == "start"} == {"float32", "int64"}
    assert [o.tolist() for o in out] == [[2.0], [2], [3.0]]
    assert [o.dtype for o in out] == [np.float32, np.int64, np.float32]


def test_run_per_dtype_one_dtype_has_no_suffix():
    suffixes = []
    run_per_dtype([np.ones(1), np.ones(2)], lambda g, s: suffixes.append(s) or g, lambda h: h)
    assert suffixes == [None]


def test_partition():
    items = ["a", "b", "c", "d", "e"]
    assert partition(items, None) == [("a",), ("b",), ("c",), ("d",), ("e",)]
    assert partition(items, 2) == [("a", "c", "e"), ("b", "d")]
    assert partition(items, 0) == [tuple(items)]
    assert partition(items, 9) == [(i,) for i in items]
    assert partition(items, (("d", "a"),)) == [("d", "a"), ("b",), ("c",), ("e",)]


# ---------------------------------------------------------------------------------------------
# The names every binding shares, and the process set lookup the TF binding uses


def test_common_names_are_the_cores():
    assert len(common.__all__) == len(set(common.__all__))
    for name in common.__all__:
        assert getattr(common, name) is getattr(hvd, name), name


PROCESS_SET_RANKS_SCRIPT = textwrap.dedent(
    """
    import horovodlite as hvd
    from horovodlite.process_sets import process_set_ranks
    hvd.init()
    assert process_set_ranks(0) == [0]
    try:
        process_set_ranks(7)
    except ValueError as exc:
        assert "7" in str(exc), exc
    else:
        raise AssertionError("an unregistered id must raise")
    hvd.shutdown()
    print("OK")
    """
)


def test_process_set_ranks():
    result = subprocess.run(
        [sys.executable, "-c", PROCESS_SET_RANKS_SCRIPT],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0 and "OK" in result.stdout, result.stdout + result.stderr
