"""Broadcasting parameters and optimizer state (pytrees), and Python objects.

JAX arrays are immutable: where Horovod's torch functions overwrite tensors in place, these
return the root's pytree, which the caller assigns (`params = hvd.broadcast_parameters(params)`).
They run outside jax.jit, before training.
"""

import numpy as np

import horovodlite as core
import jax
from horovodlite.process_sets import global_process_set

from .host import host_arrays, refuse_in_trace

__all__ = [
    "broadcast_parameters",
    "broadcast_variables",
    "broadcast_optimizer_state",
    "broadcast_object",
    "allgather_object",
]

_ARRAYS = (jax.Array, np.ndarray, np.generic)


def _describe(leaf):
    if isinstance(leaf, _ARRAYS):
        return "array", tuple(np.shape(leaf)), str(leaf.dtype)
    return "object", type(leaf).__name__


def _broadcast_tree(what: str, tree, root_rank, process_set):
    """Return `tree` with every leaf as `root_rank` holds it; the structures must agree.

    Every rank's structure (its tree definition and each array's shape and dtype) is gathered
    first, so a rank whose tree differs from the root's raises on every rank, naming it.
    Arrays travel by broadcast, other leaves (Python numbers, strings) as one object.
    """
    refuse_in_trace(what, "it runs once, before training, on concrete arrays", ())
    host_arrays(())  # after the collectives of every step JAX has dispatched
    process_set = process_set or global_process_set
    leaves, treedef = jax.tree.flatten(tree)
    description = (str(treedef), [_describe(leaf) for leaf in leaves])
    # Every rank's root travels with its structure, so a rank that names another root (or one
    # outside the set) makes every rank raise the same error, not only itself.
    gathered = core.allgather_object(
        (root_rank, description), name=f"{what}.structure", process_set=process_set
    )
    ranks = process_set.ranks
    roots = [theirs for theirs, _ in gathered]
    if len(set(roots)) > 1:
        raise ValueError(f"{what}: the ranks {ranks} name the roots {roots}: pass the same one")
    if root_rank not in ranks:
        raise ValueError(f"{what}: root_rank {root_rank} is not in the process set {ranks}")
    everyone = [theirs for _, theirs in gathered]
    root = everyone[ranks.index(root_rank)]
    differ = [rank for rank, theirs in zip(ranks, everyone) if theirs != root]
    if differ:
        theirs = everyone[ranks.index(differ[0])]
        raise ValueError(
            f"{what}: the pytree on rank(s) {differ} differs from root rank {root_rank}'s: "
            f"{_first_difference(theirs, root)}"
        )
    is_array = [isinstance(leaf, _ARRAYS) for leaf in leaves]
    objects = [leaf for leaf, array in zip(leaves, is_array) if not array]
    if objects:
        name = f"{what}.objects"
        objects = core.broadcast_object(objects, root_rank, name=name, process_set=process_set)
    # A typed PRNG key (jax.random.key) travels as its key data.
    wires = [jax.random.key_data(leaf) if _is_key(leaf) else leaf for leaf in leaves]
    arrays = host_arrays([wire for wire, array in zip(wires, is_array) if array])
    handles = [
        core.broadcast_async(array, root_rank, name=f"{what}.{i}", process_set=process_set)
        for i, array in enumerate(arrays)
    ]
    received = iter(core.synchronize(handle) for handle in handles)
    objects = iter(objects)
    out = []
    for leaf, array in zip(leaves, is_array):
        if not array:
            out.append(next(objects))
        elif isinstance(leaf, jax.Array):
            value = jax.device_put(next(received), leaf.sharding)
            if _is_key(leaf):
                value = jax.random.wrap_key_data(value, impl=jax.random.key_impl(leaf))
            out.append(value)
        else:
            out.append(np.asarray(next(received), dtype=leaf.dtype).reshape(np.shape(leaf)))
    return jax.tree.unflatten(treedef, out)


def _is_key(leaf) -> bool:
    return isinstance(leaf, jax.Array) and jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.prng_key)


def _first_difference(theirs, root) -> str:
    (their_tree, their_leaves), (root_tree, root_leaves) = theirs, root
    if their_tree != root_tree:
        return f"its structure is {their_tree}, the root's {root_tree}"
    for i, (mine, its) in enumerate(zip(their_leaves, root_leaves)):
        if mine != its:
            return f"leaf {i} is {mine}, the root's {its}"
    return "it differs"


def broadcast_parameters(params, root_rank=0, process_set=global_process_set):
    """Return `params`, any pytree of arrays, as `root_rank` holds it (outside jax.jit).

    Every rank must pass a pytree of the same structure, shapes and dtypes; a rank whose tree
    differs raises ValueError on every rank.
    """
    return _broadcast_tree("broadcast_parameters", params, root_rank, process_set)


broadcast_variables = broadcast_parameters


def broadcast_optimizer_state(opt_state, root_rank=0, process_set=global_process_set):
    """Return the optax state `opt_state` as `root_rank` holds it (outside jax.jit).

    The whole state travels (step counts, moments, accumulated gradients): after it every rank
    continues exactly as the root, whether the root's state is new or loaded from a checkpoint.
    Nothing steps: an optax state is a pytree, created by `init` alike on every rank.
    """
    return _broadcast_tree("broadcast_optimizer_state", opt_state, root_rank, process_set)


def broadcast_object(obj, root_rank=0, name=None, process_set=global_process_set):
    """Return `root_rank`'s picklable `obj` on every rank (outside jax.jit)."""
    refuse_in_trace("broadcast_object", "it moves Python objects, which a trace cannot hold")
    host_arrays(())  # after this rank's dispatched collectives
    return core.broadcast_object(obj, root_rank, name=name, process_set=process_set)


def allgather_object(obj, name=None, process_set=global_process_set) -> list:
    """Return every rank's picklable `obj`, in rank order (outside jax.jit)."""
    refuse_in_trace("allgather_object", "it moves Python objects, which a trace cannot hold")
    host_arrays(())
    return core.allgather_object(obj, name=name, process_set=process_set)
