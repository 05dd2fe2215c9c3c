"""How gradients are reduced over the ranks: one validated settings object, and its use on a list.

Every binding's DistributedOptimizer (and TensorFlow's DistributedGradientTape) takes Horovod's
arguments (op, gradient_predivide_factor, backward_passes_per_step, groups, compression, ...),
builds one ReductionSettings from them before any communication, and passes its
`reduce_kwargs` to the all-reduce. Later training features (sharded optimizers, elastic
training, pipelines) take the same object, so an argument is checked and scaled in one place.
"""

import dataclasses
from collections.abc import Sequence
from typing import Any, Callable, Optional

from ..ops import ReduceOp, resolve_op
from ..process_sets import ProcessSet, global_process_set
from .compression import NoneCompressor

__all__ = ["ReductionSettings", "reduce_kwargs", "reduce_gradients"]

# Min, Max and Product of gradients mean nothing for training. Sparse gradients (all-gathered,
# then summed) support only Average and Sum; Adasum takes dense ones (docs/adasum.md).
_GRADIENT_OPS = (ReduceOp.AVERAGE, ReduceOp.SUM, ReduceOp.ADASUM)


def reduce_kwargs(
    op=None,
    average=None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: Optional[ProcessSet] = global_process_set,
) -> dict:
    """Return an all-reduce's or reduce-scatter's keyword arguments from a binding's.

    Meant to be called by a binding's public collective, straight from its Horovod arguments:
    the deprecation warning for `average` then names the user's call. The parameters are in
    one fixed order so that a binding's many forms pass their same-named arguments in one line,
    `reduce_kwargs(op, average, prescale_factor, postscale_factor, process_set)`.

    Raises:
        ValueError, TypeError: from resolve_op, for both op and average or an unknown op.
    """
    return {
        # Frames: resolve_op, this function, the binding's collective, the user's call.
        "op": resolve_op(op, average, stacklevel=4),
        "prescale_factor": prescale_factor,
        "postscale_factor": postscale_factor,
        "process_set": process_set,
    }


# eq=False: `groups` may hold framework tensors, whose == is elementwise, so settings compare by
# identity.
@dataclasses.dataclass(frozen=True, eq=False)
class ReductionSettings:
    """How a set of gradients is reduced: the op, its scaling, the groups and the compression.

    Build one per optimizer or tape. The constructor checks every field and raises before any
    communication; `dataclasses.replace` builds a changed copy and checks it again.

    Attributes:
        op: Average, Sum or Adasum (anything `resolve_op` takes; stored resolved).
        compression: a compression strategy, such as Compression.fp16 of a binding.
        gradient_predivide_factor: with Average, divide each rank's gradient by this before the
            sum and multiply the result by it after, so large fp16 sums do not overflow.
        extra_postscale: a further factor on the result, such as the backward_passes_per_step
            that turns the Keras average of accumulated gradients into Horovod's sum.
        backward_passes_per_step: backward passes accumulated locally per reduction.
        num_groups, groups: reduce in groups: a count, or explicit groups of parameters (an int
            in `groups` is a count, as in Horovod); give at most one. See `grouping`.
        sparse_as_dense: reduce sparse gradients as dense tensors.
        process_set: the ranks that reduce (None is the global set).
        scale_local_gradients: divide the gradients of worker-local variables, which are not
            reduced, by the process set's size (see `locality`).

    Raises:
        ValueError: op is not Average, Sum or Adasum; gradient_predivide_factor with another op
            or not positive; backward_passes_per_step below 1; num_groups negative; both
            num_groups and groups.
        TypeError: backward_passes_per_step not an int; groups neither a count nor a list of
            groups; compression without compress/decompress; process_set not a ProcessSet.
    """

    op: ReduceOp = ReduceOp.AVERAGE
    compression: Any = NoneCompressor
    gradient_predivide_factor: float = 1.0
    extra_postscale: float = 1.0
    backward_passes_per_step: int = 1
    num_groups: int = 0
    groups: Any = None
    sparse_as_dense: bool = False
    process_set: Optional[ProcessSet] = global_process_set
    scale_local_gradients: bool = True

    def __post_init__(self):
        op = resolve_op(self.op, None)
        if op not in _GRADIENT_OPS:
            raise ValueError(f"gradients are reduced with Average, Sum or Adasum, got op={op.name}")
        if self.gradient_predivide_factor != 1.0 and op != ReduceOp.AVERAGE:
            raise ValueError(
                "gradient_predivide_factor only applies to op=Average: divide by it before the "
                "sum and multiply after, so the result is still the average"
            )
        if not self.gradient_predivide_factor > 0:
            raise ValueError(
                f"gradient_predivide_factor must be > 0, got {self.gradient_predivide_factor!r}"
            )
        _check_count(self.backward_passes_per_step, "backward_passes_per_step")
        if self.num_groups and self.groups is not None:
            raise ValueError("give num_groups or groups, not both")
        num_groups = self.num_groups
        if isinstance(num_groups, bool) or not isinstance(num_groups, int) or num_groups < 0:
            raise ValueError(f"num_groups must be a non-negative int, got {self.num_groups!r}")
        compression = self.compression
        if not hasattr(compression, "compress") or not hasattr(compression, "decompress"):
            raise TypeError(
                "compression must be a Compression strategy such as hvd.Compression.fp16, "
                f"got {compression!r}"
            )
        process_set = global_process_set if self.process_set is None else self.process_set
        if not isinstance(process_set, ProcessSet):
            raise TypeError(f"process_set must be a ProcessSet, got {type(process_set).__name__}")
        object.__setattr__(self, "op", op)
        object.__setattr__(self, "groups", _checked_groups(self.groups))
        object.__setattr__(self, "process_set", process_set)

    @classmethod
    def from_arguments(cls, arguments: dict) -> "ReductionSettings":
        """Return the settings from a DistributedOptimizer's or tape's arguments, by name.

        Every binding's wrapper takes Horovod's arguments in its own order; it passes them all
        (`locals()`), and those named like a field become the settings, the others (the
        optimizer, device_dense, name, ...) stay with the binding.
        """
        fields = {field.name for field in dataclasses.fields(cls)}
        chosen = {name: value for name, value in arguments.items() if name in fields}
        if "scale_local_gradients" in chosen:
            chosen["scale_local_gradients"] = bool(chosen["scale_local_gradients"])
        return cls(**chosen)

    @property
    def prescale_factor(self) -> float:
        """The factor on each rank's gradient before the sum: 1 / gradient_predivide_factor."""
        return 1.0 / self.gradient_predivide_factor

    @property
    def postscale_factor(self) -> float:
        """The factor on the result: gradient_predivide_factor times extra_postscale."""
        return self.gradient_predivide_factor * self.extra_postscale

    @property
    def reduce_kwargs(self) -> dict:
        """The all-reduce's keyword arguments: op, prescale_factor, postscale_factor, process_set.

        The same mapping for the core's and every binding's all-reduce, passed as `**kwargs`.
        """
        return {
            "op": self.op,
            "prescale_factor": self.prescale_factor,
            "postscale_factor": self.postscale_factor,
            "process_set": self.process_set,
        }

    @property
    def grouping(self):
        """None (reduce each gradient alone), a group count, or a tuple of explicit groups."""
        return self.groups if self.groups is not None else (self.num_groups or None)

    def alone(self) -> bool:
        """Return whether this rank is the whole process set, so the sum is its own gradient."""
        return self.process_set.size() == 1 and self.process_set.included()


def _check_count(value, what: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{what} must be an int, got {type(value).__name__}")
    if value < 1:
        raise ValueError(f"{what} must be >= 1, got {value}")


def _checked_groups(groups):
    """Return `groups` as None, a count, or a tuple of tuples (read once, even from generators)."""
    if groups is None:
        return None
    if isinstance(groups, int) and not isinstance(groups, bool):
        if groups < 0:
            raise ValueError(f"groups as a count must be a non-negative int, got {groups}")
        return groups
    try:
        return tuple(tuple(group) for group in groups)
    except TypeError:
        raise TypeError(
            f"groups must be a group count or a list of lists of parameters, got {groups!r}"
        ) from None


def reduce_gradients(
    grads,
    settings: ReductionSettings,
    *,
    reduce: Callable[[list], list],
    scale: Callable[[Any, float], Any],
    local: Optional[Sequence[bool]] = None,
) -> list:
    """Return `grads` reduced as `settings` say; entries that are None stay None.

    Alone in the process set the reduction is the identity for Sum and Average, so nothing is
    sent (as the torch DistributedOptimizer then adds no hooks): only the scale is applied.

    Args:
        grads: the gradients, None where a variable has none.
        settings: how to reduce them.
        reduce: the binding's all-reduce of a list of tensors (none of them None).
        scale: `scale(tensor, factor)` multiplies a tensor by a float, in the framework.
        local: for each gradient, whether its variable is worker-local: such a gradient is not
            reduced, only scaled by `extra_postscale` and divided by the process set's size if
            `settings.scale_local_gradients`.
    """
    grads = list(grads)
    local = [False] * len(grads) if local is None else list(local)
    if len(local) != len(grads):
        raise ValueError(f"expected one local flag per gradient ({len(grads)}), got {len(local)}")
    present = [i for i, grad in enumerate(grads) if grad is not None and not local[i]]
    tensors = [grads[i] for i in present]
    if settings.alone():
        factor = settings.prescale_factor * settings.postscale_factor
        reduced = tensors if factor == 1.0 else [scale(t, factor) for t in tensors]
    else:
        reduced = reduce(tensors)
    for i, grad in zip(present, reduced):
        grads[i] = grad
    if any(local):
        # extra_postscale belongs to every gradient (it turns Keras' mean of accumulated
        # passes into Horovod's sum); the reduce's own scaling does not apply to local ones.
        factor = settings.extra_postscale
        if settings.scale_local_gradients:
            factor /= settings.process_set.size()
        for i, grad in enumerate(grads):
            if local[i] and grad is not None and factor != 1.0:
                grads[i] = scale(grad, factor)
    return grads
