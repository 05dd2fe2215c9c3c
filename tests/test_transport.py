"""The transport choice (horovodlite/transport.py) and its setting, in one process."""

import dataclasses

import numpy as np
import pytest

from horovodlite import transport
from horovodlite.config import Settings
from horovodlite.ops import ReduceOp
from horovodlite.run import check_build

GPU = object()  # select() needs only "not numpy" for a GPU array module
FLOAT32 = np.dtype(np.float32)


class FakeTransport(transport.GroupTransport):
    def __init__(self, name, device):
        super().__init__()
        self.name, self.device, self.reducible = name, device, frozenset({FLOAT32})


@pytest.fixture
def registry(monkeypatch):
    """Give each test its own registry, with transports that say whether they are usable."""
    factories = {}
    monkeypatch.setattr(transport, "_FACTORIES", factories)
    return factories


def settings(name: str) -> Settings:
    return dataclasses.replace(Settings(), transport=name)


def test_setting_is_read_and_checked(monkeypatch):
    assert Settings.from_environment().transport == "auto"
    monkeypatch.setenv("HOROVODLITE_TRANSPORT", " Gloo ")
    assert Settings.from_environment().transport == "gloo"
    monkeypatch.setenv("HOROVODLITE_TRANSPORT", "ucx")
    with pytest.raises(ValueError, match="HOROVODLITE_TRANSPORT='ucx'.*auto, mpi, gloo, nccl"):
        Settings.from_environment()


def test_auto_prefers_nccl_then_cupy_nccl_for_gpu_buffers(registry):
    nccl, cupy_nccl = FakeTransport("nccl", True), FakeTransport("cupy-nccl", True)
    registry["cupy-nccl"] = lambda s: cupy_nccl
    assert transport.select(settings("auto"), GPU, ReduceOp.SUM, FLOAT32) is cupy_nccl
    registry["nccl"] = lambda s: nccl
    assert transport.select(settings("auto"), GPU, ReduceOp.SUM, FLOAT32) is nccl
    # Host buffers stay on MPI; an op or dtype NCCL lacks goes to MPI (CUDA-aware or staged).
    assert transport.select(settings("auto"), np).name == "mpi"
    assert transport.select(settings("auto"), GPU, ReduceOp.ADASUM, FLOAT32).name == "mpi"
    assert transport.select(settings("auto"), GPU, ReduceOp.SUM, np.dtype(bool)).name == "mpi"
    assert transport.select(settings("auto"), GPU).name == "nccl"  # data movement: any dtype
    assert transport.select(settings("mpi"), GPU, ReduceOp.SUM, FLOAT32).name == "mpi"
    assert transport.select(settings("cupy-nccl"), GPU, ReduceOp.SUM, FLOAT32) is cupy_nccl


def test_unusable_gpu_transports_leave_gpu_buffers_to_mpi(registry):
    registry["nccl"] = lambda s: None  # torch without CUDA
    chosen = transport.select(settings("auto"), GPU, ReduceOp.SUM, FLOAT32)
    assert chosen.name == "mpi" and chosen.device == transport.cuda_aware_mpi()


def test_gloo_moves_host_buffers_only(registry):
    gloo = FakeTransport("gloo", False)
    registry["gloo"] = lambda s: gloo
    assert transport.select(settings("gloo"), np, ReduceOp.SUM, FLOAT32) is gloo
    assert transport.select(settings("gloo"), np, ReduceOp.SUM, np.dtype(np.uint16)).name == "mpi"
    assert transport.select(settings("gloo"), GPU).name == "mpi"


def test_a_choice_is_kept_until_the_settings_or_the_registry_change(registry):
    chosen, gloo = settings("gloo"), FakeTransport("gloo", False)
    with pytest.raises(ValueError, match="HOROVODLITE_TRANSPORT=gloo is not available"):
        transport.select(chosen, np, ReduceOp.SUM, FLOAT32)
    transport.register("gloo", lambda s: gloo)  # as importing horovodlite.torch does
    assert transport.select(chosen, np, ReduceOp.SUM, FLOAT32) is gloo
    transport.register("gloo", lambda s: FakeTransport("gloo", False))
    assert transport.select(chosen, np, ReduceOp.SUM, FLOAT32) is not gloo
    assert transport.select(settings("mpi"), np, ReduceOp.SUM, FLOAT32).name == "mpi"


def test_a_named_transport_that_is_missing_is_an_error(registry):
    with pytest.raises(ValueError, match="HOROVODLITE_TRANSPORT=gloo is not available.*torch"):
        transport.select(settings("gloo"), np)
    registry["nccl"] = lambda s: None
    with pytest.raises(ValueError, match="HOROVODLITE_TRANSPORT=nccl is not available"):
        transport.select(settings("nccl"), GPU)
    with pytest.raises(ValueError, match="transport name must be one of"):
        transport.register("ucx", lambda s: None)


def test_choice_is_described(registry):
    registry["gloo"] = lambda s: FakeTransport("gloo", False)
    described = transport.describe_choice(settings("gloo"))
    assert described["host"] == "gloo" and described["available"] == ["mpi", "gloo"]
    assert described["gpu"].startswith("mpi")
    assert "none (HOROVODLITE_TRANSPORT=nccl" in transport.describe_choice(settings("nccl"))["host"]


def test_check_build_reports_the_transports(monkeypatch):
    monkeypatch.setenv("HOROVODLITE_TRANSPORT", "mpi")
    lines = check_build._transports()
    assert lines[0] == "Transports (HOROVODLITE_TRANSPORT=mpi):"
    assert lines[1] == "    host buffers:  mpi" and lines[2].startswith("    GPU buffers:   mpi")
    monkeypatch.setenv("HOROVODLITE_TRANSPORT", "bad")
    assert check_build._transports()[0].startswith("Transports:      none: HOROVODLITE_TRANSPORT")


def test_gpu_benchmark_without_cuda_fails_with_a_clear_message(capsys):
    pytest.importorskip("torch")
    from horovodlite.bench import cli, gpu

    if not gpu.cuda_missing():
        pytest.skip("this machine has a GPU: the benchmark would run")
    assert cli.main(["--device", "cuda", "--np", "2"]) == 2
    err = capsys.readouterr().err
    assert "--device cuda: torch" in err and "no CUDA GPU" in err


# -- torch's TensorKind: a fused batch of torch tensors joined and split back ------------------


@pytest.mark.parametrize("layout", ["contiguous", "channels_last"])
@pytest.mark.parametrize("copy_each", ["foreach", "loop"])
@pytest.mark.parametrize("factor", [1.0, 0.25])
def test_torch_batch_is_joined_and_split_back(monkeypatch, copy_each, factor, layout):
    # What the engine does with a batch of torch tensors that travel as they are, less the
    # transfer: join (times the prescale), then split back times the factor, in place or new.
    # A 64 KiB in-place result takes the factor on its way out on the host, where it lies in
    # order; a torch without `_foreach_copy_` copies one by one. channels_last: the 4-D tensors
    # lie in another order, joined in their logical one and copied back as they lie.
    torch = pytest.importorskip("torch")
    from horovodlite.torch import tensors

    if copy_each == "loop":
        monkeypatch.setattr(tensors, "_copy_each", tensors._copy_loop)
    kind = tensors.TORCH_TENSORS
    shapes = [(3,), (2, 5), (), (0, 4), (130, 130), (6,), (4, 4), (2, 3, 4, 5), (16, 32, 8, 8)]
    mixed = [True, False, True, True, True, False, False, True, False]
    values = [torch.arange(float(torch.Size(s).numel())).reshape(s) - 2 for s in shapes]
    order = getattr(torch, layout.replace("contiguous", "contiguous_format"))
    # All in place: the kept buffer, twice; some new (views of the buffer): a new buffer.
    for inplace in ([True] * len(shapes), mixed, [True] * len(shapes)):
        reused = all(inplace)
        batch = [v.clone(memory_format=order if v.dim() == 4 else torch.preserve_format)
                 for v in values]  # fmt: skip
        strides = [tensor.stride() for tensor in batch]
        assert all(kind.joinable(tensor) for tensor in batch)
        buffer, parts = kind.join(batch, 2.0, reused=reused)
        assert buffer.shape == (sum(v.numel() for v in values),)
        torch.testing.assert_close(buffer, 2.0 * torch.cat([v.reshape(-1) for v in values]))
        results = kind.split(buffer, parts, batch, inplace, factor)
        for result, tensor, value, own, stride in zip(results, batch, values, inplace, strides):
            assert (result is tensor) == own and result.shape == value.shape
            assert torch.equal(result, value * 2.0 * factor)
            assert tensor.stride() == stride
            if not own:
                assert torch.equal(tensor, value)  # the input is untouched


def test_torch_kind_joins_only_dense_layouts():
    # A strided slice or a transposed matrix goes the general way, as a view.
    torch = pytest.importorskip("torch")
    from horovodlite.torch.tensors import TORCH_TENSORS as kind

    x = torch.zeros(2, 3, 4, 5)
    assert kind.joinable(x.contiguous(memory_format=torch.channels_last))
    volume = torch.zeros(2, 3, 4, 5, 6)
    assert kind.joinable(volume.contiguous(memory_format=torch.channels_last_3d))
    assert not kind.joinable(x[:, :, ::2])
    assert not kind.joinable(torch.zeros(3, 4).t())
    assert not kind.joinable(torch.zeros(6)[::2])


def test_torch_batch_of_large_in_place_tensors_only_is_scaled_on_the_way_out():
    # Every result takes the factor on its way out: nothing is left to scale in the buffer
    # (torch's `_foreach_mul_` refuses an empty list).
    torch = pytest.importorskip("torch")
    from horovodlite.torch.tensors import TORCH_TENSORS as kind

    values = [torch.arange(20000.0), torch.arange(30000.0).reshape(100, 300)]
    batch = [v.clone() for v in values]
    buffer, parts = kind.join(batch, 1.0, reused=True)
    results = kind.split(buffer, parts, batch, [True, True], 0.5)
    for result, tensor, value in zip(results, batch, values):
        assert result is tensor and torch.equal(tensor, value * 0.5)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_torch_half_types_are_scaled_as_the_general_way_scales_their_views(monkeypatch, dtype):
    # A half-type tensor travels as it is with a factor (Average, Compression.fp16) only because
    # torch's multiply rounds as staging.scale rounds its numpy view: tried on every value, by
    # every way the kind scales (a single tensor, join's prescale, split's factor on a large
    # in-place result, on small ones and on new results). torch's `_foreach_mul_` would not.
    torch = pytest.importorskip("torch")
    from horovodlite.torch.tensors import TORCH_TENSORS as kind

    from horovodlite import ops
    from horovodlite.staging import scale

    monkeypatch.setattr(ops, "_half_kernels", None)  # (the general way's scaling: numpy's own)
    every = torch.from_numpy(np.arange(-32768, 32768, dtype=np.int16)).view(getattr(torch, dtype))
    as_numpy = every.view(torch.int16).numpy().view(kind.describe(every)[0])

    def assert_scaled(result, values, factor):
        expected = values.copy()
        scale(np, expected, factor)
        got = result.reshape(-1).view(torch.int16).numpy().view(expected.dtype)
        same = got.view(np.uint16) == expected.view(np.uint16)
        nan = np.isnan(expected.astype(np.float32)) & np.isnan(got.astype(np.float32))
        assert (same | nan).all(), f"{(~(same | nan)).sum()} values rounded otherwise"

    with np.errstate(invalid="ignore", over="ignore"):
        for factor in (1 / 3, 0.1, 1 / 7):
            one = every.clone()
            kind.scale(one, factor)
            assert_scaled(one, as_numpy, factor)
            buffer, _ = kind.join([every[:40000], every[40000:]], factor, reused=False)
            assert_scaled(buffer, as_numpy, factor)
            # 128 KiB in place (scaled on its way out), 100 values in place, the rest new.
            batch = [every.clone(), every[:100].clone(), every[100:].clone()]
            buffer, parts = kind.join(batch, 1.0, reused=False)
            results = kind.split(buffer, parts, batch, [True, True, False], factor)
            assert_scaled(results[0], as_numpy, factor)
            assert_scaled(results[1], as_numpy[:100], factor)
            assert_scaled(results[2], as_numpy[100:], factor)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_torch_half_kernels_round_as_numpy(dtype):
    # The torch binding lends the core torch's vectorized float16 and bfloat16 kernels for
    # large host arrays (numpy's are 20x slower): they must give numpy's bits, for every value
    # against random partners, in a Sum, a Product and a scaling by a factor; small, strided
    # and read-only arrays (torch would warn on a view of one) stay with numpy.
    pytest.importorskip("torch")
    import warnings

    import ml_dtypes
    from horovodlite.torch.half_kernels import TORCH_HALF_KERNELS as kernels

    from horovodlite import ops, staging

    every = np.arange(-32768, 32768, dtype=np.int16)
    values = every.view(np.float16 if dtype == "float16" else ml_dtypes.bfloat16)
    partners = np.random.default_rng(5).permutation(every).view(values.dtype)

    def assert_same(got, want):
        same = got.view(np.uint16) == want.view(np.uint16)
        nan = np.isnan(got.astype(np.float32)) & np.isnan(want.astype(np.float32))
        assert (same | nan).all(), f"{(~(same | nan)).sum()} values differ"

    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("error")
        for op, ufunc in ((ops.Sum, np.add), (ops.Product, np.multiply)):
            acc = values.copy()
            kernels.combine(acc, partners, op)
            assert_same(acc, ufunc(values, partners))
        for factor in (1 / 3, 0.1, 2.5):
            out = np.empty_like(values)
            kernels.multiply(values, factor, out)
            expected = values.copy()
            ops.use_half_kernels(None)
            try:
                staging.scale(np, expected, factor)
            finally:
                ops.use_half_kernels(kernels)
            assert_same(out, expected)
    assert ops.half_kernels_for(values, partners) is kernels
    assert ops.half_kernels_for(values[:100], partners[:100]) is None  # numpy's own is faster
    assert ops.half_kernels_for(values[::2], partners[::2]) is None
    readonly = np.frombuffer(partners.tobytes(), dtype=values.dtype)
    assert ops.half_kernels_for(values.copy(), readonly) is None
    assert ops.half_kernels_for(values.astype(np.float32), partners.astype(np.float32)) is None


def test_optimizer_state_tensors_are_made_where_the_root_has_them():
    # broadcast_optimizer_state sends the state's structure first; a rank that lacks a tensor
    # makes it where the root has it: on the host (Adam's `step` beside GPU parameters) or on
    # this rank's own parameter device (here torch's "meta" device stands for a GPU).
    torch = pytest.importorskip("torch")
    from horovodlite.torch.functions import _fill, _skeleton

    root = {"step": torch.tensor(3.0), "exp_avg": torch.ones(2, 3, device="meta")}
    skeleton = _skeleton(root)
    assert skeleton == {"step": ("__tensor__", (), "float32", "cpu"),
                        "exp_avg": ("__tensor__", (2, 3), "float32", "meta")}  # fmt: skip
    tensors: list = []
    local = {"step": torch.tensor(0.0, device="meta")}  # fits but lies elsewhere: not reused
    made = _fill(skeleton, local, tensors=tensors, device=torch.device("meta"))
    assert made["step"].device.type == "cpu" and made["step"] is not local["step"]
    assert made["exp_avg"].device.type == "meta" and made["exp_avg"].shape == (2, 3)
    assert len(tensors) == 2


# -- GPU data that no CuPy array holds: its fusion key and a joined rank's zeros ---------------


def test_gpu_data_fuses_alike_as_cupy_arrays_or_tensors():
    # A fusion key tells host data from GPU data, not one array module from another: a CuPy
    # array and a framework's tensor on a GPU (transport.ON_DEVICE) share a batch.
    import types

    from horovodlite.fusion import fusion_key

    f32, cupy_like = np.dtype(np.float32), types.ModuleType("cupy")
    key = fusion_key(f32, ReduceOp.SUM, 1.0, 1.0, None, transport.ON_DEVICE)
    assert fusion_key(f32, ReduceOp.SUM, 1.0, 1.0, None, cupy_like) is key
    assert fusion_key(f32, ReduceOp.SUM, 1.0, 1.0, None, np) is not key


def test_a_joined_rank_makes_zeros_no_cupy_array_holds_with_the_lent_kind():
    import importlib.util

    import ml_dtypes

    from horovodlite import buffers, tensor_kind
    from horovodlite.fusion import FusionEntry, TensorEntry, fusion_key, zeros_entry

    bf16, f32 = np.dtype(ml_dtypes.bfloat16), np.dtype(np.float32)
    assert not buffers.cupy_holds(bf16)
    assert buffers.cupy_holds(f32) == (importlib.util.find_spec("cupy") is not None)

    class Kind(tensor_kind.TensorKind):
        def zeros(self, dtype, shape):
            return ("zeros", dtype, shape)

    fields = {"dtype": "bfloat16", "shape": [2, 3], "op": "SUM", "prescale_factor": 1.0,
              "postscale_factor": 0.5, "algorithm": None, "device": "cuda"}  # fmt: skip
    lent, kind = tensor_kind.device_tensors(), Kind()
    tensor_kind.use_device_tensors(kind)
    try:
        entry = zeros_entry(fields)
        assert type(entry) is TensorEntry and entry.kind is kind and entry.array == (
            "zeros", bf16, (2, 3))
        assert entry.xp is transport.ON_DEVICE and entry.postscale == 0.5
        assert entry.key is fusion_key(bf16, ReduceOp.SUM, 1.0, 0.5, None, transport.ON_DEVICE)
        host = zeros_entry(dict(fields, device="cpu"))  # host data: numpy's zeros, as before
        assert type(host) is FusionEntry and host.xp is np and host.array.dtype == bf16
        assert not host.array.any() and host.array.shape == (2, 3)
    finally:
        tensor_kind.use_device_tensors(lent)
