"""hvd.elastic for JAX: JaxState, ElasticSampler and run, glue on horovodlite.training.elastic.

JAX arrays are immutable: a train step returns new parameters and a new optimizer state, and the
loop assigns them to the state (`state.params, state.opt_state = step(state.params, ...)`). An
assignment only replaces the value; `commit()` keeps host (numpy) copies of every value that
holds jax.Arrays, `restore()` puts the committed copies back on the device, and `sync()`
broadcasts rank 0's (broadcast_parameters). The copies are what a durable commit writes, so it
loads on any device, and a buffer donated to a jitted step cannot take the commit with it.

Inside jax.jit a collective's failure reaches Python as JAX's JaxRuntimeError: this module's
`run` raises the horovodlite error behind it instead, so a peer that fails during a jitted step
restarts the job as in every binding.
"""

import copy
import dataclasses
import functools
from typing import Callable, Optional

import numpy as np

import jax
import jax.numpy as jnp
from horovodlite.training.elastic import *  # noqa: F403 (SHARED: run, State, ...)
from horovodlite.training.elastic import SHARED, HandlerState, StateHandler
from horovodlite.training.elastic import run as run_restarting
from horovodlite.training.elastic_sampling import ElasticIndices, ElasticSampler, SamplerHandler  # noqa: F401 (ElasticSampler: public here)

from .functions import broadcast_parameters
from .host import collective_failure, settle

__all__ = [*SHARED, "JaxState", "ElasticSampler"]


@dataclasses.dataclass(frozen=True)
class _HostArray:
    """A committed jax.Array: a numpy copy, and a typed PRNG key's implementation (or None)."""

    data: np.ndarray
    key_impl: Optional[str] = None


def _to_host(leaf):
    if not isinstance(leaf, jax.Array):
        return copy.deepcopy(leaf)
    if jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.prng_key):
        return _HostArray(np.array(jax.random.key_data(leaf)), jax.random.key_impl(leaf))
    return _HostArray(np.array(leaf))  # a copy: the array may be donated to a jitted step later


def _to_device(leaf):
    if not isinstance(leaf, _HostArray):
        return copy.deepcopy(leaf)
    # jnp.array copies: a restored array that shared the commit's buffer and was then donated
    # would let XLA write into the commit.
    array = jnp.array(leaf.data)
    return array if leaf.key_impl is None else jax.random.wrap_key_data(array, impl=leaf.key_impl)


def _holds_jax_arrays(value) -> bool:
    return any(isinstance(leaf, jax.Array) for leaf in jax.tree.leaves(value))


class _PytreeHandler(StateHandler):
    """Commits a pytree that holds jax.Arrays (parameters, an optax state, a PRNG key)."""

    def set_value(self, value) -> None:
        # A train step makes a new pytree every step: commit() keeps it, not the assignment.
        self.value = value

    def save(self) -> None:
        self.saved = jax.tree.map(_to_host, self.value)

    def restore(self) -> None:
        self.value = jax.tree.map(_to_device, self.saved)

    def sync(self) -> None:
        self.value = broadcast_parameters(self.value, root_rank=0)


def _handler_for(value):
    if isinstance(value, ElasticIndices):
        return SamplerHandler(value)
    if _holds_jax_arrays(value):
        return _PytreeHandler(value)
    return None


class JaxState(HandlerState):
    """The elastic state of a JAX job: parameters, an optax state, samplers, other attributes.

    Every keyword value that holds jax.Arrays (`params`, `opt_state`, a PRNG key, any pytree) is
    committed as numpy copies: assign the new pytree after each step (`state.params = params`);
    `commit()` keeps it, `restore()` gives back the committed pytree as jax.Arrays (on the
    default device), and `sync()` makes every rank's rank 0's. An ElasticSampler is committed
    as its processed indices; other values are plain picklable attributes, as in ObjectState.
    Which values are pytrees is decided at construction.
    """

    def __init__(self, params=None, opt_state=None, **kwargs):
        super().__init__(_handler_for, params=params, opt_state=opt_state, **kwargs)

    # The core's collectives below (a sampler's gather, the host check, the broadcasts) must
    # follow the ones of the jitted steps JAX has dispatched: wait for those first.

    def commit(self) -> None:
        settle()
        super().commit()

    def check_host_updates(self) -> None:
        settle()
        super().check_host_updates()

    def sync(self) -> None:
        settle()
        super().sync()


def run(func: Callable) -> Callable:
    """Decorate `func(state, ...)`, the training function of an elastic JAX job.

    As horovodlite.training.elastic.run: restore the newest commit, sync, call `func`, and
    leave for a restart on HostsUpdatedInterrupt or HorovodInternalError. A collective that
    fails inside a jitted step raises JAX's JaxRuntimeError; the horovodlite error behind it
    is raised in its place, so the job restarts from the last commit.
    """

    @functools.wraps(func)
    def with_collective_failures(state, *args, **kwargs):
        try:
            return func(state, *args, **kwargs)
        except jax.errors.JaxRuntimeError as exc:
            failure = collective_failure(exc)
            if failure is None:
                raise
            raise failure from exc

    restarting = run_restarting(with_collective_failures)

    @functools.wraps(func)
    def wrapper(state, *args, **kwargs):
        settle()  # the restore's collectives follow any step already dispatched
        return restarting(state, *args, **kwargs)

    return wrapper
