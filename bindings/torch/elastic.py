"""hvd.elastic for PyTorch: TorchState and ElasticSampler, glue on horovodlite.training.elastic.

The state machinery, the durable commits and the sampler's dealing of indices are the training
layer's; this module only says how a module, an optimizer and a sampler are saved, restored
and synced. Committed tensors are kept as CPU copies, so a commit can be written to disk and
loaded on any device.
"""

import copy

import torch
from horovodlite.training import elastic_sampling
from horovodlite.training.elastic import *  # noqa: F403 (SHARED: run, State, ...)
from horovodlite.training.elastic import SHARED, HandlerState, StateHandler
from horovodlite.training.elastic_sampling import ElasticIndices, SamplerHandler

from .functions import broadcast_optimizer_state, broadcast_parameters

__all__ = [*SHARED, "TorchState", "ElasticSampler"]


def _cpu_copy(value):
    """Return `value` with every tensor replaced by a detached CPU copy."""
    if isinstance(value, torch.Tensor):
        return value.detach().to("cpu", copy=True)
    if isinstance(value, dict):
        return type(value)((k, _cpu_copy(v)) for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return type(value)(_cpu_copy(v) for v in value)
    return copy.deepcopy(value)


class _ModuleHandler(StateHandler):
    def save(self) -> None:
        self.saved = _cpu_copy(self.value.state_dict())

    def restore(self) -> None:
        self.value.load_state_dict(self.saved)  # copies into the module's own tensors

    def sync(self) -> None:
        broadcast_parameters(self.value.state_dict(), root_rank=0)


class _OptimizerHandler(StateHandler):
    def save(self) -> None:
        self.saved = _cpu_copy(self.value.state_dict())

    def restore(self) -> None:
        # load_state_dict may keep the tensors it is given (same device and dtype), and the
        # next step updates them in place: hand it a copy so the commit stays as it was.
        self.value.load_state_dict(_cpu_copy(self.saved))

    def sync(self) -> None:
        broadcast_optimizer_state(self.value, root_rank=0)


class ElasticSampler(elastic_sampling.ElasticSampler, torch.utils.data.Sampler):
    __doc__ = elastic_sampling.ElasticSampler.__doc__  # also a torch Sampler, for DataLoader


def _handler_for(value):
    if isinstance(value, torch.nn.Module):
        return _ModuleHandler(value)
    if isinstance(value, torch.optim.Optimizer):
        return _OptimizerHandler(value)
    if isinstance(value, ElasticIndices):
        return SamplerHandler(value)
    return None


class TorchState(HandlerState):
    """Horovod's TorchState: a model, an optimizer, samplers and any picklable attributes.

    `commit()` keeps CPU copies of the model's and optimizer's state dicts (and of every
    `torch.nn.Module`, `torch.optim.Optimizer` and ElasticSampler passed by keyword), `sync()`
    broadcasts them from rank 0, `restore()` loads the last commit. Other keyword values are
    plain attributes, as in ObjectState.
    """

    def __init__(self, model=None, optimizer=None, **kwargs):
        super().__init__(_handler_for, model=model, optimizer=optimizer, **kwargs)
