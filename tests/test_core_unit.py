"""Single-process unit tests of the core: imports, reduce ops, chunking, messages, init guard."""

import os
import subprocess
import sys
import textwrap
import warnings
from contextlib import nullcontext

import numpy as np
import pytest

import horovodlite as hvd
from horovodlite import agreement, algorithms, config
from horovodlite.algorithms.scratch import chunk_bounds
from horovodlite.ops import ReduceOp, resolve_op

# ---------------------------------------------------------------------------------------------
# The core never imports a framework.

BLOCKED_IMPORT_SCRIPT = textwrap.dedent(
    """
    import importlib, pkgutil, sys
    # None in sys.modules makes `import torch` raise ImportError, wherever it happens.
    for name in ("torch", "tensorflow", "keras", "jax"):
        sys.modules[name] = None
    import numpy as np
    import horovodlite as hvd
    failed = []
    for module in pkgutil.walk_packages(hvd.__path__, "horovodlite."):
        if module.name.endswith("__main__"):  # a CLI entry point runs when imported
            continue
        try:
            importlib.import_module(module.name)
        except ImportError as exc:
            failed.append(f"{module.name}: {exc}")
    # Running collectives must not import one either.
    hvd.init()
    assert hvd.allreduce(np.ones(3), op=hvd.Sum).tolist() == [1.0, 1.0, 1.0]
    handle = hvd.allreduce_async(np.ones(2), name="a", op=hvd.Sum)
    assert hvd.synchronize(handle).tolist() == [1.0, 1.0]
    hvd.shutdown()
    loaded = sorted(
        name for name, module in sys.modules.items()
        if module is not None and name.split(".")[0] in ("torch", "tensorflow", "keras", "jax")
    )
    print("FAILED", failed)
    print("LOADED", loaded)
    """
)


def test_core_imports_without_torch_or_tensorflow():
    result = subprocess.run(
        [sys.executable, "-c", BLOCKED_IMPORT_SCRIPT], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "FAILED []" in result.stdout, result.stdout
    assert "LOADED []" in result.stdout, result.stdout


# ---------------------------------------------------------------------------------------------
# Reduce ops and the deprecated average= argument.


def test_resolve_op_defaults_and_spellings():
    assert resolve_op(None, None) is ReduceOp.AVERAGE
    assert resolve_op(None, None, default=ReduceOp.SUM) is ReduceOp.SUM
    for op in ReduceOp:
        assert resolve_op(op, None) is op
        assert resolve_op(int(op), None) is op
        assert resolve_op(op.name.lower(), None) is op
    assert (hvd.Average, hvd.Sum, hvd.Adasum, hvd.Min, hvd.Max, hvd.Product) == tuple(
        ReduceOp[name] for name in ("AVERAGE", "SUM", "ADASUM", "MIN", "MAX", "PRODUCT")
    )


def test_average_argument_is_deprecated():
    with pytest.warns(DeprecationWarning, match="average= is deprecated: use op=Average"):
        assert resolve_op(None, True) is ReduceOp.AVERAGE
    with pytest.warns(DeprecationWarning):
        assert resolve_op(None, False) is ReduceOp.SUM
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # op= alone warns about nothing
        resolve_op(ReduceOp.SUM, None)


def test_op_and_average_together_are_refused():
    with pytest.raises(ValueError, match="either op= or the deprecated average=, not both"):
        resolve_op(ReduceOp.SUM, True)
    with pytest.raises(ValueError, match="not both"):
        resolve_op(ReduceOp.AVERAGE, False)


@pytest.mark.parametrize("op", ["median", 17, 2.5])
def test_unknown_ops_are_refused(op):
    with pytest.raises(ValueError, match="unknown reduce op .* use one of Average, Sum"):
        resolve_op(op, None)


# ---------------------------------------------------------------------------------------------
# Chunk layouts and the choice of algorithm.


@pytest.mark.parametrize("count", [0, 1, 2, 3, 7, 8, 1000, 1001])
@pytest.mark.parametrize("parts", [1, 2, 3, 4, 7])
def test_chunk_bounds(count, parts):
    bounds = chunk_bounds(count, parts)
    assert len(bounds) == parts
    assert bounds[0][0] == 0 and bounds[-1][1] == count
    assert all(bounds[i][1] == bounds[i + 1][0] for i in range(parts - 1))  # contiguous
    sizes = [hi - lo for lo, hi in bounds]
    base, extra = divmod(count, parts)
    # Horovod's split: the first count % parts chunks hold one more element.
    assert sizes == [base + 1] * extra + [base] * (parts - extra)


def test_chunk_bounds_examples():
    assert chunk_bounds(10, 4) == ((0, 3), (3, 6), (6, 8), (8, 10))
    assert chunk_bounds(2, 3) == ((0, 1), (1, 2), (2, 2))


def test_algorithm_choice(monkeypatch):
    monkeypatch.delenv("HOROVODLITE_ALLREDUCE_ALGORITHM", raising=False)
    f32, bf16 = np.dtype(np.float32), np.dtype("bfloat16")
    small, large = algorithms.SMALL_MESSAGE_BYTES, algorithms.SMALL_MESSAGE_BYTES + 1
    table = algorithms.ALLREDUCE
    assert algorithms.requested_algorithm(None) is None
    assert algorithms.requested_algorithm("auto") is None
    assert algorithms.requested_algorithm("naive") == "naive"
    assert algorithms.choose(None, table, small, f32, np) == "mpi"
    assert algorithms.choose(None, table, large, f32, np) == "ring"
    assert algorithms.choose("naive", table, large, f32, np) == "naive"
    assert algorithms.choose("mpi", table, small, bf16, np) == "mpi"  # a user-defined MPI op
    assert algorithms.requested_algorithm(None, default="ring") == "ring"
    assert algorithms.requested_algorithm("mpi", default="ring") == "mpi"
    from_environment = lambda: config.Settings.from_environment().allreduce_algorithm  # noqa: E731
    assert from_environment() is None
    monkeypatch.setenv("HOROVODLITE_ALLREDUCE_ALGORITHM", "ring")
    assert from_environment() == "ring"
    monkeypatch.setenv("HOROVODLITE_ALLREDUCE_ALGORITHM", "auto")
    assert from_environment() is None
    monkeypatch.setenv("HOROVODLITE_ALLREDUCE_ALGORITHM", "tree")
    with pytest.raises(ValueError, match="HOROVODLITE_ALLREDUCE_ALGORITHM='tree': unknown algo"):
        from_environment()
    with pytest.raises(ValueError, match="unknown algorithm 'tree': use one of ring, naive, mpi"):
        algorithms.requested_algorithm("tree")
    with pytest.raises(ValueError, match="not available here: use one of ring, mpi"):
        algorithms.choose("naive", algorithms.REDUCESCATTER, 8, f32, np)


# ---------------------------------------------------------------------------------------------
# The mismatch message.


def allreduce_fields(**changes) -> dict:
    fields = {"collective": "allreduce", "name": "w", "dtype": "float32", "shape": (3,)}
    return {**fields, **changes}


def test_mismatch_message_names_ranks_and_values():
    infos = [
        (0, allreduce_fields(), None),
        (1, allreduce_fields(), None),
        (2, allreduce_fields(shape=(4,)), None),
        (3, allreduce_fields(dtype="float64"), None),
    ]
    assert agreement.mismatch_message(infos) == (
        "allreduce 'w': rank 3 sent dtype 'float64', ranks 0, 1, 2 sent 'float32'; "
        "rank 2 sent shape (4,), ranks 0, 1, 3 sent (3,) (every rank must call the same "
        "collectives, in the same order, with matching arguments)"
    )


def test_mismatch_message_reports_argument_errors():
    infos = [
        (0, allreduce_fields(name=None), None),
        (1, allreduce_fields(name=None), "ValueError: root_rank 7 is out of range"),
    ]
    assert agreement.mismatch_message(infos) == (
        "allreduce (unnamed): rank 1 failed before sending: ValueError: root_rank 7 is out of "
        "range (every rank must call the same collectives, in the same order, with matching "
        "arguments)"
    )


def test_mismatch_message_for_different_collectives():
    infos = [
        (0, allreduce_fields(name=None), None),
        (1, {"collective": "broadcast", "name": None, "root_rank": 0}, None),
    ]
    text = agreement.mismatch_message(infos)
    assert text.startswith("collective: ")
    assert "rank 0 sent collective 'allreduce', rank 1 sent 'broadcast'" in text
    assert "rank 0 sent root_rank None, rank 1 sent 0" in text


def test_error_text_and_digest():
    assert agreement.error_text(None) is None
    assert agreement.error_text(TypeError("bad dtype")) == "TypeError: bad dtype"
    fields = allreduce_fields()
    assert agreement.digest(fields) == agreement.digest(dict(fields))
    assert agreement.digest(fields) != agreement.digest(allreduce_fields(shape=(4,)))
    assert agreement.digest(fields) != agreement.FAILED
    assert agreement.describe(fields) == "allreduce 'w'"


class _AloneComm:
    """A communicator of one rank that fails if a check sends anything."""

    size = 1

    def Iallgather(self, *args):
        raise AssertionError("a one-rank check sent a message")

    def allgather(self, value):
        return [value]


def test_a_one_rank_check_sends_nothing_and_still_raises_the_ranks_own_error():
    comm, fields = _AloneComm(), allreduce_fields()
    assert agreement.exchange(comm, 7, 3) == ([7], [3])
    assert agreement.agree(comm, fields, payload=5) == [5]
    data = np.arange(6, dtype=np.float32).reshape(2, 3)
    (row,) = agreement.exchange_with_data(comm, agreement.digest(fields), data)
    assert row.tolist() == data.reshape(-1).tolist()
    assert agreement.exchange_with_data(comm, agreement.FAILED, data) is None
    with pytest.raises(ValueError, match="bad root"):
        agreement.agree(comm, fields, ValueError("bad root"))


def test_checks_are_bound_only_where_mpi_has_persistent_collectives():
    # bind() leaves a one-rank communicator alone, and one whose MPI library lacks persistent
    # collectives (mpi4py raises NotImplementedError) keeps an all-gather per check.
    class Comm:
        def __init__(self, size, handle, supported):
            self.size, self.handle, self.supported, self.posted = size, handle, supported, 0

        def Allgather_init(self, own, everyone):
            if not self.supported:
                raise NotImplementedError("MPI_Allgather_init")
            raise AssertionError("never reached in this test")

        def Iallgather(self, own, everyone):
            self.posted += 1
            everyone[:] = own
            return _Done()

    class _Done:
        def Wait(self):
            pass

    alone, old_mpi = Comm(1, 101, True), Comm(2, 102, False)
    agreement.bind(alone)
    agreement.bind(old_mpi)
    assert 101 not in agreement._bound and 102 not in agreement._bound
    assert agreement.exchange(old_mpi, 9, 4) == ([9, 9], [4, 4]) and old_mpi.posted == 1
    agreement.release(old_mpi)  # (nothing bound: nothing to free)


# ---------------------------------------------------------------------------------------------
# Everything that needs init() says so.

GETTERS = ["size", "rank", "local_size", "local_rank", "cross_size", "cross_rank",
           "is_homogeneous", "mpi_threads_supported"]  # fmt: skip

x = np.ones(4, dtype=np.float32)
COLLECTIVES = {
    "allreduce": lambda: hvd.allreduce(x),
    "allreduce_": lambda: hvd.allreduce_(x),
    "grouped_allreduce": lambda: hvd.grouped_allreduce([x, x]),
    "broadcast": lambda: hvd.broadcast(x, 0),
    "broadcast_": lambda: hvd.broadcast_(x, 0),
    "allgather": lambda: hvd.allgather(x),
    "reducescatter": lambda: hvd.reducescatter(x),
    "alltoall": lambda: hvd.alltoall(x),
    "barrier": lambda: hvd.barrier(),
    "broadcast_object": lambda: hvd.broadcast_object({"a": 1}),
    "allgather_object": lambda: hvd.allgather_object(1),
    "allreduce_async": lambda: hvd.allreduce_async(x),
    "allreduce_async_": lambda: hvd.allreduce_async_(x),
    "grouped_allreduce_async": lambda: hvd.grouped_allreduce_async([x]),
    "allgather_async": lambda: hvd.allgather_async(x),
    "broadcast_async": lambda: hvd.broadcast_async(x, 0),
    "reducescatter_async": lambda: hvd.reducescatter_async(x),
    "alltoall_async": lambda: hvd.alltoall_async(x),
    "join": lambda: hvd.join(),
    "start_timeline": lambda: hvd.start_timeline("/nonexistent/timeline.json"),
    "add_process_set": lambda: hvd.add_process_set([0]),
    "ProcessSet.rank": lambda: hvd.ProcessSet([0]).rank(),
    "global_process_set.size": lambda: hvd.global_process_set.size(),
}


@pytest.fixture
def not_initialized():
    assert not hvd.is_initialized(), "another test in this process left horovodlite initialized"


@pytest.mark.parametrize("getter", GETTERS)
def test_getters_need_init(not_initialized, getter):
    with pytest.raises(hvd.NotInitializedError, match=r"call hvd\.init\(\) first"):
        getattr(hvd, getter)()


@pytest.mark.parametrize("call", COLLECTIVES.values(), ids=COLLECTIVES.keys())
def test_collectives_need_init(not_initialized, call):
    with pytest.raises(hvd.NotInitializedError) as info:
        call()
    assert "horovodlite is not initialized: call hvd.init() first" in str(info.value)
    assert isinstance(info.value, hvd.HorovodLiteError)
    assert isinstance(info.value, RuntimeError)


def test_facts_that_need_no_init(not_initialized):
    assert hvd.is_initialized() is False
    assert hvd.mpi_built() and hvd.mpi_enabled()
    assert not hvd.gloo_enabled() and not hvd.rocm_built()
    assert hvd.HorovodInternalError is hvd.HorovodLiteError
    assert issubclass(hvd.MismatchError, hvd.HorovodLiteError)
    hvd.shutdown()  # before init: nothing to release, and no error


def test_adjacent_span_only_for_in_place_arrays_back_to_back_in_order():
    from horovodlite.fusion import FusionEntry, adjacent_span

    def entries(arrays, inplace=True):
        return [FusionEntry(a, np, inplace, ReduceOp.SUM, 1.0, 1.0, None) for a in arrays]

    flat = np.arange(10, dtype=np.float32)
    parts = [flat[:3], flat[3:4].reshape(1, 1), flat[4:10].reshape(2, 3)]
    span = adjacent_span(entries(parts))
    assert span is not None and span.shape == (10,) and np.shares_memory(span, flat)
    span[:] = -1  # the span is the arrays' own memory
    assert (flat == -1).all()
    assert adjacent_span(entries(parts[::-1])) is None  # out of order
    assert adjacent_span(entries([parts[0], parts[2]])) is None  # a gap
    assert adjacent_span(entries(parts, inplace=False)) is None  # results must be new arrays
    assert adjacent_span(entries([flat[:4:2], flat[4:]])) is None  # not contiguous
    frozen = flat.copy()
    frozen.flags.writeable = False
    assert adjacent_span(entries([frozen[:5], frozen[5:]])) is None


def _fusion_entries(arrays, inplace, prescale=1.0):
    from horovodlite.fusion import FusionEntry

    flags = inplace if isinstance(inplace, list) else [inplace] * len(arrays)
    return [FusionEntry(a, np, i, ReduceOp.SUM, prescale, 1.0, None) for a, i in zip(arrays, flags)]


def test_layout_of_one_array_in_place_out_of_place_and_strided():
    from horovodlite.fusion import lay_out

    x = np.arange(6.0).reshape(2, 3)
    (own,) = lay_out(_fusion_entries([x], True), np, np, False).pieces
    assert np.shares_memory(own, x)  # reduced where it lies: no copy in, none out
    layout = lay_out(_fusion_entries([x], False), np, np, False)
    # Out of place: written straight from the input into a new buffer, which is the result.
    assert layout.source is not None and np.shares_memory(layout.source, x)
    assert not layout.copied and layout.copy_back == [False]
    assert not np.shares_memory(layout.buffer, x)
    scaled = lay_out(_fusion_entries([x], False, prescale=2.0), np, np, False)
    assert scaled.source is None and len(scaled.copied) == 1  # scaled on the way in
    strided = np.arange(12.0).reshape(2, 6)[:, ::2]
    layout = lay_out(_fusion_entries([strided], True), np, np, False)
    assert layout.copied and layout.copy_back == [True] and layout.factor_on_copy_back


def test_one_in_place_array_on_a_device_is_reduced_where_it_lies():
    import types

    from horovodlite.fusion import FusionEntry, lay_out

    # A stand-in for CuPy: any array module other than numpy whose data stays on its device.
    device = types.SimpleNamespace(__name__="device", empty=np.empty)
    x = np.arange(6.0).reshape(2, 3)
    entry = FusionEntry(x, device, True, ReduceOp.SUM, 1.0, 1.0, None)
    layout = lay_out([entry], device, device, False)
    assert np.shares_memory(layout.pieces[0], x) and layout.lying == [True]
    assert not layout.copied and layout.offsets == [None] and layout.copy_back == [False]


class _OnDevice(np.ndarray):
    """A host array that answers `.data.ptr` as a CuPy array does (its address)."""

    @property
    def data(self):
        import types

        return types.SimpleNamespace(ptr=self.ctypes.data)


class _Kernel:
    """Runs copy_parts's arithmetic on the host, from the table the caller built, as the GPU
    would: part y of the grid copies table[n + y] elements from table[y] to table[2n + y]."""

    TYPES = {"float": np.float32, "double": np.float64, "unsigned char": np.uint8,
             "unsigned short": np.uint16, "unsigned int": np.uint32,
             "unsigned long long": np.uint64}  # fmt: skip

    def __init__(self, source: str, name: str):
        assert name == "copy_parts" and "void copy_parts(" in source
        self.type = np.dtype(self.TYPES[source.split("typedef ")[1].split(" T;")[0]])
        self.launches = 0

    def __call__(self, grid, block, args):
        import ctypes

        table, n, factor, scaled = args
        assert grid[1] == n and grid[0] >= 1 and block == (256,) and factor.dtype == self.type
        for y in range(n):
            width = int(table[2 * n + y]) * self.type.itemsize
            source, target = (
                np.frombuffer((ctypes.c_char * width).from_address(int(address)), self.type)
                for address in (table[y], table[n + y])
            )
            target[:] = source * factor if scaled else source
        self.launches += 1


def _fake_device(kernels: list):
    """A stand-in for CuPy whose arrays are host arrays that answer `.data.ptr`."""
    import types

    return types.SimpleNamespace(
        __name__="device",
        RawKernel=lambda source, name: kernels.append(_Kernel(source, name)) or kernels[-1],
        asarray=np.array,
        empty=lambda count, dtype: np.empty(count, dtype).view(_OnDevice),
    )


def test_gpu_parts_are_copied_in_one_launch(monkeypatch):
    from horovodlite import staging

    kernels = []
    device = _fake_device(kernels)
    monkeypatch.setattr(staging, "_kernels", {})
    buffer = np.arange(1.0, 10.0, dtype=np.float32).view(_OnDevice)
    arrays = [np.zeros(s, np.float32).view(_OnDevice) for s in ((2, 2), (0,), (5,))]
    parts = [buffer[:4], buffer[4:4], buffer[4:9]]
    address = lambda a: a.data.ptr  # noqa: E731
    sources, targets = [address(p) for p in parts], [address(a) for a in arrays]
    assert staging.copy_parts(device, buffer.dtype, sources, targets, [4, 0, 5], 0.5)
    assert arrays[0].tolist() == [[0.5, 1.0], [1.5, 2.0]] and arrays[2][-1] == 4.5
    assert len(kernels) == 1 and kernels[0].launches == 1
    # Plain copies take any dtype as bits; the kernel is made once per element type.
    halves = [np.zeros(3, np.float16).view(_OnDevice) for _ in range(2)]
    source = np.arange(6, dtype=np.float16).view(_OnDevice)
    targets = [address(h) for h in halves]
    assert staging.copy_parts(device, source.dtype, [address(source[:3]), address(source[3:])],
                              targets, [3, 3])  # fmt: skip
    assert halves[1].tolist() == [3.0, 4.0, 5.0] and len(kernels) == 2
    # What one copy each must do instead: a factor on float16 (scale() rounds those its own
    # way) or on integers (which truncate); no parts at all.
    assert not staging.copy_parts(device, source.dtype, [address(source)], targets[:1], [3], 0.5)
    ints = np.zeros(3, np.int32).view(_OnDevice)
    assert not staging.copy_parts(device, ints.dtype, [address(ints)], [address(ints)], [3], 0.5)
    assert not staging.copy_parts(device, ints.dtype, [], [], [])
    assert kernels[1].launches == 1  # nothing ran for those
    # copy_in gathers contiguous arrays into the fusion buffer in one launch, scaled on the way.
    dest = np.zeros(9, np.float32).view(_OnDevice)
    inputs = [np.full(s, v, np.float32).view(_OnDevice) for s, v in (((2, 2), 1), (0, 5), (5, 2))]
    staging.copy_in(dest, inputs, device, 3.0)
    assert dest.tolist() == [3.0] * 4 + [6.0] * 5 and kernels[0].launches == 2


def test_a_gpu_batch_is_copied_in_and_back_in_one_launch_each(monkeypatch):
    from horovodlite import staging
    from horovodlite.fusion import FusionEntry, lay_out

    kernels = []
    device = _fake_device(kernels)
    monkeypatch.setattr(staging, "_kernels", {})
    shapes = [(2, 3), (1,), (4,), (2, 2)]
    for inplace in ([True, False, True, True], [True] * 4):
        arrays = [np.arange(np.prod(s), dtype=np.float32).reshape(s).view(_OnDevice) + k
                  for k, s in enumerate(shapes)]  # fmt: skip
        wanted = [a * 2 * 0.25 for a in arrays]  # "two ranks" summed, then a factor of 0.25
        entries = [FusionEntry(a, device, i, ReduceOp.SUM, 1.0, 1.0, None)
                   for a, i in zip(arrays, inplace)]  # fmt: skip
        layout = lay_out(entries, device, device, False)
        assert layout.offsets == [0, 6, 7, 11] and layout.copy_back == inplace
        staging.copy_in(layout.buffer, [e.array for e in layout.copied], device, 1.0)
        # What the transport makes of two ranks holding the same data: a Sum, and the factor
        # where results are not all copied back (fusion.fused_allreduce).
        layout.buffer *= 2 if layout.factor_on_copy_back else 0.5
        factor = 0.25 if layout.factor_on_copy_back else 1.0
        results = staging.hand_back(entries, layout, device, factor, lambda phase: nullcontext())
        for result, array, want, own in zip(results, arrays, wanted, inplace):
            assert result.shape == want.shape and np.array_equal(result, want)
            assert (result is array) == own  # in place: the array itself; else a buffer view
    # One plain kernel: the copies in, and the mixed batch's copy back; one scaled: the copy
    # back with the factor applied on the way.
    assert [k.launches for k in kernels] == [3, 1]


def test_layout_of_a_batch_decides_each_array_once():
    from horovodlite.fusion import lay_out

    flat = np.zeros(10)
    adjacent = [flat[:4], flat[4:]]
    layout = lay_out(_fusion_entries(adjacent, True), np, np, False)
    assert len(layout.pieces) == 1 and np.shares_memory(layout.pieces[0], flat)
    assert layout.offsets == [None, None] and not layout.copied
    apart = [np.zeros(3), np.zeros(2), np.zeros(4)]
    # Mixed: the out-of-place result is a view of a new buffer; the in-place ones come back.
    layout = lay_out(_fusion_entries(apart, [True, False, True]), np, np, False)
    assert layout.copy_back == [True, False, True] and not layout.factor_on_copy_back
    assert [e.array.size for e in layout.copied] == [3, 2, 4] and layout.buffer.size == 9
    # The ring takes pieces: a large array alone lies where it is, and so does a lone small one;
    # a run of small ones apart in memory shares a piece in the fusion buffer.
    large = np.zeros(40000)  # 320 KB: at least fusion.ALONE_BYTES
    batch = [apart[0], apart[1], large, apart[2]]
    layout = lay_out(_fusion_entries(batch, True), np, np, True)
    assert [p.size for p in layout.pieces] == [5, 40000, 4]
    assert layout.lying == [False, True, True] and layout.copy_back == [True, True, False, False]
    assert np.shares_memory(layout.pieces[1], large) and layout.offsets[2] is None


def test_pieces_slices_within_a_piece_and_the_ring_cuts_its_segments_at_their_borders():
    from horovodlite.algorithms.pieces import Pieces
    from horovodlite.algorithms.ring import _segments

    arrays = [np.arange(3.0), np.empty(0), np.arange(3.0, 8.0), np.arange(8.0, 9.0)]
    pieces = Pieces(arrays)
    assert (pieces.size, pieces.nbytes, pieces.cuts) == (9, 72, [3, 3, 8])
    assert np.shares_memory(pieces[3:5], arrays[2]) and list(pieces[3:5]) == [3.0, 4.0]
    assert list(pieces[8:9]) == [8.0] and pieces[9:9].size == 0
    with pytest.raises(IndexError, match="2:4 lie in more than one piece"):
        pieces[2:4]
    # Segments of at most 2 elements, cut at 3 and 8 as well: none spans two pieces.
    assert _segments(1, 9, 2, pieces.cuts) == [(1, 3), (3, 5), (5, 7), (7, 8), (8, 9)]
    assert _segments(4, 4, 2, pieces.cuts) == [(4, 4)]  # an empty chunk: one empty segment
    assert all(pieces[lo:hi].size == hi - lo for lo, hi in _segments(0, 9, 4, pieces.cuts))


# ---------------------------------------------------------------------------------------------
# A check's wait spins only where every rank of the host has a core of its own (issue #38).


@pytest.mark.parametrize("cores, spins", [(4, True), (1, True), (0.5, False)])
def test_a_check_spins_only_where_each_rank_has_a_core(cores, spins):
    from mpi4py import MPI

    from horovodlite import waiting

    comm = MPI.COMM_SELF.Dup()
    watch = waiting.Watch(comm, timeout=5.0, stall_check=5.0, generation=0, cores_per_rank=cores)
    try:
        assert (watch._spin > 0) is spins
        sent, received = np.arange(3), np.zeros(3, dtype=np.int64)
        wait = watch.check_waiter(lambda: ("check", 1), [0])
        wait(comm.Iallgather(sent, received))
        assert received.tolist() == [0, 1, 2]
    finally:
        watch.close()
        comm.Free()


def test_cores_per_rank_shares_the_union_of_the_ranks_affinities():
    from mpi4py import MPI

    from horovodlite.hosts import cores_per_rank, share_of_cores

    assert share_of_cores([{0, 1}] * 4) == 0.5  # four ranks in a two-core container
    assert share_of_cores([{0}, {1}, {2}, {3}]) == 1  # pinned one to a core each
    assert share_of_cores([{0, 1}, {0, 1}]) == 1
    assert share_of_cores([range(8)]) == 8
    assert cores_per_rank(MPI.COMM_SELF) == len(os.sched_getaffinity(0))
