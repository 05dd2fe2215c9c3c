"""Worker-local variables: their gradients stay on their rank (Horovod's register_local_var).

Horovod 0.28 lets a model keep some variables per rank (`register_local_source`,
`register_local_var`, the `local_layers` of PartialDistributedGradientTape and
PartialDistributedOptimizer): their gradients are not all-reduced. With
`scale_local_gradients` (the default) they are divided by the process set's size, so that a
local variable's step has the scale of the global objective, the mean of the ranks' losses
(Horovod PR 3695); `reduce_gradients(..., local=mask)` applies both.
"""

from collections.abc import Iterable

__all__ = ["LocalVariables", "layer_variables"]


class LocalVariables:
    """A set of variables kept by identity: framework variables need not hash or compare."""

    def __init__(self, variables: Iterable = ()):
        self._members: dict = {}  # id -> variable; holding it keeps the id from being reused
        for variable in variables:
            self.add(variable)

    def add(self, variable) -> None:
        """Register `variable` as local to this rank."""
        self._members[id(variable)] = variable

    def __contains__(self, variable) -> bool:
        return id(variable) in self._members

    def __len__(self) -> int:
        return len(self._members)

    def mask(self, variables: Iterable) -> list:
        """Return, for each of `variables`, whether it is local."""
        return [id(variable) in self._members for variable in variables]


def layer_variables(local_layers) -> list:
    """Return the trainable weights of `local_layers`: None, a Keras layer, or a list of them.

    Raises:
        TypeError: an entry is not a Keras layer (it has no `trainable_weights`).
    """
    if local_layers is None:
        return []
    layers = local_layers
    if hasattr(local_layers, "trainable_weights") or not isinstance(local_layers, Iterable):
        layers = [local_layers]
    wrong = [layer for layer in layers if not hasattr(layer, "trainable_weights")]
    if wrong:
        raise TypeError(
            "local_layers must be a Keras layer or a list of Keras layers, got "
            f"{type(wrong[0]).__name__}: pass the layers whose weights stay on each rank"
        )
    return [variable for layer in layers for variable in layer.trainable_weights]
