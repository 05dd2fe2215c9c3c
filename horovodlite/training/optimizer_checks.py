"""What a distributed optimizer checks about the parameters it is given, framework free.

Ranks match gradients by name, so every parameter needs one name, unique and the same on every
rank (`parameter_names`); a gradient produced more often than `backward_passes_per_step` allows
before a step is an error (`accumulated_too_often`). The torch DistributedOptimizer and
ZeroOptimizer share both; parameters are any hashable objects, compared by identity.
"""

from collections.abc import Iterable
from typing import Optional

from ..exceptions import HorovodLiteError

__all__ = ["parameter_names", "accumulated_too_often"]


def parameter_names(params: list, named_parameters: Optional[Iterable]) -> dict:
    """Return {parameter: name} for the optimizer's `params`.

    Args:
        params: the optimizer's parameters, in order.
        named_parameters: (name, parameter) pairs, as a model's named_parameters() gives; None
            names them "allreduce.noname.<i>" by position.

    Raises:
        ValueError: a pair that is not (name, parameter), a duplicate name, or a parameter of
            the optimizer that no pair names.
    """
    if named_parameters is None:
        return {p: f"allreduce.noname.{i}" for i, p in enumerate(params)}
    named = list(named_parameters)
    if any(not isinstance(item, tuple) or len(item) != 2 for item in named):
        raise ValueError(
            "named_parameters must be (name, parameter) pairs, as model.named_parameters() gives"
        )
    names = [name for name, _ in named]
    duplicates = sorted({name for name in names if names.count(name) > 1})
    if duplicates:
        raise ValueError(
            f"named_parameters has duplicate names {duplicates}: names must be "
            "unique, since ranks match gradients by name"
        )
    by_param = {p: name for name, p in named}
    missing = [i for i, p in enumerate(params) if p not in by_param]
    if missing:
        raise ValueError(
            f"the optimizer's parameters at positions {missing} are missing from "
            "named_parameters: pass model.named_parameters() of the model being optimized"
        )
    return {p: by_param[p] for p in params}


def accumulated_too_often(name: str, passes: int) -> HorovodLiteError:
    """Return the error for a gradient computed more than `passes` times before step()."""
    return HorovodLiteError(
        f"gradient of {name!r} was computed more than backward_passes_per_step={passes} times "
        "before step(): raise backward_passes_per_step to accumulate gradients locally"
    )
