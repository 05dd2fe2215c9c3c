"""Pipeline parallelism: an nn.Sequential cut into stages on consecutive ranks, trained by GPipe
or 1F1B over MPI point-to-point messages, with data parallelism across pipeline replicas.

The schedules, the balance and the checks are framework-free (horovodlite.training.
pipeline_schedule); this module runs them on tensors. Activations go forward and gradients
backward as non-blocking messages on the pipeline's own Channel (horovodlite.training.
point_to_point), so they can never match a collective's. Receives are posted a few operations
ahead, and sends are waited for at the start of the next step (long complete by then), so
transfers overlap compute and no stage waits at the end of a step for a neighbour that is still
computing. Every wait is the channel's: it honours HOROVODLITE_COLLECTIVE_TIMEOUT and notices
ranks that left.
"""

import pickle
import time

import numpy as np

import horovodlite as core
import torch
from horovodlite.agreement import digest
from horovodlite.process_sets import add_process_set, global_process_set
from horovodlite.training import pipeline_schedule as plan
from horovodlite.training.point_to_point import Channel

from .functions import allgather_object

__all__ = ["Pipeline"]

_SPEC, _ACTIVATION, _GRADIENT = 1, 2, 3  # message tags on the pipeline's own communicator
_SPEC_BYTES = 1 << 16  # room for one pickled spec: shapes and dtypes of a stage's outputs
_RESERVED = {"stages", "chunks", "schedule", "checkpoint", "stage", "replica", "balance",
             "pipeline_set", "data_parallel_set", "last_step"}  # fmt: skip
_SETS: dict = {}  # (size, stages) -> (pipeline set, data-parallel set, Channel)


class Pipeline(torch.nn.Module):
    """Run `module` (an nn.Sequential) as a pipeline of stages over the ranks.

    Every rank passes the same model and arguments. With `stages` < size, size / stages
    pipelines of consecutive ranks are formed; rank r is stage r % stages of replica
    r // stages. A rank keeps only its stage's layers, under their names in `module`.

    Args:
        module: the model, an nn.Sequential, the same on every rank.
        chunks: micro-batches per batch.
        schedule: "1f1b" (at most `stages` micro-batches of activations held) or "gpipe".
        stages: stages per pipeline (default: every rank is one stage); must divide the size.
        balance: layers per stage (default: balanced by parameter count).
        checkpoint: recompute each stage's forward during backward instead of keeping its
            activations (only its input is kept).

    Raises:
        TypeError, ValueError: a bad argument, on every rank, before any other message.
    """

    def __init__(self, module, chunks: int, schedule: str = "1f1b", stages=None, balance=None,
                 checkpoint: bool = False):  # fmt: skip
        super().__init__()
        size, rank = core.size(), core.rank()
        error, layers, counts = None, [], []
        try:
            layers, stages, counts = _check_arguments(
                module, chunks, schedule, stages, balance, checkpoint, size
            )
        except (TypeError, ValueError) as e:
            error = e
        arguments = (chunks, schedule, stages, counts, bool(checkpoint), [n for n, _ in layers])
        _raise_everywhere(error, digest({"pipeline": repr(arguments)}), global_process_set)
        where = plan.layout(rank, size, stages)
        self.stages, self.chunks, self.schedule = stages, chunks, schedule
        self.checkpoint = checkpoint
        self.stage, self.replica, self.balance = where.stage, where.replica, counts
        self.pipeline_set, self.data_parallel_set, self._channel = _process_sets(where, size)
        first, stop = plan.stage_bounds(counts)[self.stage]
        for name, layer in layers[first:stop]:
            self.add_module(name, layer)
        self._ops = plan.schedule(schedule, stages, chunks, self.stage)
        self._specs: dict = {}  # step key -> (spec received, spec sent)
        self.last_step: dict = {}  # timings of the last step (benchmarks/pipeline.py)
        self._sends: list = []  # Transfers (each keeps its tensor alive until sent), across steps
        self._waited, self._peak = 0.0, 0

    @property
    def is_first(self) -> bool:
        return self.stage == 0

    @property
    def is_last(self) -> bool:
        return self.stage == self.stages - 1

    def forward(self, x):
        """Run this rank's layers on `x` (one stage, no messages)."""
        for layer in self._modules.values():
            x = layer(x)
        return x

    def train_step(self, inputs, targets, loss_fn) -> float:
        """Run forward and backward over `chunks` micro-batches; return the batch's mean loss.

        The gradient of the mean loss over the whole batch is added to each parameter's `.grad`
        (`loss_fn(output, target)` must give a micro-batch's mean). The first stage needs
        `inputs` and the last `targets`; the others may pass None. Every rank of the pipeline
        gets the loss.
        """
        start = time.perf_counter()
        losses = self._step(inputs, targets, loss_fn, train=True)
        total = np.array(
            [sum(loss.item() for loss in losses) / self.chunks if self.is_last else 0.0]
        )
        transfer = self._channel.ibcast(total, root=self.stages - 1)
        if self.is_last:  # the others receive it when they finish; no need to wait for them
            self._sends.append(transfer)
        else:
            self._wait(transfer, "the loss")
        self._finish(start)
        return float(total[0])

    def eval_step(self, inputs):
        """Run forward only; return the output on the last stage, None on the others."""
        start = time.perf_counter()
        outputs = self._step(inputs, None, None, train=False)
        self._finish(start)
        if not self.is_last:
            return None
        if isinstance(outputs[0], torch.Tensor):
            return torch.cat(outputs)
        return type(outputs[0])(torch.cat(parts) for parts in zip(*outputs))

    # -- one step ---------------------------------------------------------------------------

    def _step(self, inputs, targets, loss_fn, train: bool) -> list:
        self._waited = 0.0
        # The last step's sends finished long ago (their receivers waited for them); a stage
        # does not wait for them at the end of its step, where the receiver may be computing.
        for transfer in self._sends:
            self._wait(transfer, "a send to finish")
        self._sends = []
        micro, key, input_error = self._agree_batch(inputs, targets, train)
        if input_error is not None:
            raise input_error
        run = _Run(self, train, loss_fn)
        run.targets = _split(targets, micro) if train and self.is_last else None
        run.inputs = _split(inputs, micro) if self.is_first else None
        specs = self._specs.get(key)
        ops = self._ops if train else [op for op in self._ops if op.kind == "F"]
        if specs is None:  # the first step of this shape: F(0) runs alone, telling the next stage
            self._specs[key] = specs = run.first_forward()
            ops = ops[1:]
        run.specs = specs
        run.execute(ops)
        self._peak = run.peak
        return run.results

    def _finish(self, start: float) -> None:
        self._sends = [transfer for transfer in self._sends if not transfer.test()]
        self.last_step = {"step_s": time.perf_counter() - start, "wait_s": self._waited,
                          "peak_in_flight": self._peak}  # fmt: skip

    def _agree_batch(self, inputs, targets, train: bool) -> tuple:
        """Gather what each stage passed; return (micro-batch size, step key, error or None)."""
        own_error = None
        rows = []
        for value in (inputs, targets) if train else (inputs,):
            try:
                rows.append(_rows(value))
            except TypeError as e:
                own_error, rows = own_error or e, [*rows, -3]
        if not train:
            rows.append(-2)
        signature = digest({"inputs": _signature(inputs)}) if rows[0] >= 0 else 0
        table = np.empty((self.stages, 3), dtype=np.int64)
        own = np.array([*rows, signature], np.int64)
        self._wait(self._channel.iallgather(own, table), "a step")
        micro, error = plan.check_batch_table(table[:, :2].tolist(), self.chunks)
        return micro, (train, micro, int(table[0, 2])), own_error or error

    def _wait(self, transfer, what: str) -> float:
        """Wait for `transfer` (the channel's checks); return the seconds waited (also counted)."""
        start = time.perf_counter()
        if not transfer.test():
            transfer.wait(f"pipeline stage {self.stage} waiting for {what}")
        waited = time.perf_counter() - start
        self._waited += waited
        return waited


class _Run:
    """One step's state on one stage: micro-batches in flight, posted receives, pending sends."""

    def __init__(self, pipe: Pipeline, train: bool, loss_fn):
        self.pipe, self.train, self.loss_fn = pipe, train, loss_fn
        self.channel, self.stage = pipe._channel, pipe.stage
        self.inputs = self.targets = self.specs = self.new_spec = None
        self.held: dict = {}  # micro-batch -> (input, received tensors, outputs, loss, RNG state)
        self.receives: dict = {}  # (kind, micro) -> (transfers, tensors)
        self.results: list = []  # losses (train) or outputs (eval) on the last stage
        self.peak = 0
        self.params = [p for p in pipe.parameters() if p.requires_grad]
        self.sums: dict = {}  # parameter -> gradient of the micro-batches before the last
        self.device = next((p.device for p in pipe.parameters()), torch.device("cpu"))

    # -- the first forward: shapes travel, errors are agreed ----------------------------------

    def first_forward(self) -> tuple:
        """Run F(0) stage after stage, sending each output's spec ahead of it; agree on errors."""
        pipe, error, received, sent = self.pipe, None, None, None
        if not pipe.is_first:
            buffer = bytearray(_SPEC_BYTES)
            self._wait(self.channel.irecv(buffer, self.stage - 1, _SPEC), "a spec")
            received = pickle.loads(buffer)
        if isinstance(received, str):  # an earlier stage failed: pass the news on
            sent = received
        else:
            self.specs = (received, None)
            if received is not None:
                self.receives[plan.Op("F", 0)] = self.receive(received[1], self.stage - 1,
                                                              _ACTIVATION)  # fmt: skip
            try:
                outputs = self.forward(0)
                sent = self.new_spec
                if pipe.is_last and self.train:
                    _check_loss(self.held[0][3])
            except Exception as e:  # noqa: BLE001 - any failure here must reach every rank
                error, sent = e, f"stage {self.stage}: {type(e).__name__}: {e}"
        if not pipe.is_last:
            data = pickle.dumps(sent)
            if len(data) > _SPEC_BYTES:  # the next stage must still hear of it
                error = ValueError(
                    f"stage {self.stage}'s output holds too many tensors ({len(sent[1])}) to "
                    f"describe in {_SPEC_BYTES} bytes: return fewer tensors from the stage"
                )
                sent = f"stage {self.stage}: ValueError: {error}"
                data = pickle.dumps(sent)
            pipe._sends.append(self.channel.isend(data, self.stage + 1, _SPEC))
            if error is None and not isinstance(sent, str):
                self.send(_flat(outputs), _ACTIVATION, self.stage + 1)
        _raise_everywhere(error, 0, pipe.pipeline_set)
        return received, sent

    # -- the schedule -------------------------------------------------------------------------

    def execute(self, ops: list) -> None:
        window = max(2, self.pipe.stages)  # receives posted ahead of the operation that needs them
        posted = 0
        for i, op in enumerate(ops):
            while posted < len(ops) and posted <= i + window:
                self.post_receive(ops[posted])
                posted += 1
            if op.kind == "F":
                self.forward(op.micro)
            else:
                self.backward(op.micro)

    def post_receive(self, op) -> None:
        received, sent = self.specs
        if op.kind == "F" and not self.pipe.is_first:
            self.receives[op] = self.receive(received[1], self.stage - 1, _ACTIVATION)
        elif op.kind == "B" and not self.pipe.is_last:
            trained = [spec for spec in sent[1] if spec[2]]
            self.receives[op] = self.receive(trained, self.stage + 1, _GRADIENT)

    def receive(self, specs: list, source: int, tag: int) -> tuple:
        tensors = [torch.empty(shape, dtype=getattr(torch, dtype)) for shape, dtype, _ in specs]
        transfers = [self.channel.irecv(_bytes(t), source, tag) for t in tensors]
        return transfers, tensors

    def arrived(self, op) -> list:
        transfers, tensors = self.receives.pop(op)
        what = f"{'activations' if op.kind == 'F' else 'gradients'} of micro-batch {op.micro}"
        for transfer in transfers:
            self._wait(transfer, what)
        return [t.to(self.device) for t in tensors]

    def send(self, tensors: list, tag: int, dest: int) -> None:
        for tensor in tensors:
            wire = tensor.detach().to("cpu").contiguous()
            # The Transfer keeps the array, a view that keeps `wire` alive until it is sent.
            self.pipe._sends.append(self.channel.isend(_bytes(wire), dest, tag))

    def _wait(self, transfer, what: str) -> float:
        return self.pipe._wait(transfer, what)

    def forward(self, m: int):
        pipe = self.pipe
        if pipe.is_first:
            x = self.inputs[m]
            stage_inputs = []
        else:
            stage_inputs = self.arrived(plan.Op("F", m))
            shaped, specs = self.specs[0]
            for tensor, (_, _, grad) in zip(stage_inputs, specs):
                tensor.requires_grad_(grad and self.train)
            x = tuple(stage_inputs) if shaped == "tuple" else stage_inputs[0]
        # Checkpointing keeps only the stage's input and the RNG state, and runs the forward
        # again in backward. The first forward of a shape keeps its graph: it tells the next
        # stage which outputs need gradients.
        recompute = self.train and pipe.checkpoint and self.specs[1] is not None
        rng = _rng_state(self.device) if recompute else None
        with torch.set_grad_enabled(self.train and not recompute):
            outputs = pipe.forward(x)
            if self.specs[1] is None:  # the first forward of this shape: check the output
                self.new_spec = _spec(outputs, self.stage)
            loss = self.loss_fn(outputs, self.targets[m]) if pipe.is_last and self.train else None
        flat = _flat(outputs)
        if pipe.is_last:
            self.results.append(outputs if loss is None else loss.detach())
        elif self.specs[1] is not None:  # F(0) of a new shape sends its spec first
            self.send(flat, _ACTIVATION, self.stage + 1)
        if self.train:
            self.held[m] = (x, stage_inputs, None if recompute else flat, loss, rng)
            self.peak = max(self.peak, len(self.held))
        return outputs

    def backward(self, m: int) -> None:
        pipe = self.pipe
        x, stage_inputs, outputs, loss, rng = self.held.pop(m)
        if rng is not None:  # checkpointed: the forward again, now recording the graph
            with torch.random.fork_rng(_cuda(self.device)), torch.enable_grad():
                _set_rng_state(self.device, rng)
                result = pipe.forward(x)
                outputs = _flat(result)
                if pipe.is_last:
                    loss = self.loss_fn(result, self.targets[m])
        if pipe.is_last:
            roots, grads = [loss / pipe.chunks], None
        else:
            roots = [t for t, spec in zip(outputs, self.specs[1][1]) if spec[2]]
            grads = self.arrived(plan.Op("B", m))
        wanted = [t for t in stage_inputs if t.requires_grad]
        if roots and (self.params or wanted):
            self.backpropagate(roots, grads, wanted, last=m == pipe.chunks - 1)
        if wanted:
            self.send([_zeros_if_none(t.grad, t) for t in wanted], _GRADIENT, self.stage - 1)

    def backpropagate(self, roots: list, grads, wanted: list, last: bool) -> None:
        """Add the parameters' gradients of one micro-batch; leave the inputs' in their .grad.

        Until the last micro-batch they are summed aside (torch.autograd.grad), so a
        DistributedOptimizer's hooks, which start each gradient's all-reduce once backward has
        accumulated it, fire once per step, during the last micro-batch's backward.
        """
        if not last:
            found = torch.autograd.grad(roots, self.params + wanted, grads, allow_unused=True)
            for param, grad in zip(self.params, found):
                if grad is not None:
                    held = self.sums.get(param)
                    # Out of place: autograd may hand one tensor to several parameters (a + b).
                    self.sums[param] = grad if held is None else held + grad
            for tensor, grad in zip(wanted, found[len(self.params) :]):
                tensor.grad = grad
            return
        seen = set()
        with torch.no_grad():
            for param, held in self.sums.items():
                if param.grad is not None:
                    param.grad.add_(held)
                else:  # backward adds into .grad in place: no two parameters may share one
                    param.grad = held.clone() if id(held) in seen else held
                    seen.add(id(held))
        torch.autograd.backward(roots, grads, inputs=self.params + wanted)


# -- helpers ----------------------------------------------------------------------------------


def _check_arguments(module, chunks, schedule, stages, balance, checkpoint, size) -> tuple:
    if not isinstance(module, torch.nn.Sequential):
        raise TypeError(
            f"Pipeline needs an nn.Sequential, got {type(module).__name__}: write the model as "
            "torch.nn.Sequential(layer, layer, ...) so that it can be cut between layers"
        )
    layers = list(module.named_children())
    clashing = [name for name, _ in layers if hasattr(Pipeline, name) or name in _RESERVED]
    if clashing:
        raise ValueError(f"layer names {clashing} clash with Pipeline's attributes: rename them")
    plan.schedule(schedule, 1, chunks, 0)  # checks both
    if not isinstance(checkpoint, bool):
        raise TypeError(f"checkpoint must be a bool, got {type(checkpoint).__name__}")
    stages = plan.check_stages(stages, size, len(layers))
    if balance is None:
        sizes = [sum(p.numel() for p in layer.parameters()) for _, layer in layers]
        counts = plan.balance_by_size(sizes, stages)
    else:
        counts = plan.check_balance(balance, len(layers), stages)
    return layers, stages, counts


def _raise_everywhere(error, fields_digest: int, process_set) -> None:
    """Raise on every rank of `process_set` if any rank found an error or passed other fields."""
    own = None if error is None else (_kind(error), f"{type(error).__name__}: {error}")
    reports = allgather_object((own, fields_digest), name="pipeline.check", process_set=process_set)
    ranks = process_set.ranks if process_set.process_set_id != 0 else list(range(core.size()))
    failed = [(ranks[i], report) for i, (report, _) in enumerate(reports) if report is not None]
    if error is not None:
        raise error
    if failed:
        rank, (kind, text) = failed[0]
        raise _KINDS[kind](f"rank {rank} failed: {text}")
    if len({d for _, d in reports}) > 1:
        raise ValueError(
            "the ranks passed different arguments to Pipeline (chunks, schedule, stages, balance, "
            "checkpoint or the model's layers): pass the same on every rank"
        )


_KINDS = {"type": TypeError, "value": ValueError, "other": core.HorovodLiteError}


def _kind(error: Exception) -> str:
    return "type" if isinstance(error, TypeError) else "value" if isinstance(
        error, ValueError) else "other"  # fmt: skip


def _process_sets(where: plan.Layout, size: int) -> tuple:
    """Return (pipeline set, data-parallel set, the pipeline's own Channel) for this rank.

    Every rank registers every set, in the same order. One layout's sets are made once per
    init() (the channel says whether its init() is still the job's) and shared by the pipelines
    that use it.
    """
    stages = len(where.pipeline_ranks)
    key = (size, stages)
    found = _SETS.get(key)
    if (
        found is not None
        and found[2].current
        and all(s.process_set_id is not None for s in found[:2])
    ):
        return found
    pipelines = [global_process_set] if stages == size else [
        add_process_set(list(r)) for r in where.all_pipelines]  # fmt: skip
    parallel = [global_process_set] if stages == 1 else [
        add_process_set(list(r)) for r in where.all_data_parallel]  # fmt: skip
    pipeline_set = pipelines[0 if stages == size else where.replica]
    parallel_set = parallel[0 if stages == 1 else where.stage]
    _SETS[key] = found = (pipeline_set, parallel_set, Channel(pipeline_set))
    return found


def _rows(value) -> int:
    """Return the rows of a tensor or of a tuple of tensors with equal rows (-1 for None)."""
    if value is None:
        return -1
    tensors = _flat(value)
    if any(t.dim() == 0 for t in tensors) or len({t.shape[0] for t in tensors}) != 1:
        raise TypeError(
            "expected a tensor or a tuple of tensors with the same number of rows (dimension 0), "
            f"got {_describe(value)}"
        )
    return tensors[0].shape[0]


def _flat(value) -> list:
    if isinstance(value, torch.Tensor):
        return [value]
    if (
        isinstance(value, (tuple, list))
        and value
        and all(isinstance(t, torch.Tensor) for t in value)
    ):
        return list(value)
    raise TypeError(f"expected a tensor or a tuple of tensors, got {_describe(value)}")


def _describe(value) -> str:
    if isinstance(value, (tuple, list)):
        return f"{type(value).__name__} of ({', '.join(type(v).__name__ for v in value)})"
    return type(value).__name__


def _signature(value) -> tuple:
    return tuple((tuple(t.shape[1:]), str(t.dtype)) for t in _flat(value)) + (
        isinstance(value, torch.Tensor),
    )


def _split(value, micro: int) -> list:
    if isinstance(value, torch.Tensor):
        return list(value.split(micro))
    return [type(value)(parts) for parts in zip(*(t.split(micro) for t in value))]


def _spec(outputs, stage: int) -> tuple:
    """Describe a stage's output for the next stage: ("tensor"|"tuple", [(shape, dtype, grad)])."""
    try:
        flat = _flat(outputs)
    except TypeError:
        raise TypeError(
            f"stage {stage} returned {_describe(outputs)}: a stage's output (the output of its "
            "last layer) must be a tensor or a tuple of tensors, which are what can travel"
        ) from None
    shaped = "tensor" if isinstance(outputs, torch.Tensor) else "tuple"
    return shaped, [(tuple(t.shape), str(t.dtype).split(".")[1], t.requires_grad) for t in flat]


def _check_loss(loss) -> None:
    if not isinstance(loss, torch.Tensor) or loss.numel() != 1 or not loss.requires_grad:
        raise TypeError(
            f"loss_fn must return a scalar tensor that requires grad, got {_describe(loss)}"
            + (f" of shape {tuple(loss.shape)}" if isinstance(loss, torch.Tensor) else "")
        )


def _bytes(tensor: torch.Tensor) -> np.ndarray:
    """Return a contiguous CPU tensor's memory as a uint8 array (any dtype, bfloat16 too)."""
    return tensor.view(-1).view(torch.uint8).numpy()


def _cuda(device: torch.device) -> list:
    return [device] if device.type == "cuda" else []


def _rng_state(device: torch.device) -> tuple:
    cuda = torch.cuda.get_rng_state(device) if device.type == "cuda" else None
    return torch.get_rng_state(), cuda


def _set_rng_state(device: torch.device, state: tuple) -> None:
    torch.set_rng_state(state[0])
    if state[1] is not None:
        torch.cuda.set_rng_state(state[1], device)


def _zeros_if_none(grad, like):
    return torch.zeros_like(like) if grad is None else grad
