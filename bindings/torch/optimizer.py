"""DistributedOptimizer: all-reduce each gradient the moment backward() produces it."""

import contextlib
import dataclasses
import warnings

import horovodlite as core
import torch
from horovodlite.process_sets import global_process_set
from horovodlite.training import ReductionSettings, partition
from horovodlite.training.optimizer_checks import accumulated_too_often, parameter_names
from horovodlite.training.updates import combine_updates, combines_updates

from .compression import Compression
from .mpi_ops import (
    allreduce_async_,
    grouped_allreduce_async_,
    sparse_allreduce_async,
    synchronize,
)

__all__ = ["DistributedOptimizer"]


class Wrapper:
    """What DistributedOptimizer and ZeroOptimizer put in front of an optimizer's class."""

    _hvd_wrapper = ""  # the wrapper's name, for errors


def check_unwrapped(optimizer) -> None:
    """Raise TypeError if `optimizer` is a DistributedOptimizer or ZeroOptimizer already: both
    hook the gradients, so a second wrapper would reduce them twice."""
    if isinstance(optimizer, Wrapper):
        raise TypeError(
            f"the optimizer is already a {optimizer._hvd_wrapper}: wrap the plain torch "
            "optimizer once"
        )


class _DistributedMixin(Wrapper):
    """Methods that a DistributedOptimizer adds in front of the wrapped optimizer's class."""

    _hvd_wrapper = "DistributedOptimizer"

    def _hvd_setup(self, *, named_parameters, settings: ReductionSettings) -> None:
        self._hvd_settings = settings
        params = [p for group in self.param_groups for p in group["params"]]
        self._hvd_names = parameter_names(params, named_parameters)
        # Frozen parameters get no gradient and take no part (the optimizer skips them), as in
        # Horovod; zeros for them would move them under weight decay or momentum.
        self._hvd_groups = partition([p for p in params if p.requires_grad], settings.grouping)
        self._hvd_group_of = {p: g for g in self._hvd_groups for p in g}
        self._hvd_counts = {p: 0 for p in params}
        self._hvd_ready: dict = {}  # group -> parameters whose gradient is ready
        self._hvd_pending: dict = {}  # group -> [(handle, [(param, wire tensor, ctx)])]
        self._hvd_should_sync = True
        self._hvd_synchronized = False  # synchronize() called, and no backward() since
        self._hvd_hooks = []
        # With Adasum the gradients stay local: step() combines the updates (_hvd_adasum_step).
        if settings.process_set.size() > 1 and not combines_updates(settings):
            self._hvd_hooks = [
                p.register_post_accumulate_grad_hook(self._hvd_gradient_ready)
                for p in params
                if p.requires_grad
            ]

    @property
    def backward_passes_per_step(self) -> int:
        """Backward passes accumulated locally before each all-reduce."""
        return self._hvd_settings.backward_passes_per_step

    @backward_passes_per_step.setter
    def backward_passes_per_step(self, passes: int) -> None:
        # A changed copy, checked again as at construction.
        settings = dataclasses.replace(self._hvd_settings, backward_passes_per_step=passes)
        self._hvd_settings = settings

    def _hvd_gradient_ready(self, param) -> None:
        group = self._hvd_group_of[param]
        if group in self._hvd_pending:
            raise accumulated_too_often(self._hvd_names[param], self.backward_passes_per_step)
        self._hvd_synchronized = False
        self._hvd_counts[param] += 1
        if self._hvd_counts[param] == self.backward_passes_per_step:
            ready = self._hvd_ready.setdefault(group, set())
            ready.add(param)
            if len(ready) == len(group):
                self._hvd_submit(group)

    def _hvd_submit(self, group) -> None:
        self._hvd_ready.pop(group, None)
        settings = self._hvd_settings
        pending, dense = [], []
        for param in group:
            if param.grad is None:  # no gradient on this rank: still take part, with zeros
                param.grad = torch.zeros_like(param)
            if param.grad.is_sparse and not settings.sparse_as_dense:
                # A sparse gradient travels alone, as gathered indices and values.
                handle = sparse_allreduce_async(
                    param.grad,
                    name=self._hvd_names[param],
                    op=settings.op,
                    process_set=settings.process_set,
                )
                pending.append((handle, [(param, None, None)]))
                continue
            # sparse_as_dense: a dense copy travels; synchronize() makes the result sparse again.
            grad = param.grad.to_dense() if param.grad.is_sparse else param.grad
            wire, ctx = settings.compression.compress(grad)
            dense.append((param, wire, ctx))
        if dense:
            wires = [wire for _, wire, _ in dense]
            if len(dense) == 1:
                name = self._hvd_names[dense[0][0]]
                handle = allreduce_async_(wires[0], name=name, **settings.reduce_kwargs)
            else:
                name = "group." + self._hvd_names[dense[0][0]]
                handle = grouped_allreduce_async_(wires, name=name, **settings.reduce_kwargs)
            pending.append((handle, dense))
        self._hvd_pending[group] = pending

    def synchronize(self) -> None:
        """Wait for every gradient's all-reduce; submit those backward() did not reach.

        Call it yourself to work on the reduced gradients before step() (clipping, for
        example), then call step() inside `with optimizer.skip_synchronize():`.
        """
        self._hvd_synchronize()
        self._hvd_synchronized = True

    def _hvd_synchronize(self) -> None:
        if not self._hvd_hooks:
            return
        for group in self._hvd_groups:
            if group not in self._hvd_pending:
                self._hvd_submit(group)
        decompress = self._hvd_settings.compression.decompress
        for pending in self._hvd_pending.values():
            for handle, parts in pending:
                result = synchronize(handle)
                for param, wire, ctx in parts:
                    if wire is None:  # a sparse gradient, gathered into a new tensor
                        param.grad = result
                    elif param.grad.is_sparse:  # sparse_as_dense: sparse again, same layout
                        param.grad = decompress(wire, ctx).to_sparse(param.grad.sparse_dim())
                    elif wire is not param.grad:
                        param.grad.copy_(decompress(wire, ctx))
        self._hvd_pending.clear()
        self._hvd_ready.clear()
        for param in self._hvd_counts:
            self._hvd_counts[param] = 0

    @contextlib.contextmanager
    def skip_synchronize(self):
        """Make the next step() skip synchronize(), after you called it yourself (to clip)."""
        self._hvd_should_sync = False
        try:
            yield
        finally:
            self._hvd_should_sync = True

    def step(self, closure=None):
        if combines_updates(self._hvd_settings):
            return self._hvd_adasum_step(closure)
        if self._hvd_should_sync:
            if self._hvd_synchronized and not self._hvd_ready and not self._hvd_pending:
                # Horovod warns too, and all-reduces the gradients a second time; they are
                # already reduced and no backward() ran since, so horovodlite does not.
                warnings.warn(
                    "optimizer.step() called without optimizer.skip_synchronize() context "
                    "after optimizer.synchronize(): the gradients are already all-reduced, so "
                    "this step uses them as they are; write `with optimizer.skip_synchronize(): "
                    "optimizer.step()` after calling synchronize() yourself",
                    stacklevel=2,
                )
            else:
                self._hvd_synchronize()
        self._hvd_synchronized = False
        return super().step(closure)

    def _hvd_adasum_step(self, closure):
        """Step on the local gradients, then combine every rank's update with Adasum."""
        settings, names = self._hvd_settings, self._hvd_names
        params = [p for p in names if p.requires_grad]
        step = super().step

        def reduce(updates: list) -> list:
            # One request per parameter, all started before the first wait: the engine fuses
            # them, and Adasum still combines each parameter by its own angle.
            sent = []
            for param, update in zip(params, updates):
                wire, ctx = settings.compression.compress(update)
                name = f"adasum.{names[param]}"
                handle = allreduce_async_(wire, name=name, **settings.reduce_kwargs)
                sent.append((handle, ctx))
            return [settings.compression.decompress(synchronize(h), ctx) for h, ctx in sent]

        def assign(param, start, update) -> None:
            with torch.no_grad():
                param.copy_(start.add_(update.to(start.dtype)))

        return combine_updates(
            params,
            lambda: step(closure),
            copy=lambda p: p.detach().clone(),
            delta=lambda p, start: p.detach() - start,
            reduce=reduce,
            assign=assign,
        )

    def zero_grad(self, *args, **kwargs):
        if self._hvd_pending:
            raise core.HorovodLiteError(
                "zero_grad() was called after backward() and before step() or synchronize(): "
                "the gradients are still being all-reduced; call step() (or synchronize()) first"
            )
        return super().zero_grad(*args, **kwargs)

    def set_backward_passes_per_step(self, passes: int) -> None:
        """Change how many backward passes accumulate locally before the all-reduce."""
        self.backward_passes_per_step = passes
        for param in self._hvd_counts:
            self._hvd_counts[param] = 0


def DistributedOptimizer(
    optimizer,
    named_parameters=None,
    compression=Compression.none,
    backward_passes_per_step=1,
    op=core.Average,
    gradient_predivide_factor=1.0,
    num_groups=0,
    groups=None,
    sparse_as_dense=False,
    process_set=global_process_set,
):
    """Wrap `optimizer` so that step() applies gradients averaged over all ranks.

    Returns an instance of a subclass of the optimizer's class, sharing its state: `isinstance`
    and `state_dict()` work as before. Each parameter's gradient is all-reduced as soon as
    backward() has accumulated it, overlapping communication with the rest of the backward pass.

    Args:
        named_parameters: model.named_parameters(), to name gradients in errors and matching.
        compression: Compression.none, .fp16 or .bf16 for the wire.
        backward_passes_per_step: backward passes accumulated locally per all-reduce.
        op: Average (default), Sum, or Adasum: each rank then steps on its own gradient and
            step() combines the ranks' updates with Adasum, as Horovod's Adasum optimizer
            (docs/adasum.md).
        gradient_predivide_factor: with Average, divide by this before the sum and the rest after.
        num_groups, groups: all-reduce gradients in groups (an int, or lists of parameters).
        sparse_as_dense: all-reduce sparse gradients as dense tensors.
        process_set: the ranks that train this model.

    Raises:
        ValueError, TypeError, NotImplementedError: a bad argument (see ReductionSettings), or
            named_parameters that do not name the optimizer's parameters once each.
        TypeError: the optimizer is a DistributedOptimizer or ZeroOptimizer already.
    """
    check_unwrapped(optimizer)
    settings = ReductionSettings.from_arguments(locals())
    cls = type(optimizer.__class__.__name__, (_DistributedMixin, optimizer.__class__), {})
    distributed = cls.__new__(cls)
    distributed.__dict__.update(optimizer.__dict__)
    distributed._hvd_setup(named_parameters=named_parameters, settings=settings)
    return distributed
