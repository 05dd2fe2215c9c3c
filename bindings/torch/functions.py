"""Broadcasting model and optimizer state, and Python objects."""

import horovodlite as core
import torch
from horovodlite.process_sets import global_process_set

from .mpi_ops import broadcast_async_, synchronize

__all__ = [
    "broadcast_parameters",
    "broadcast_variables",
    "broadcast_optimizer_state",
    "broadcast_object",
    "allgather_object",
]


def _named_tensors(params) -> list:
    if isinstance(params, dict):
        items = sorted(params.items())
    else:
        items = list(params)
        if items and not isinstance(items[0], tuple):
            items = [(f"tensor.{i}", t) for i, t in enumerate(items)]
    for name, tensor in items:
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(
                f"cannot broadcast {name!r}: expected a tensor, got {type(tensor).__name__}"
            )
    return items


def broadcast_parameters(params, root_rank, process_set=global_process_set) -> None:
    """Overwrite every tensor in `params` with `root_rank`'s, in place.

    Args:
        params: a state_dict, a list of (name, tensor) pairs (model.named_parameters()), or a
            list of tensors.
    """
    handles = [
        broadcast_async_(tensor, root_rank, name=f"broadcast.{name}", process_set=process_set)
        for name, tensor in _named_tensors(params)
    ]
    for handle in handles:
        synchronize(handle)


broadcast_variables = broadcast_parameters


def _skeleton(value):
    """Return `value` with each tensor replaced by a (shape, dtype, device type) placeholder.

    The device type travels because optimizers keep some state on the host beside GPU
    parameters (Adam's `step` unless capturable): each rank must make that tensor where the
    root has it, or the broadcast would meet MPI on one rank and NCCL on another.
    """
    if isinstance(value, torch.Tensor):
        dtype = str(value.dtype).replace("torch.", "")
        return ("__tensor__", tuple(value.shape), dtype, value.device.type)
    if isinstance(value, dict):
        return {k: _skeleton(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_skeleton(v) for v in value)
    return value


def _fill(skeleton, local, *, tensors: list, device):
    """Rebuild a structure from `skeleton`, reusing `local`'s tensors where they fit; a tensor
    the root has on a GPU is made on this rank's `device` (its parameters'), one on the host on
    the host."""
    if isinstance(skeleton, tuple) and skeleton[:1] == ("__tensor__",):
        _, shape, dtype, where = skeleton
        dtype = getattr(torch, dtype)
        if (
            isinstance(local, torch.Tensor)
            and tuple(local.shape) == shape
            and local.dtype == dtype
            and local.device.type == where
        ):
            tensor = local
        else:
            tensor = torch.zeros(shape, dtype=dtype, device="cpu" if where == "cpu" else device)
        tensors.append(tensor)
        return tensor
    if isinstance(skeleton, dict):
        local = local if isinstance(local, dict) else {}
        return {
            k: _fill(v, local.get(k), tensors=tensors, device=device) for k, v in skeleton.items()
        }
    if isinstance(skeleton, (list, tuple)):
        local = local if isinstance(local, (list, tuple)) else [None] * len(skeleton)
        return type(skeleton)(
            _fill(v, lv, tensors=tensors, device=device) for v, lv in zip(skeleton, local)
        )
    return skeleton


def broadcast_optimizer_state(
    optimizer, root_rank, model=None, process_set=global_process_set
) -> None:
    """Make `optimizer`'s whole state (tensors, step counts, hyperparameters) the root's.

    Works for any torch optimizer: the structure travels as a small object, the tensors by
    in-place broadcast. `model` is accepted for Horovod compatibility.

    Only the state that exists on the root travels. An optimizer that has not stepped yet
    stays exactly as new: it takes no step (Horovod's steps once on zero gradients, which
    moves parameters under weight decay and counts in Adam's bias correction), and its state
    is created at the first real step, alike on every rank since the parameters and the
    averaged gradients are. A rank whose optimizer has state the root's lacks (say, rank 0
    did not load the checkpoint the others did) loses it. As in Horovod, every parameter that
    requires a gradient and has none is given a zero `.grad` (sparse for `SparseAdam`), so that
    its gradient can be broadcast or reduced at once.
    """
    check_sharded_state = getattr(optimizer, "_zero_check_state_agrees", None)
    if check_sharded_state is not None:  # a ZeroOptimizer: its state_dict() gathers shards
        check_sharded_state()
    else:
        _give_zero_gradients(optimizer)
    local = optimizer.state_dict()
    skeleton = core.broadcast_object(
        _skeleton(local), root_rank, name="optimizer_state", process_set=process_set
    )
    device = next((p.device for g in optimizer.param_groups for p in g["params"]), "cpu")
    tensors: list = []
    state = _fill(skeleton, local, tensors=tensors, device=device)
    handles = [
        broadcast_async_(t, root_rank, name=f"optimizer_state.{i}", process_set=process_set)
        for i, t in enumerate(tensors)
    ]
    for handle in handles:
        synchronize(handle)
    if core.rank() == root_rank:
        return  # its state is the root's already; loading would only cast it (see below)
    optimizer.load_state_dict(state)
    if check_sharded_state is None:
        _keep_dtypes(optimizer, state)


def _keep_dtypes(optimizer, state: dict) -> None:
    """Give each loaded state tensor the root's dtype again.

    load_state_dict() casts floating state to its parameter's dtype, so a float32 scalar of a
    float64 parameter (NAdam's mu_product, ASGD's eta and mu) would compute in float64 here
    and in float32 on the root.
    """
    saved_ids = [i for group in state["param_groups"] for i in group["params"]]
    params = [p for group in optimizer.param_groups for p in group["params"]]
    param_of = dict(zip(saved_ids, params))
    for index, entries in state["state"].items():
        loaded = optimizer.state[param_of[index]]
        for key, value in entries.items():
            mine = loaded.get(key)
            if torch.is_tensor(value) and torch.is_tensor(mine) and mine.dtype != value.dtype:
                loaded[key] = mine.to(value.dtype)


def _give_zero_gradients(optimizer) -> None:
    for group in optimizer.param_groups:
        for param in group["params"]:
            if param.requires_grad and param.grad is None:
                param.grad = torch.zeros_like(param)
                if isinstance(optimizer, torch.optim.SparseAdam):
                    param.grad = param.grad.to_sparse()


def broadcast_object(obj, root_rank=0, name=None, process_set=global_process_set):
    """Return `root_rank`'s picklable `obj` on every rank."""
    return core.broadcast_object(obj, root_rank, name=name, process_set=process_set)


def allgather_object(obj, name=None, process_set=global_process_set) -> list:
    """Return every rank's picklable `obj`, in rank order."""
    return core.allgather_object(obj, name=name, process_set=process_set)
