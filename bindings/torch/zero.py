"""ZeroOptimizer: ZeRO stages 1 and 2, the optimizer state (and gradients) sharded over the ranks.

Each rank's wrapped optimizer holds *shard parameters*: views into the model's parameters of the
elements that rank owns (horovodlite.training.sharding), so its state is about 1/n of the whole
and its step writes the owned elements in place. Gradients are averaged per bucket as backward
produces them: all-reduced (stage 1, every rank keeps full gradients) or reduce-scattered
(stage 2, a rank keeps only its chunk). After the step, the buckets' chunks are all-gathered
into every rank's parameters.
"""

import collections
import math

import horovodlite as core
import torch
from horovodlite.plan import run_now
from horovodlite.process_sets import global_process_set
from horovodlite.tensor_plans import tensor_allgather_into_plan
from horovodlite.training import ReductionSettings
from horovodlite.training.optimizer_checks import accumulated_too_often, parameter_names
from horovodlite.training.sharding import plan_buckets

from .compression import Compression
from .functions import allgather_object
from .mpi_ops import allreduce, allreduce_async_, reducescatter_async, synchronize
from .optimizer import Wrapper, check_unwrapped
from .tensors import TORCH_TENSORS, TensorView

__all__ = ["ZeroOptimizer"]

# Optimizers whose update of an element depends on that element's gradient and state alone:
# updating a slice gives the slice of the full update. (LBFGS, or Muon's whole-matrix updates,
# need the whole parameter.)
ELEMENTWISE = (
    torch.optim.SGD, torch.optim.Adam, torch.optim.AdamW, torch.optim.Adamax, torch.optim.NAdam,
    torch.optim.RAdam, torch.optim.RMSprop, torch.optim.Adagrad, torch.optim.Adadelta,
    torch.optim.Rprop, torch.optim.ASGD,
)  # fmt: skip
_BUCKET_BYTES = 25 * 1024 * 1024  # as DDP's bucket_cap_mb: large enough to fill the wire


class _ZeroMixin(Wrapper):
    """Methods that a ZeroOptimizer adds in front of the wrapped optimizer's class."""

    _hvd_wrapper = "ZeroOptimizer"

    def _zero_setup(self, *, names: dict, stage: int, settings, bucket_bytes: int) -> None:
        self._zero_stage, self._zero_settings = stage, settings
        process_set = settings.process_set
        groups = self.param_groups
        self._zero_group_sizes = [len(g["params"]) for g in groups]  # the unsharded layout
        self._zero_params = [p for group in groups for p in group["params"]]
        self._zero_names = names
        _check_same_model(self._zero_params, names, process_set)
        trained = [i for i, p in enumerate(self._zero_params) if p.requires_grad]
        sizes = [p.numel() for p in self._zero_params]
        # Buckets in reverse order, roughly the order in which backward produces gradients.
        order = trained[::-1]
        plans = plan_buckets(
            [sizes[i] for i in order],
            [(self._zero_params[i].dtype, self._zero_params[i].device) for i in order],
            [self._zero_params[i].element_size() for i in order],
            bucket_bytes,
            process_set.size(),
        )
        self._zero_buckets = [_remap(b, order) for b in plans]
        self._zero_bucket_of = {p: b for b, bucket in enumerate(self._zero_buckets)
                                for p in bucket.params}  # fmt: skip
        # Each bucket's parameters live in one flat buffer (their .data become views of it), so
        # a rank's chunk is one contiguous slice to send, and the gathered bucket lands in place.
        self._zero_flat = [_flatten([self._zero_params[i] for i in b.params], b.numel)
                           for b in self._zero_buckets]  # fmt: skip
        self._zero_grad_flat = {}  # stage 1: bucket -> its gradient buffer, kept across steps
        # This rank's shard: a view of each owned run of elements, as a parameter of its own.
        rank = process_set.rank()
        self._zero_pieces = [b.pieces(rank, sizes) for b in self._zero_buckets]
        self._zero_shard = {}  # (bucket, piece index) -> shard parameter
        self._zero_piece_of = {}  # id(shard parameter) -> its piece
        shards_of = collections.defaultdict(list)  # parameter index -> its shard parameters
        for b, pieces in enumerate(self._zero_pieces):
            for k, piece in enumerate(pieces):
                full = self._zero_params[piece.param]
                view = full.detach().view(-1)[piece.start : piece.stop]
                shard = torch.nn.Parameter(view, requires_grad=True)
                self._zero_shard[b, k] = shard
                self._zero_piece_of[id(shard)] = piece
                shards_of[piece.param].append(shard)
        index = {p: i for i, p in enumerate(self._zero_params)}
        self.param_groups = [
            {**{k: v for k, v in group.items() if k != "params"},
             "params": [s for p in group["params"] for s in shards_of[index[p]]]}
            for group in groups
        ]  # fmt: skip
        self.state = collections.defaultdict(dict)
        self._zero_counts = {i: 0 for i in trained}
        self._zero_ready = collections.defaultdict(set)  # bucket -> parameters whose grad is ready
        self._zero_pending = {}  # bucket -> (handle, wire, ctx, flat)
        self._zero_reduced = {}  # bucket -> the reduced gradients this rank steps with
        self._zero_synchronized = False
        self._zero_missing = set()  # on one rank: parameters without a gradient this step
        self._zero_had = set()  # parameters that have had a gradient (one rank's skip rule)
        self._zero_fresh = {}  # bucket -> gradient buffer zero_grad() gave its parameters
        self._zero_none = True  # whether the last zero_grad() was set_to_none
        self._zero_hooks = [
            self._zero_params[i].register_post_accumulate_grad_hook(
                lambda _, i=i: self._zero_gradient_ready(i)
            )
            for i in trained
        ]

    # -- gradients ----------------------------------------------------------------------------

    def _zero_gradient_ready(self, param: int) -> None:
        bucket = self._zero_bucket_of[param]
        if bucket in self._zero_pending:
            passes = self._zero_settings.backward_passes_per_step
            raise accumulated_too_often(self._zero_names[param], passes)
        self._zero_synchronized = False
        self._zero_had.add(param)
        self._zero_counts[param] += 1
        if self._zero_counts[param] == self._zero_settings.backward_passes_per_step:
            ready = self._zero_ready[bucket]
            ready.add(param)
            if len(ready) == len(self._zero_buckets[bucket].params):
                self._zero_submit(bucket)

    def _zero_submit(self, b: int) -> None:
        self._zero_ready.pop(b, None)
        bucket, settings = self._zero_buckets[b], self._zero_settings
        flat = self._zero_fresh.pop(b, None)
        if flat is not None:
            pass  # the gradients are views of it already (zero_grad())
        elif self._zero_stage == 1:  # full gradients stay: the same buffer every step
            flat = self._zero_grad_flat.get(b)
            if flat is None:
                flat = self._zero_grad_flat[b] = torch.empty_like(self._zero_flat[b])
        else:  # only while the reduce-scatter runs
            flat = torch.empty_like(self._zero_flat[b])
        alone = settings.process_set.size() == 1
        for param, offset in zip(bucket.params, bucket.offsets):
            full = self._zero_params[param]
            part = flat[offset : offset + full.numel()]
            grad = full.grad
            view = grad is not None and grad.data_ptr() == part.data_ptr()
            if grad is None or (view and self._zero_counts[param] == 0):
                # No gradient this step: take part with zeros. On one rank, as a plain
                # optimizer (and DistributedOptimizer there), step() skips the parameter unless
                # zero_grad(set_to_none=False) would have left it a zero gradient.
                if grad is None:
                    part.zero_()
                if alone and (grad is None or self._zero_none or param not in self._zero_had):
                    self._zero_missing.add(param)
            elif grad.is_sparse:
                raise TypeError(
                    f"ZeroOptimizer needs dense gradients, but {self._zero_names[param]!r} has a "
                    "sparse one: use nn.Embedding(sparse=False), or DistributedOptimizer"
                )
            elif not view:  # a gradient autograd made (no zero_grad() before backward)
                part.copy_(grad.view(-1))
            if self._zero_stage == 2:
                full.grad = None  # stage 2 keeps only this rank's chunk of the gradients
        wire, ctx = settings.compression.compress(flat)
        name = f"zero.bucket.{b}"
        if self._zero_stage == 1:
            handle = allreduce_async_(wire, name=name, op=core.Average,
                                      process_set=settings.process_set)  # fmt: skip
        else:
            handle = reducescatter_async(wire, name=name, op=core.Average,
                                         process_set=settings.process_set)  # fmt: skip
        self._zero_pending[b] = (handle, wire, ctx, flat)

    def synchronize(self) -> None:
        """Wait for every bucket's reduction (submitting those backward did not finish).

        Afterwards each shard parameter's `.grad` is its averaged gradient (and, at stage 1,
        every parameter's `.grad` the full averaged gradient).
        """
        if self._zero_synchronized:  # and no backward() since
            return
        for b in range(len(self._zero_buckets)):
            if b not in self._zero_pending:
                self._zero_submit(b)
        decompress = self._zero_settings.compression.decompress
        for b, (handle, wire, ctx, _) in sorted(self._zero_pending.items()):
            result = synchronize(handle)
            bucket = self._zero_buckets[b]
            if self._zero_stage == 1:
                reduced = decompress(wire, ctx)
                for param, offset in zip(bucket.params, bucket.offsets):
                    full = self._zero_params[param]
                    full.grad = reduced[offset : offset + full.numel()].view_as(full)
                lo, hi = bucket.bounds[self._zero_settings.process_set.rank()]
                mine = reduced[lo:hi]
            else:
                mine = decompress(result, ctx)
            self._zero_reduced[b] = reduced if self._zero_stage == 1 else mine
            for k, piece in enumerate(self._zero_pieces[b]):
                if piece.param not in self._zero_missing:
                    grad = mine[piece.offset : piece.offset + piece.numel]
                    self._zero_shard[b, k].grad = grad
        self._zero_missing.clear()
        self._zero_pending.clear()
        self._zero_ready.clear()
        for param in self._zero_counts:
            self._zero_counts[param] = 0
        self._zero_synchronized = True

    def clip_grad_norm_(self, max_norm: float, norm_type: float = 2.0) -> torch.Tensor:
        """Scale the averaged gradients so that their global norm is at most `max_norm`.

        As torch.nn.utils.clip_grad_norm_ over the whole model, computed from the shards with
        one all-reduce. Call it between backward() and step(); returns the norm before clipping.
        """
        self.synchronize()
        grads = [s.grad for s in self._zero_shard.values() if s.grad is not None]
        norm_type = float(norm_type)
        # (on the model's device: a rank whose shard holds no gradient must send what the
        # others send, a CUDA tensor on a GPU)
        zero = torch.zeros((), dtype=torch.float64, device=self._zero_params[0].device)
        if math.isinf(norm_type):
            local = max((g.detach().abs().max().double() for g in grads if g.numel()),
                        default=zero)  # fmt: skip
            op = core.Max
        else:
            local = sum((g.detach().double().abs().pow(norm_type).sum() for g in grads), zero)
            op = core.Sum
        total = allreduce(local.reshape(1), name="zero.clip_grad_norm", op=op,
                          process_set=self._zero_settings.process_set)[0]  # fmt: skip
        if not math.isinf(norm_type):
            total = total.pow(1.0 / norm_type)
        coefficient = float(max_norm) / (float(total) + 1e-6)
        if coefficient < 1.0:
            for reduced in self._zero_reduced.values():  # all of a stage-1 bucket: consistent
                reduced.mul_(coefficient)
        return total.to(grads[0].dtype if grads else torch.float32)

    # -- the step -----------------------------------------------------------------------------

    def step(self, closure=None):
        if closure is not None:
            raise ValueError(
                "ZeroOptimizer.step() takes no closure: the closure's backward would start the "
                "gradient reductions again; compute the loss before step()"
            )
        self.synchronize()
        loss = super().step()
        self._zero_synchronized = False
        self._zero_reduced.clear()
        self._zero_gather()
        return loss

    def _zero_gather(self) -> None:
        """All-gather every bucket's updated chunk into every rank's parameters, in place."""
        process_set = self._zero_settings.process_set
        rank = process_set.rank()
        for b, (flat, bucket) in enumerate(zip(self._zero_flat, self._zero_buckets)):
            lo, hi = bucket.bounds[rank]
            name = f"zero.parameters.{b}"
            plan = tensor_allgather_into_plan(flat, TORCH_TENSORS, hi - lo, name, process_set)
            if plan is not None:  # (on torch's gloo or NCCL: the buffer itself, no view)
                run_now(plan)
                torch.autograd.graph.increment_version(flat)
                continue
            view = TensorView(flat)
            gathered = core.allgather_into(view.array, hi - lo, name=name, process_set=process_set)
            view.write_back(gathered)

    def zero_grad(self, set_to_none: bool = True) -> None:
        if self._zero_pending:
            raise core.HorovodLiteError(
                "zero_grad() was called after backward() and before step() or synchronize(): "
                "the gradients are still being reduced; call step() (or synchronize()) first"
            )
        for param in self._zero_params:
            param.grad = None
        # Backward accumulates straight into zeroed views of the bucket buffers (as DDP's
        # gradient_as_bucket_view): no copy into the bucket, no fresh allocation per gradient.
        for b, bucket in enumerate(self._zero_buckets):
            if self._zero_stage == 1:
                flat = self._zero_grad_flat.get(b)
                if flat is None:
                    flat = self._zero_grad_flat[b] = torch.empty_like(self._zero_flat[b])
                flat.zero_()
            else:
                flat = torch.zeros_like(self._zero_flat[b])
            self._zero_fresh[b] = flat
            for param, offset in zip(bucket.params, bucket.offsets):
                full = self._zero_params[param]
                full.grad = flat[offset : offset + full.numel()].view_as(full)
        self._zero_none = set_to_none
        for shard in self._zero_shard.values():
            shard.grad = None
        self._zero_reduced.clear()
        self._zero_synchronized = False
        for param in self._zero_counts:
            self._zero_counts[param] = 0

    # -- checkpoints --------------------------------------------------------------------------

    def state_dict(self) -> dict:
        """Return the full, unsharded state, as the wrapped optimizer's own state_dict() would.

        A collective: every rank of the process set must call it; every rank gets the whole
        state (so a checkpoint written by any rank loads at any rank count, or without horovodlite).
        """
        mine = []
        for (b, k), shard in self._zero_shard.items():
            piece = self._zero_pieces[b][k]
            state = self.state.get(shard, {})
            mine.append((piece.param, piece.start, piece.stop,
                         {key: _cpu(value) for key, value in state.items()}))  # fmt: skip
        gathered = allgather_object(mine, name="zero.state_dict",
                                    process_set=self._zero_settings.process_set)  # fmt: skip
        state = {}
        for pieces in gathered:
            for param, start, stop, entries in pieces:
                if not entries:  # no state yet: no entry, as in the wrapped optimizer's own
                    continue
                full = self._zero_params[param]
                target = state.setdefault(param, {})
                for key, value in entries.items():
                    if _per_element(value, stop - start):
                        if key not in target:
                            target[key] = value.new_empty(full.numel())
                        target[key][start:stop] = value
                    else:
                        target[key] = value
        for param, entries in state.items():
            full = self._zero_params[param]
            for key, value in entries.items():
                if torch.is_tensor(value) and value.dim() == 1 and value.numel() == full.numel():
                    entries[key] = value.view(full.shape).to(full.device)
        index, groups = 0, []
        for group in self._zero_groups_meta():
            count = group.pop("count")
            groups.append({**group, "params": list(range(index, index + count))})
            index += count
        return {"state": state, "param_groups": groups}

    def _zero_check_state_agrees(self) -> None:
        """Raise ValueError on every rank if some ranks hold state for their shards, some not.

        broadcast_optimizer_state() calls it: the state it broadcasts is gathered from every
        rank's shard, so one rank's loaded checkpoint cannot reach the others' elements.
        """
        # None: owns no elements. (load_state_dict() may leave empty entries: no state.)
        mine = any(self.state.values()) if self._zero_shard else None
        everyone = allgather_object(mine, name="zero.has_state",
                                    process_set=self._zero_settings.process_set)  # fmt: skip
        if len({has for has in everyone if has is not None}) > 1:
            without = [r for r, has in enumerate(everyone) if has is False]
            raise ValueError(
                f"ZeroOptimizer: ranks {without} hold no optimizer state while others do, so "
                "there is no whole state to broadcast (each rank keeps only its shard); call "
                "load_state_dict() with the full checkpoint on every rank instead"
            )

    def _zero_groups_meta(self) -> list:
        sizes = self._zero_group_sizes
        return [{**{k: v for k, v in g.items() if k != "params"}, "count": n}
                for g, n in zip(self.param_groups, sizes)]  # fmt: skip

    def load_state_dict(self, state_dict: dict) -> None:
        """Load a full state (from state_dict(), or a plain optimizer's); keep this rank's shard."""
        groups = state_dict["param_groups"]
        if [len(g["params"]) for g in groups] != self._zero_group_sizes:
            raise ValueError(
                f"the state has parameter groups of sizes {[len(g['params']) for g in groups]}, "
                f"but this optimizer's are {self._zero_group_sizes}: load a state saved from the "
                "same model and parameter groups"
            )
        full_index = [i for g in groups for i in g["params"]]  # the saved ids, in param order
        shard_state, shard_groups, position = {}, [], 0
        for group, saved in zip(self.param_groups, groups):
            ids = []
            for shard in group["params"]:
                piece = self._zero_piece_of[id(shard)]
                entries = state_dict["state"].get(full_index[piece.param])
                if entries is not None:
                    numel = self._zero_params[piece.param].numel()
                    # Copies: the optimizer updates its state in place (Adam's step count too),
                    # which must not change the caller's state_dict.
                    shard_state[position] = {
                        key: value.reshape(-1)[piece.start : piece.stop].clone()
                        if _per_element(value, numel)
                        else value.clone() if torch.is_tensor(value) else value
                        for key, value in entries.items()
                    }
                ids.append(position)
                position += 1
            shard_groups.append({**{k: v for k, v in saved.items() if k != "params"},
                                 "params": ids})  # fmt: skip
        super().load_state_dict({"state": shard_state, "param_groups": shard_groups})


def _flatten(params: list, numel: int) -> torch.Tensor:
    """Move `params` into one new flat buffer, in order; return it (their .data are views)."""
    flat = torch.empty(numel, dtype=params[0].dtype, device=params[0].device)
    offset = 0
    with torch.no_grad():
        for param in params:
            size = param.numel()
            flat[offset : offset + size].copy_(param.view(-1))
            param.data = flat[offset : offset + size].view_as(param)
            offset += size
    return flat


def _per_element(value, numel: int) -> bool:
    return torch.is_tensor(value) and value.dim() > 0 and value.numel() == numel


def _cpu(value):
    return value.detach().cpu() if torch.is_tensor(value) else value


def _remap(bucket, order: list):
    """Return `bucket` with its parameter positions in `order` turned into parameter indices."""
    return type(bucket)(tuple(order[i] for i in bucket.params), bucket.offsets, bucket.numel,
                        bucket.bounds)  # fmt: skip


def _check_same_model(params: list, names: dict, process_set) -> None:
    """Raise ValueError on every rank unless every rank has the same parameters."""
    layout = [(names[i], tuple(p.shape), str(p.dtype)) for i, p in enumerate(params)]
    everyone = allgather_object(layout, name="zero.layout", process_set=process_set)
    for rank, theirs in enumerate(everyone):
        if theirs != everyone[0]:
            first = next((i for i, (a, b) in enumerate(zip(theirs, everyone[0])) if a != b), None)
            detail = (
                f"{len(theirs)} parameters, rank 0 has {len(everyone[0])}"
                if first is None
                else f"{theirs[first]}, rank 0 has {everyone[0][first]}"
            )
            raise ValueError(
                f"ZeroOptimizer: the ranks optimize different models: rank {rank} has {detail}; "
                "build the same model on every rank"
            )


def ZeroOptimizer(
    optimizer,
    named_parameters=None,
    stage=1,
    compression=Compression.none,
    backward_passes_per_step=1,
    process_set=global_process_set,
    bucket_cap_mb=_BUCKET_BYTES / 2**20,
):
    """Wrap `optimizer` so that each rank keeps and updates only its shard of the state (ZeRO).

    Returns an instance of a subclass of the optimizer's class whose `state` holds this rank's
    shard only (about 1/n of it). Use it as DistributedOptimizer: backward(), then step().

    Args:
        optimizer: an elementwise torch optimizer (SGD, Adam, AdamW, RMSprop, Adagrad, ...).
        named_parameters: model.named_parameters(), to name parameters in errors.
        stage: 1 (shard the optimizer state) or 2 (also keep only this rank's gradient chunk).
        compression: Compression.none, .fp16 or .bf16 for the gradients on the wire.
        backward_passes_per_step: backward passes accumulated locally per reduction.
        process_set: the ranks that train this model.
        bucket_cap_mb: size of the buckets gradients are reduced in.

    Raises:
        TypeError: an optimizer that does not update elementwise, or one already wrapped.
        ValueError: a bad argument, or models that differ across ranks (on every rank).
    """
    check_unwrapped(optimizer)
    if not isinstance(optimizer, ELEMENTWISE):
        supported = ", ".join(c.__name__ for c in ELEMENTWISE)
        raise TypeError(
            f"ZeroOptimizer shards elementwise optimizers ({supported}); "
            f"{type(optimizer).__name__} needs whole parameters: use DistributedOptimizer"
        )
    if stage not in (1, 2):
        raise ValueError(f"stage must be 1 or 2, got {stage!r}")
    if not bucket_cap_mb > 0 or not math.isfinite(bucket_cap_mb):
        raise ValueError(f"bucket_cap_mb must be a positive number, got {bucket_cap_mb!r}")
    settings = ReductionSettings(
        compression=compression, backward_passes_per_step=backward_passes_per_step,
        process_set=process_set,
    )  # fmt: skip
    params = [p for group in optimizer.param_groups for p in group["params"]]
    for i, param in enumerate(params):
        if not param.is_contiguous():
            raise ValueError(f"parameter {i} is not contiguous: ZeroOptimizer shards flat views")
    names = parameter_names(params, named_parameters)
    existing = optimizer.state_dict() if optimizer.state else None
    cls = type(optimizer.__class__.__name__, (_ZeroMixin, optimizer.__class__), {})
    zero = cls.__new__(cls)
    zero.__dict__.update(optimizer.__dict__)
    index_names = {i: names[p] for i, p in enumerate(params)}
    zero._zero_setup(names=index_names, stage=stage, settings=settings,
                     bucket_bytes=int(bucket_cap_mb * 2**20))  # fmt: skip
    if existing is not None:
        zero.load_state_dict(existing)
    return zero
