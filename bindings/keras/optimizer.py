"""DistributedOptimizer for Keras 3: an optimizer of the wrapped class that all-reduces first.

The wrapper is a dynamic subclass of the optimizer's own class, so `isinstance`, `get_config`
and saving work as before (a saved model loads without horovodlite). It hooks `apply`, which
`apply_gradients`, `model.fit` and custom loops all go through on the tensorflow and torch
backends. With backward_passes_per_step = n > 1 it uses Keras' own gradient accumulation
(`gradient_accumulation_steps=n`) and all-reduces the accumulated gradients only on every n-th
step, in `_clip_gradients`, the one method Keras calls exactly once per real update and before
the gradients are clipped and applied. Gradients of variables registered as worker-local
(`register_local_var`, PartialDistributedOptimizer's `local_layers`) are not all-reduced.
"""

import dataclasses

import keras
from horovodlite.ops import ReduceOp
from horovodlite.process_sets import global_process_set
from horovodlite.training import LocalVariables, ReductionSettings, layer_variables

from .backend import gradient_reducer
from .compression import Compression

__all__ = ["DistributedOptimizer", "PartialDistributedOptimizer", "load_model", "wrap"]

_CLASSES: dict = {}


def _distributed_class(base: type) -> type:
    """Return (once per class) the subclass of `base` that all-reduces gradients."""
    if getattr(base, "_horovodlite_distributed", False):
        return base
    if base not in _CLASSES:
        for method in ("apply", "_backend_apply_gradients", "_clip_gradients"):
            if not callable(getattr(base, method, None)):
                raise TypeError(
                    f"{base.__name__} has no {method}(): horovodlite.keras needs a Keras 3 "
                    f"optimizer (keras {keras.__version__} is installed)"
                )

        class Distributed(base):
            _horovodlite_distributed = True

            def register_local_var(self, var):
                """Keep the gradient of `var` on this rank: it is not all-reduced."""
                self._horovodlite_local.add(var)

            def _horovodlite_mask(self, variables):
                local = getattr(self, "_horovodlite_local", None)
                if not local or variables is None:
                    return None
                return local.mask(variables)

            def apply(self, grads, trainable_variables=None):
                reduce = self._horovodlite
                if reduce.settings.backward_passes_per_step == 1:
                    variables = trainable_variables
                    if variables is None and self.built:
                        variables = self._trainable_variables
                    if variables is not None:
                        variables = list(variables)
                        trainable_variables = variables
                    grads = reduce(list(grads), local=self._horovodlite_mask(variables))
                return super().apply(grads, trainable_variables)

            def _backend_apply_gradients(self, grads, trainable_variables):
                # _clip_gradients gets these gradients' variables only through here. Set past
                # Keras' __setattr__, which would track the list as the optimizer's own variables.
                object.__setattr__(self, "_horovodlite_applying", trainable_variables)
                return super()._backend_apply_gradients(grads, trainable_variables)

            def _clip_gradients(self, grads):
                reduce = self._horovodlite
                if reduce.settings.backward_passes_per_step > 1:
                    variables = getattr(self, "_horovodlite_applying", None)
                    grads = reduce(list(grads), local=self._horovodlite_mask(variables))
                return super()._clip_gradients(grads)

        Distributed.__name__ = base.__name__
        Distributed.__qualname__ = base.__qualname__
        Distributed.__module__ = base.__module__
        _CLASSES[base] = Distributed
    return _CLASSES[base]


def wrap(optimizer, settings: ReductionSettings, *, name=None, average_aggregated_gradients=False):
    """Return a new optimizer of `optimizer`'s class that reduces gradients as `settings` say.

    DistributedOptimizer here and in horovodlite.tensorflow check their arguments into
    `settings`, then hand on to this.

    Raises:
        ValueError: both the optimizer's gradient_accumulation_steps and
            backward_passes_per_step > 1.
        NotImplementedError: the Keras backend is neither tensorflow nor torch.
    """
    passes = settings.backward_passes_per_step
    if passes > 1 and not average_aggregated_gradients:
        # Keras averages the accumulated gradients; Horovod's default is their sum.
        settings = dataclasses.replace(settings, extra_postscale=float(passes))
    reduce = gradient_reducer(settings)
    config = optimizer.get_config()
    if name is not None:
        config["name"] = name
    if passes > 1:
        if config.get("gradient_accumulation_steps"):
            raise ValueError(
                "the optimizer already accumulates gradients (gradient_accumulation_steps="
                f"{config['gradient_accumulation_steps']}): set that or "
                "backward_passes_per_step, not both"
            )
        config["gradient_accumulation_steps"] = passes
    wrapped = _distributed_class(type(optimizer)).from_config(config)
    wrapped._horovodlite = reduce
    wrapped._horovodlite_local = LocalVariables()
    return wrapped


def DistributedOptimizer(
    optimizer,
    name=None,
    device_dense="",
    device_sparse="",
    compression=Compression.none,
    sparse_as_dense=False,
    gradient_predivide_factor=1.0,
    op=ReduceOp.AVERAGE,
    backward_passes_per_step=1,
    average_aggregated_gradients=False,
    num_groups=0,
    groups=None,
    process_set=global_process_set,
    scale_local_gradients=True,
):
    """Return a new optimizer of `optimizer`'s class whose updates use all-reduced gradients.

    Args:
        optimizer: a Keras 3 optimizer, not yet used (the new one is built from its config,
            as Horovod does, so existing slot variables are not carried over).
        name: a name for the new optimizer (default: the wrapped one's).
        compression: Compression.none, .fp16 or .bf16: the dtype on the wire.
        sparse_as_dense: all-reduce `tf.IndexedSlices` as dense tensors (tensorflow backend).
        gradient_predivide_factor: with op=Average, divide before the sum and multiply after.
        op: Average (default), Sum, or Adasum, which combines the ranks' gradients (as
            Horovod's Keras optimizer; docs/adasum.md) on a power-of-two number of ranks.
        backward_passes_per_step: all-reduce and apply every n-th call, accumulating locally in
            between (Keras' gradient_accumulation_steps).
        average_aggregated_gradients: with n > 1, apply the mean of the n accumulated gradients
            rather than their sum.
        num_groups, groups: accepted for Horovod; every gradient already travels in one fused
            buffer per dtype.
        device_dense, device_sparse: accepted for Horovod; unused.
        process_set: the ranks that average gradients.
        scale_local_gradients: divide the gradients of variables registered with
            `register_local_var` (which are not all-reduced) by the process set's size.

    Raises:
        TypeError: `optimizer` is not a Keras 3 optimizer.
        ValueError: a bad argument, or both gradient_accumulation_steps and
            backward_passes_per_step > 1.
        NotImplementedError: the Keras backend is neither tensorflow nor torch.
    """
    if not isinstance(optimizer, keras.optimizers.Optimizer):
        raise TypeError(
            f"DistributedOptimizer wraps a Keras 3 optimizer, got {type(optimizer).__name__}"
        )
    settings = ReductionSettings.from_arguments(locals())
    return wrap(
        optimizer, settings, name=name, average_aggregated_gradients=average_aggregated_gradients
    )


def PartialDistributedOptimizer(optimizer, *args, local_layers=None, **kwargs):
    """Return DistributedOptimizer(optimizer, ...) that keeps `local_layers`' gradients local.

    Takes DistributedOptimizer's arguments, and `local_layers`: the trainable weights of these
    Keras layers (a layer or a list of layers) are registered with `register_local_var`, so
    their gradients are not all-reduced (and are divided by the process set's size if
    `scale_local_gradients`). Horovod 0.28's function.

    Raises:
        TypeError: `optimizer` is not a Keras 3 optimizer, or an entry of `local_layers` is not
            a Keras layer.
        ValueError, NotImplementedError: as DistributedOptimizer.
    """
    local_variables = layer_variables(local_layers)
    wrapped = DistributedOptimizer(optimizer, *args, **kwargs)
    for variable in local_variables:
        wrapped.register_local_var(variable)
    return wrapped


def load_model(
    filepath,
    custom_optimizers=None,
    custom_objects=None,
    compression=Compression.none,
    legacy_opts=False,
):
    """Load a saved Keras model and make its optimizer a DistributedOptimizer, state and all.

    Args:
        filepath: a `.keras` file written by `model.save`.
        custom_optimizers: optimizer classes the file needs that Keras does not know.
        custom_objects: other custom classes and functions, as for `keras.models.load_model`.
        compression: the wire compression for the all-reduce.
        legacy_opts: accepted for Horovod; must be False (Keras 3 has no legacy optimizers).

    Raises:
        ValueError: legacy_opts=True.
    """
    if legacy_opts:
        raise ValueError(
            "legacy_opts=True asks for tf.keras 2's legacy optimizers, which Keras 3 does not "
            "have: leave legacy_opts=False"
        )
    objects = dict(custom_objects or {})
    for cls in custom_optimizers or []:
        objects[cls.__name__] = cls
    model = keras.models.load_model(filepath, custom_objects=objects)
    optimizer = getattr(model, "optimizer", None)
    if optimizer is not None:
        # Re-class the loaded optimizer in place, so its restored variables stay.
        optimizer.__class__ = _distributed_class(type(optimizer))
        optimizer._horovodlite = gradient_reducer(ReductionSettings(compression=compression))
        optimizer._horovodlite_local = LocalVariables()
    return model
