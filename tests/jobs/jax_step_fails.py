"""Rank 1 fails during jitted training (argv[1] says how) while the others wait in the step's
all-reduce, inside XLA (the custom call of DistributedOptimizer's all-reduce).

Ways to fail, at step 2: `raise` (a RuntimeError inside rank 1's jitted step, from a callback:
JAX raises it as a JaxRuntimeError), `raise-between` (a RuntimeError between two steps), `exit`
(sys.exit(0) between two steps), `kill` (SIGKILL inside rank 1's jitted step).
"""

import os
import signal
import sys
import time

import horovodlite.jax as hvd
import jax
import jax.numpy as jnp
import optax
from jax.experimental import io_callback

FAIL_AT = 2


def main() -> None:
    how = sys.argv[1]
    hvd.init()
    rank = hvd.rank()
    tx = hvd.DistributedOptimizer(optax.sgd(0.1))
    params = hvd.broadcast_parameters({"w": jnp.ones(3)}, root_rank=0)
    opt_state = tx.init(params)

    def fail_in_step(step):
        if rank == 1 and int(step) == FAIL_AT:
            time.sleep(0.3)  # the others wait in the all-reduce by now
            if how == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            raise RuntimeError("rank 1 fails on purpose")

    @jax.jit
    def train_step(params, opt_state, step):
        if how in ("raise", "kill"):
            io_callback(fail_in_step, None, step, ordered=True)
        grads = jax.grad(lambda p: jnp.sum(p["w"] ** 2))(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state

    print(f"rank {rank} ready, pid {os.getpid()}", flush=True)
    for step in range(4):
        if how in ("raise-between", "exit") and rank == 1 and step == FAIL_AT:
            time.sleep(0.3)
            if how == "exit":
                sys.exit(0)
            raise RuntimeError("rank 1 fails on purpose")
        start = time.monotonic()
        try:
            params, opt_state = jax.block_until_ready(train_step(params, opt_state, step))
        except (RuntimeError, ValueError) as exc:  # ValueError: JAX's C++ dispatch (jax#34083)
            last = str(exc).strip().splitlines()[-1]
            print(f"rank {rank} raised after {time.monotonic() - start:.1f} s: {last}", flush=True)
            raise
    print(f"rank {rank} was not stopped", flush=True)


main()
