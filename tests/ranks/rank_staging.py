"""A large staged all-reduce moves through the host in pieces (fusion._staged_in_pieces,
staging.through_host_in_pieces), through the MPI transport at 1-4 ranks.

GPU arrays are the host stand-in of stand_in_gpu.py, whose copies are queued as a stream queues
them: a piece moved before its copy down ran, or a result read before its copy up, comes out
wrong. Pieces of 16 float32 values, so small arrays cut into several, unevenly; each rank's
pieces meet the same pieces of the others in the transport's all-reduce.
"""

import numpy as np
import pytest
import stand_in_gpu as gpu
from oracle import assert_reduced, everyone, rank_values, reduce_expected
from stand_in_gpu import GPU, on_device, to_host

import horovodlite as hvd
from horovodlite import fusion, staging, transport
from horovodlite.fusion import FusionEntry
from horovodlite.ops import ReduceOp
from horovodlite.process_sets import communicator, global_process_set


@pytest.fixture
def pieces(monkeypatch):
    """Stage the stand-in's arrays through the MPI transport, in pieces of 64 bytes; return
    the number of batches that went in pieces, as a list that grows."""
    monkeypatch.setattr(transport, "cuda_aware_mpi", lambda: False)  # no GPU buffers in MPI
    monkeypatch.setattr(staging, "PIECE_BYTES", 64)
    # (the one-launch copies on the GPU: their host stand-in is tests/test_core_unit.py's)
    monkeypatch.setattr(staging, "_gathered", lambda *args: False)
    monkeypatch.setattr(staging, "_delivered_together", lambda *args: False)
    moved, through = [], staging.through_host_in_pieces
    monkeypatch.setattr(fusion, "through_host_in_pieces",
                        lambda *args: moved.append(args[0].size) or through(*args))  # fmt: skip
    transport._forget_choices()
    yield moved
    transport._forget_choices()
    staging._pinned.__dict__.clear()
    gpu.reset()


def _reduced(entries):
    return fusion.fused_allreduce(communicator(global_process_set)[0], entries)


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32])
@pytest.mark.parametrize("inplace", [False, True])
def test_one_array_in_pieces(pieces, dtype, inplace):
    r = hvd.rank()
    for shape in ((41,), (7, 6)):  # 41 values: 2 pieces and 9 over (at float32)
        values = rank_values(shape, dtype, r, seed=71)
        x = on_device(values)
        (out,) = _reduced([FusionEntry(x, GPU, inplace, ReduceOp.SUM, 1.0, 1.0, None)])
        assert (out is x) == inplace and out.shape == shape
        assert_reduced(to_host(out), reduce_expected(everyone(values), hvd.Sum), hvd.Sum)
        if not inplace:
            np.testing.assert_array_equal(to_host(x), values)
    assert pieces == [41, 42]  # each above two pieces of 64 bytes


def test_a_batch_in_pieces_scaled_and_strided(pieces):
    r = hvd.rank()
    shapes = [(5, 4), (3,), (9,), (2, 8)]
    values = [rank_values(s, np.float32, r, seed=72 + k) for k, s in enumerate(shapes)]
    base = on_device(np.zeros((2, 16), np.float32))
    arrays = [on_device(v) for v in values[:3]]
    strided = base[:, ::2]  # not contiguous: copied into the batch, its result copied back
    strided[...] = values[3]
    arrays.append(strided)
    inplace = [True, False, True, True]
    entries = [FusionEntry(a, GPU, i, ReduceOp.AVERAGE, 0.5, 3.0, None)
               for a, i in zip(arrays, inplace)]  # fmt: skip
    results = _reduced(entries)
    assert pieces == [sum(v.size for v in values)]
    for result, array, value, own in zip(results, arrays, values, inplace):
        assert (result is array) == own and result.shape == value.shape
        expected = reduce_expected(everyone(value), hvd.Average, 0.5, 3.0)
        np.testing.assert_allclose(to_host(result), expected, rtol=1e-6)
    np.testing.assert_array_equal(to_host(base)[:, 1::2], 0)  # beside the strided view: as it was


def test_a_small_staged_all_reduce_goes_in_one_piece(pieces):
    r = hvd.rank()
    values = rank_values((31,), np.float32, r, seed=73)  # 124 bytes: under two pieces
    (out,) = _reduced([FusionEntry(on_device(values), GPU, False, ReduceOp.SUM, 1.0, 1.0, None)])
    assert pieces == []
    assert_reduced(to_host(out), reduce_expected(everyone(values), hvd.Sum), hvd.Sum)
