"""Past one GPU, on paper: data-parallel scaling at 8 and 64 H100s, modelled from one H100.

    python benchmarks/gpu_scaling_model.py [--out benchmarks/results/gpu_scaling_model.json]

No machine here has more than one GPU, so this predicts the scaling efficiency of a training step
(one GPU's step time over N GPUs' step time, at the same batch per GPU) from measured parts:

  * what one H100 measured on 2026-11-27 with horovodlite at 5fa6a9c (the engine's cost per
    request, torch's cost per NCCL call, the device copy rate, ResNet-50's step time; the logs
    are in ../shared/results/gpu-2026-11-27/, quoted in docs/gpu.md);
  * NCCL's published bus bandwidth on H100 (NVLink inside a node, 400 Gbit/s NICs across nodes);
  * the backward pass's timeline: each gradient becomes ready in reverse layer order, spread
    over the backward time in proportion to its layer's FLOPs (shapes built here, no torchvision).

Each contender is a schedule of the same gradients: buckets (DDP) or engine cycles
(horovodlite), a host that launches them, one stream that moves them with alpha-beta costs. The
step is the forward and optimizer time plus the later of the backward's end and the last
all-reduce's end. It is a model: what it leaves out is listed in docs/gpu.md.
"""

import argparse
import dataclasses
import json
import math
import pathlib
from dataclasses import dataclass

# --- Measured on one H100 80GB HBM3, 2026-11-27, horovodlite 5fa6a9c (docs/gpu.md) ------------
RESNET50_STEP_MS = 37.94  # train.log: plain torch ResNet-50, batch 64, float32, median step
HVD_FUSED_161_MS = 16.77  # fused.log: 161 ResNet-50 gradients, async and fused, per pass
HVD_ONE_BUFFER_MS = 0.10  # fused.log: the same 102 MB as one buffer, in place
NCCL_ASYNC_161_MS = 4.55  # fused.log: 161 async torch.distributed NCCL all-reduces
# bench.log: torch NCCL all-reduce of 256 MiB at 1 rank, 1480.69 GB/s: NCCL copies input to
# output, so this is the device's copy rate (bytes copied per second).
DEVICE_COPY_GBPS = 1480.0
GRADIENTS = 161
# The engine's cost per request: what 161 requests cost beyond one buffer of the same bytes
# (103.5 us); the issue #38 target: 161 fused requests within 161 async NCCL calls (28.3 us),
# which is also torch's host cost per NCCL call.
ENGINE_REQUEST_US = (HVD_FUSED_161_MS - HVD_ONE_BUFFER_MS) * 1e3 / GRADIENTS
NCCL_CALL_US = NCCL_ASYNC_161_MS * 1e3 / GRADIENTS
TARGET_REQUEST_US = NCCL_CALL_US

# --- Measured on one H200, 2026-11-27, horovodlite bdef7d9 (stop 47; docs/gpu.md) --------------
# benchmarks/results/gpu_h200_2026-11-27/run3_bdef7d9/fused.log, second pass: the same 161
# gradients fused 5.85 ms, one buffer 0.02 ms (506b043 beside it on that machine: 12.01 and 0.05,
# 74.3 us a request, so its host is faster than the H100's: a lower bound on the H100's cost).
NOW_FUSED_161_MS = 5.85
NOW_ONE_BUFFER_MS = 0.02
ENGINE_REQUEST_NOW_US = (NOW_FUSED_161_MS - NOW_ONE_BUFFER_MS) * 1e3 / GRADIENTS

# --- Published --------------------------------------------------------------------------------
# nccl-tests all_reduce_perf bus bandwidth (doc/PERFORMANCE.md defines busbw = algbw 2(n-1)/n):
# about 480 GB/s on 8 H100 SXM on NVSwitch (NVLink 4: 450 GB/s per GPU each way), and 46-48
# GB/s per 400 Gbit/s NIC (50 GB/s line rate) across nodes.
NVLINK_BUSBW_GBPS = 480.0
NIC_BUSBW_GBPS = 47.0
GPUS_PER_NODE = 8
# H100 SXM dense BF16 peak (NVIDIA datasheet), for BERT's step time below.
H100_BF16_TFLOPS = 989.0

# --- Assumed (not measured here; docs/gpu.md shows what each moves) -----------------------------
NCCL_LATENCY_NODE_US = 10.0  # an all-reduce's latency term inside a node (NVLink, LL protocol)
NCCL_LATENCY_NODES_US = 30.0  # across 8 nodes (tree over InfiniBand)
NEGOTIATION_NODE_US = 10.0  # horovodlite's per-cycle agreement: one small MPI all-reduce
NEGOTIATION_NODES_US = 100.0  # the same across 8 nodes over MPI (TCP)
CYCLE_US = 1000.0  # HOROVODLITE_CYCLE_TIME, default 1 ms
FUSION_THRESHOLD = 128 << 20  # HOROVODLITE_FUSION_THRESHOLD, default 128 MiB
HVD_COPY_PASSES = 2  # into and out of the fusion buffer (fusion.py at 5fa6a9c)
DDP_BUCKET_BYTES = 25 << 20  # DistributedDataParallel bucket_cap_mb default, 25 MiB
DDP_FIRST_BUCKET_BYTES = 1 << 20  # torch.distributed._DEFAULT_FIRST_BUCKET_BYTES
DDP_HOOK_US = 5.0  # DDP's C++ hook per gradient: one copy kernel launched into its bucket
# DDP copies each gradient into its bucket and back (gradient_as_bucket_view=False, the default)
DDP_COPY_PASSES = 2
BACKWARD_FRACTION = 2 / 3  # backward's share of a step (twice the forward's FLOPs)
BERT_MFU = 0.40  # BERT-large's share of the H100's peak in mixed precision
BERT_BATCH, BERT_SEQ, BERT_MASKED = 64, 128, 20  # phase-1 pretraining, per GPU
FLOAT32 = 4  # gradients are float32 in both models (ResNet-50 as measured; BERT under autocast)


@dataclass(frozen=True)
class Inputs:
    """Every cost the model uses, in microseconds, GB/s and bytes; vary one to see what it moves."""

    engine_request_us: float = ENGINE_REQUEST_US
    engine_request_now_us: float = ENGINE_REQUEST_NOW_US
    target_request_us: float = TARGET_REQUEST_US
    nccl_call_us: float = NCCL_CALL_US
    device_copy_gbps: float = DEVICE_COPY_GBPS
    nvlink_busbw_gbps: float = NVLINK_BUSBW_GBPS
    nic_busbw_gbps: float = NIC_BUSBW_GBPS
    nccl_latency_node_us: float = NCCL_LATENCY_NODE_US
    nccl_latency_nodes_us: float = NCCL_LATENCY_NODES_US
    negotiation_node_us: float = NEGOTIATION_NODE_US
    negotiation_nodes_us: float = NEGOTIATION_NODES_US
    cycle_us: float = CYCLE_US
    fusion_threshold: float = FUSION_THRESHOLD
    ddp_bucket_bytes: float = DDP_BUCKET_BYTES
    ddp_hook_us: float = DDP_HOOK_US
    step_scale: float = 1.0  # multiplies every workload's step time (a faster or slower GPU)
    backward_fraction: float = BACKWARD_FRACTION


@dataclass(frozen=True)
class Cluster:
    """N GPUs, `gpus_per_node` to a node, the nodes joined by `nics_per_node` NICs each."""

    ranks: int
    nics_per_node: int = 8
    gpus_per_node: int = GPUS_PER_NODE

    @property
    def nodes(self) -> int:
        return math.ceil(self.ranks / min(self.ranks, self.gpus_per_node))


@dataclass(frozen=True)
class Gradient:
    name: str
    numel: int
    flops: float  # the forward FLOPs of the work that produces it (backward is about twice)


@dataclass(frozen=True)
class Workload:
    name: str
    gradients: tuple  # Gradient, in the model's registration (forward) order
    step_us: float  # one GPU's training step, no communication


# --- The models' gradients ------------------------------------------------------------------------


def resnet50_gradients(image: int = 224) -> tuple:
    """Return torchvision's resnet50() parameters in order: bottlenecks [3, 4, 6, 3], 64..2048."""
    grads = []

    def conv(name, cin, cout, k, size):  # size: the output's height and width
        grads.append(
            Gradient(f"{name}.weight", cout * cin * k * k, 2.0 * cin * cout * k * k * size**2)
        )

    def bn(name, c):
        grads.append(Gradient(f"{name}.weight", c, 0.0))
        grads.append(Gradient(f"{name}.bias", c, 0.0))

    size = image // 2
    conv("conv1", 3, 64, 7, size)
    bn("bn1", 64)
    size //= 2  # max pool
    cin = 64
    for stage, (blocks, width) in enumerate(zip((3, 4, 6, 3), (64, 128, 256, 512)), start=1):
        for block in range(blocks):
            prefix = f"layer{stage}.{block}"
            out_size = size // 2 if block == 0 and stage > 1 else size  # stride 2 in conv2
            conv(f"{prefix}.conv1", cin, width, 1, size)
            bn(f"{prefix}.bn1", width)
            conv(f"{prefix}.conv2", width, width, 3, out_size)
            bn(f"{prefix}.bn2", width)
            conv(f"{prefix}.conv3", width, 4 * width, 1, out_size)
            bn(f"{prefix}.bn3", 4 * width)
            if block == 0:
                conv(f"{prefix}.downsample.0", cin, 4 * width, 1, out_size)
                bn(f"{prefix}.downsample.1", 4 * width)
            cin, size = 4 * width, out_size
    grads.append(Gradient("fc.weight", 1000 * 2048, 2.0 * 2048 * 1000))
    grads.append(Gradient("fc.bias", 1000, 0.0))
    return tuple(grads)


def bert_large_gradients(batch=BERT_BATCH, seq=BERT_SEQ, masked=BERT_MASKED) -> tuple:
    """Return BertForPreTraining's (BERT-large: 24 layers, hidden 1024) parameters in order.

    The MLM decoder shares the word embeddings, so that gradient is complete only when the
    embedding lookup's backward ends: last. The decoder's FLOPs (on the masked tokens) are
    charged to its bias, the first gradient of the backward pass.
    """
    hidden, ffn, layers, vocab = 1024, 4096, 24, 30522
    tokens = batch * seq
    grads = []

    def dense(name, cin, cout, n=tokens):
        grads.append(Gradient(f"{name}.weight", cout * cin, 2.0 * n * cin * cout))
        grads.append(Gradient(f"{name}.bias", cout, 0.0))

    def norm(name):
        grads.append(Gradient(f"{name}.weight", hidden, 0.0))
        grads.append(Gradient(f"{name}.bias", hidden, 0.0))

    grads.append(Gradient("embeddings.word_embeddings.weight", vocab * hidden, 0.0))
    grads.append(Gradient("embeddings.position_embeddings.weight", 512 * hidden, 0.0))
    grads.append(Gradient("embeddings.token_type_embeddings.weight", 2 * hidden, 0.0))
    norm("embeddings.LayerNorm")
    attention_flops = 2 * 2.0 * batch * seq * seq * hidden  # QK^T and the weighted sum of V
    for i in range(layers):
        p = f"encoder.layer.{i}"
        dense(f"{p}.attention.self.query", hidden, hidden)
        grads[-2] = dataclasses.replace(grads[-2], flops=grads[-2].flops + attention_flops)
        dense(f"{p}.attention.self.key", hidden, hidden)
        dense(f"{p}.attention.self.value", hidden, hidden)
        dense(f"{p}.attention.output.dense", hidden, hidden)
        norm(f"{p}.attention.output.LayerNorm")
        dense(f"{p}.intermediate.dense", hidden, ffn)
        dense(f"{p}.output.dense", ffn, hidden)
        norm(f"{p}.output.LayerNorm")
    dense("pooler.dense", hidden, hidden, n=batch)
    grads.append(Gradient("cls.predictions.bias", vocab, 2.0 * batch * masked * hidden * vocab))
    dense("cls.predictions.transform.dense", hidden, hidden, n=batch * masked)
    norm("cls.predictions.transform.LayerNorm")
    dense("cls.seq_relationship", hidden, 2, n=batch)
    return tuple(grads)


def bert_step_us(grads: tuple) -> float:
    """Return BERT-large's step time: 3x the forward FLOPs at BERT_MFU of the H100's BF16 peak."""
    return 3 * sum(g.flops for g in grads) / (BERT_MFU * H100_BF16_TFLOPS * 1e12) * 1e6


def workloads() -> list:
    bert = bert_large_gradients()
    return [
        Workload("ResNet-50 (batch 64)", resnet50_gradients(), RESNET50_STEP_MS * 1e3),
        Workload("BERT-large (batch 64 x 128)", bert, bert_step_us(bert)),
    ]


# --- The backward timeline ---------------------------------------------------------------------


def backward_timeline(work: Workload, inputs: Inputs, spread: str = "flops") -> list:
    """Return [(bytes, ready_us)] in backward order, times from the backward pass's start.

    Gradients become ready in reverse registration order; each at the end of its share of the
    backward time, shared by FLOPs (`spread="flops"`) or equally (`"uniform"`). The last is ready
    when the backward pass ends.
    """
    order = work.gradients[::-1]
    backward = backward_us(work, inputs)
    weights = [g.flops for g in order] if spread == "flops" else [1.0] * len(order)
    total, done, out = sum(weights), 0.0, []
    for g, w in zip(order, weights):
        done += w
        out.append((g.numel * FLOAT32, backward * done / total))
    return out


def backward_us(work: Workload, inputs: Inputs) -> float:
    return work.step_us * inputs.step_scale * min(1.0, inputs.backward_fraction)


# --- Costs -------------------------------------------------------------------------------------


def allreduce_us(nbytes: float, cluster: Cluster, inputs: Inputs) -> float:
    """Return NCCL's all-reduce time for one buffer: latency + bytes over the bus bandwidth.

    Inside a node, 2(n-1)/n of the buffer crosses each GPU's NVLink (nccl-tests' busbw). Across
    k nodes each node's NICs carry at least 2(k-1)/k of it, at their summed bandwidth; the
    slower of the two stages bounds the pipelined whole.
    """
    n = cluster.ranks
    if n == 1 or nbytes == 0:
        return 0.0
    g = min(n, cluster.gpus_per_node)
    intra = 2 * (g - 1) / g * nbytes / (inputs.nvlink_busbw_gbps * 1e3) if g > 1 else 0.0
    k = cluster.nodes
    if k == 1:
        return inputs.nccl_latency_node_us + intra
    inter = 2 * (k - 1) / k * nbytes / (cluster.nics_per_node * inputs.nic_busbw_gbps * 1e3)
    return inputs.nccl_latency_nodes_us + max(intra, inter)


def copy_us(nbytes: float, passes: int, inputs: Inputs) -> float:
    """Return the device time of `passes` copies of `nbytes` (fusion buffer, DDP bucket)."""
    return passes * nbytes / (inputs.device_copy_gbps * 1e3)


def negotiation_us(cluster: Cluster, inputs: Inputs) -> float:
    """Return one engine cycle's agreement over MPI (nothing to agree with at one rank)."""
    if cluster.ranks == 1:
        return 0.0
    return inputs.negotiation_node_us if cluster.nodes == 1 else inputs.negotiation_nodes_us


# --- Schedules: when the last all-reduce ends, from the backward pass's start ------------------


def lower_bound_end(timeline: list, cluster: Cluster, inputs: Inputs) -> float:
    """Return the earliest end: each gradient on the links as soon as it is ready, at bandwidth,
    with no latency, host cost or copies. No schedule of buckets or fused buffers that moves the
    same bytes over the same links in turn can end earlier."""
    bare = dataclasses.replace(inputs, nccl_latency_node_us=0.0, nccl_latency_nodes_us=0.0)
    link = 0.0
    for nbytes, ready in timeline:
        link = max(link, ready) + allreduce_us(nbytes, cluster, bare)
    return link


def ddp_buckets(timeline: list, inputs: Inputs) -> list:
    """Return DDP's buckets [(bytes, ready_us, gradients)] as its reducer fills them: gradients in
    backward order join the open bucket, which closes once it holds at least its cap (1 MiB for
    the first, then the bucket cap)."""
    buckets, nbytes, ready, count = [], 0.0, 0.0, 0
    cap = DDP_FIRST_BUCKET_BYTES
    for size, when in timeline:
        nbytes, ready, count = nbytes + size, when, count + 1
        if nbytes >= cap:
            buckets.append((nbytes, ready, count))
            nbytes, count, cap = 0.0, 0, inputs.ddp_bucket_bytes
    if count:
        buckets.append((nbytes, ready, count))
    return buckets


def ddp_end(timeline: list, cluster: Cluster, inputs: Inputs) -> float:
    """Return DDP's end: a bucket is launched (one NCCL call) once its last gradient's hook ran;
    one stream copies it in and all-reduces it; all buckets are copied back at the end."""
    host = stream = total = 0.0
    for nbytes, ready, _ in ddp_buckets(timeline, inputs):
        host = max(host, ready + inputs.ddp_hook_us) + inputs.nccl_call_us
        stream = (
            max(stream, host) + copy_us(nbytes, 1, inputs) + allreduce_us(nbytes, cluster, inputs)
        )
        total += nbytes
    return stream + copy_us(total, DDP_COPY_PASSES - 1, inputs)


def horovodlite_end(
    timeline: list, cluster: Cluster, inputs: Inputs, request_us: float, host_waits: bool
) -> float:
    """Return horovodlite's end, averaged over CYCLE_PHASES phases of the engine's cycle against
    the backward pass (where its cycles fall is chance)."""
    return (
        sum(
            _engine_end(timeline, cluster, inputs, request_us, host_waits, phase / CYCLE_PHASES)
            for phase in range(CYCLE_PHASES)
        )
        / CYCLE_PHASES
    )


CYCLE_PHASES = 8


def _engine_end(timeline, cluster, inputs, request_us, host_waits, phase) -> float:
    """Return horovodlite's end for one phase: the engine runs a cycle every `cycle_us` (or as
    soon as the last one finished, if it overran), agrees, and pays `request_us` on the host for
    each request it finds ready; it fuses them into buffers of up to the fusion threshold, each
    copied in, all-reduced and copied out. With `host_waits` (5fa6a9c) the engine waits for
    each buffer's copies and transfer before it goes on; without, they queue on a stream."""
    pending = list(timeline)
    wake = pending[0][1] + phase * inputs.cycle_us
    engine = stream = 0.0
    while pending:
        wake = max(wake, engine)
        batch = [g for g in pending if g[1] <= wake]
        if not batch:  # sleep through the cycles before the next request
            wake = next_cycle(wake, pending[0][1], inputs.cycle_us)
            continue
        pending = pending[len(batch) :]
        host = wake + negotiation_us(cluster, inputs) + len(batch) * request_us
        for nbytes in fusion_buffers([size for size, _ in batch], inputs.fusion_threshold):
            moved = copy_us(nbytes, HVD_COPY_PASSES, inputs) + allreduce_us(nbytes, cluster, inputs)
            if host_waits:
                host = max(host, stream) + moved
                stream = host
            else:
                stream = max(stream, host) + moved
        engine = host
        wake += inputs.cycle_us
    return max(engine, stream)


def next_cycle(wake: float, ready: float, cycle: float) -> float:
    """Return the first cycle at or after `ready`, cycles starting at `wake`."""
    return wake + cycle * math.ceil((ready - wake) / cycle) if cycle else ready


def fusion_buffers(sizes: list, threshold: float) -> list:
    """Return the bytes of each fusion buffer: in order, up to `threshold`; larger ones alone."""
    buffers, current = [], 0.0
    for size in sizes:
        if current and current + size > threshold:
            buffers.append(current)
            current = 0.0
        current += size
    return buffers + [current]


# --- The step ----------------------------------------------------------------------------------


def hvd_as_measured(timeline, cluster, inputs):
    """horovodlite at 5fa6a9c: the measured cost per request; the engine waits for each buffer."""
    return horovodlite_end(timeline, cluster, inputs, inputs.engine_request_us, True)


def hvd_now(timeline, cluster, inputs):
    """horovodlite at bdef7d9: its cost per request as measured on the H200; NCCL and the copies
    queue on streams, so the host does not wait for a buffer (torch transport's _run)."""
    return horovodlite_end(timeline, cluster, inputs, inputs.engine_request_now_us, False)


def hvd_target(timeline, cluster, inputs):
    """The same at issue #38's target: a request costs what torch's NCCL call costs."""
    return horovodlite_end(timeline, cluster, inputs, inputs.target_request_us, True)


def hvd_target_stream(timeline, cluster, inputs):
    """The target cost, and the buffers queued on a stream: the host never waits for them."""
    return horovodlite_end(timeline, cluster, inputs, inputs.target_request_us, False)


CONTENDERS = {
    "lower bound (bandwidth only)": lower_bound_end,
    "DDP (25 MiB buckets)": ddp_end,
    "horovodlite 5fa6a9c (as measured)": hvd_as_measured,
    "horovodlite bdef7d9 (as measured, H200)": hvd_now,
    "horovodlite, issue #38 target cost": hvd_target,
    "target cost, host never waits": hvd_target_stream,
}

CLUSTERS = {
    "8 GPUs (1 node)": Cluster(8),
    "64 GPUs (8 nodes x 8 NICs)": Cluster(64, nics_per_node=8),
    "64 GPUs (8 nodes x 1 NIC)": Cluster(64, nics_per_node=1),
}


def step_us(work: Workload, end_us: float, inputs: Inputs) -> float:
    """Return the step: forward and optimizer, then the later of backward's end and `end_us`."""
    step = work.step_us * inputs.step_scale
    backward = backward_us(work, inputs)
    return step - backward + max(backward, end_us)


def efficiency(
    work: Workload, contender: str, cluster: Cluster, inputs: Inputs, spread="flops"
) -> float:
    """Return one GPU's step time over `cluster`'s (1.0: perfect scaling)."""
    if cluster.ranks == 1:
        return 1.0  # one rank reduces nothing (train.log: 1.003x with the optimizer wrapper)
    timeline = backward_timeline(work, inputs, spread)
    end = CONTENDERS[contender](timeline, cluster, inputs)
    return work.step_us * inputs.step_scale / step_us(work, end, inputs)


def predict(inputs: Inputs = Inputs(), spread="flops") -> dict:
    """Return {workload: {contender: {cluster: efficiency}}}."""
    return {
        w.name: {
            c: {k: efficiency(w, c, cl, inputs, spread) for k, cl in CLUSTERS.items()}
            for c in CONTENDERS
        }
        for w in workloads()
    }


# The workload's own inputs; the others are costs of the system.
WORKLOAD_INPUTS = ("step_scale", "backward_fraction")
SENSITIVE = tuple(f.name for f in dataclasses.fields(Inputs))


def sensitivity(inputs: Inputs = Inputs()) -> dict:
    """Return {workload: {contender: {cluster: {"base": e, input: (e at 0.5x, e at 2x)}}}}."""
    base = predict(inputs)
    out = {
        w: {c: {k: {"base": e} for k, e in by_cluster.items()} for c, by_cluster in by_c.items()}
        for w, by_c in base.items()
    }
    for field in SENSITIVE:
        value = getattr(inputs, field)
        low = predict(dataclasses.replace(inputs, **{field: value / 2}))
        high = predict(dataclasses.replace(inputs, **{field: value * 2}))
        for w, by_contender in out.items():
            for c, by_cluster in by_contender.items():
                for k, cell in by_cluster.items():
                    cell[field] = (low[w][c][k], high[w][c][k])
    return out


def ranked(cell: dict, costs_only: bool = False) -> list:
    """Return [(swing, input, e at 0.5x, e at 2x)], the input that moves efficiency most first."""
    rows = [
        (max(abs(lo - cell["base"]), abs(hi - cell["base"])), field, lo, hi)
        for field, value in cell.items()
        if field != "base" and not (costs_only and field in WORKLOAD_INPUTS)
        for lo, hi in [value]
    ]
    return sorted(rows, reverse=True)


def report(table: dict, sens: dict) -> str:
    """Return the predicted table and, per cell, the inputs that move it most, as text."""
    lines, width = [], max(len(c) for c in CONTENDERS)
    for w in workloads():
        params = sum(g.numel for g in w.gradients)
        lines += [
            f"\n{w.name}: {len(w.gradients)} gradients, {params / 1e6:.1f} M parameters, "
            f"{params * FLOAT32 / 1e6:.0f} MB; step {w.step_us / 1e3:.1f} ms on one H100",
            f"{'scaling efficiency':{width}}  " + "  ".join(f"{k:>26}" for k in CLUSTERS),
        ]
        for c in CONTENDERS:
            cells = "  ".join(f"{table[w.name][c][k]:>26.3f}" for k in CLUSTERS)
            lines.append(f"{c:{width}}  {cells}")
        lines.append(
            "halving or doubling one input, efficiency at 0.5x / 2x: the step time, then the two"
            " costs that move it most"
        )
        for c in CONTENDERS:
            for k in CLUSTERS:
                cell = sens[w.name][c][k]
                top = [row for row in ranked(cell, costs_only=True)[:2] if row[0] >= 0.0005]
                moved = ", ".join(f"{f} {lo:.3f}/{hi:.3f}" for _, f, lo, hi in top) or "none"
                lo, hi = cell["step_scale"]
                lines.append(f"  {c}, {k}: step {lo:.3f}/{hi:.3f}; {moved}")
    lines.append(
        "\npublished, for comparison: Horovod, 90% at 512 GPUs for ResNet-101 and Inception V3 "
        "(68% VGG-16; 128 servers x 4 Pascal GPUs, 25 Gbit/s RoCE; Horovod's README)"
    )
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="write the inputs, predictions and sensitivity as JSON")
    args = parser.parse_args(argv)
    inputs = Inputs()
    table, sens = predict(inputs), sensitivity(inputs)
    print(report(table, sens))
    if args.out:
        record = {
            "note": "a model, not a measurement: docs/gpu.md#past-one-gpu-on-paper",
            "measured": {
                "run": "2026-11-27, one H100 80GB HBM3, horovodlite 5fa6a9c",
                "resnet50_step_ms": RESNET50_STEP_MS,
                "hvd_fused_161_ms": HVD_FUSED_161_MS,
                "hvd_one_buffer_ms": HVD_ONE_BUFFER_MS,
                "nccl_async_161_ms": NCCL_ASYNC_161_MS,
                "device_copy_gbps": DEVICE_COPY_GBPS,
                "now": "2026-11-27, one H200, horovodlite bdef7d9",
                "now_fused_161_ms": NOW_FUSED_161_MS,
                "now_one_buffer_ms": NOW_ONE_BUFFER_MS,
            },
            "inputs": dataclasses.asdict(inputs),
            "workloads": {
                w.name: {
                    "gradients": len(w.gradients),
                    "parameters": sum(g.numel for g in w.gradients),
                    "step_ms": w.step_us / 1e3,
                }
                for w in workloads()
            },
            "clusters": {k: dataclasses.asdict(c) for k, c in CLUSTERS.items()},
            "efficiency": table,
            "efficiency_uniform_spread": predict(inputs, spread="uniform"),
            "sensitivity_half_double": sens,
        }
        path = pathlib.Path(args.out)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(record, indent=1) + "\n")
        print(f"\nwrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
