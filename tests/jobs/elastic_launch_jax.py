"""A deterministic elastic JAX job for the launcher's tests: hvd.elastic.run and JaxState.

    elastic_launch_jax.py OUT [--kill-step S] [--reference]

A linear model learns y = X w (float64) with SGD with momentum through DistributedOptimizer
(op=Sum), in a jitted step, committing every 2 steps. Step k trains on 12 samples that a PRNG
key in the state picks; each rank takes every size-th of them and sums its squared errors over
12, so the summed gradient is the batch's mean whatever the size: a job that loses a rank and
resumes smaller ends where one process ends (`--reference`: plain optax, no horovodlite), up to
the order of the sums. On the first run (HOROVODLITE_ELASTIC_RESTART=0) rank 1 SIGKILLs itself
before step S while the others wait in the step's all-reduce. Every rank appends one JSON line a
step to OUT/steps.jsonl ({restart, size, rank, step}); rank 0 (or the reference) writes the final
parameters to OUT/final.json.
"""

import argparse
import json
import os
import signal
import time

import jax

jax.config.update("jax_enable_x64", True)
import horovodlite.jax as hvd  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import optax  # noqa: E402

SAMPLES, FEATURES, BATCH, STEPS = 48, 4, 12, 8


def data():
    x = jax.random.normal(jax.random.key(1), (SAMPLES, FEATURES), dtype=jnp.float64)
    return x, x @ jnp.arange(1.0, FEATURES + 1)


def batch(key):
    """Return the next key and the indices of the step's batch (the same on every rank)."""
    key, pick = jax.random.split(key)
    return key, jax.random.choice(pick, SAMPLES, (BATCH,), replace=False)


def loss(params, x, y):
    return jnp.sum((x @ params["w"] + params["b"] - y) ** 2) / BATCH


def start():
    params = {"w": jnp.zeros(FEATURES), "b": jnp.zeros(())}
    return params, jax.random.key(2)


OPTIMIZER = optax.sgd(0.05, momentum=0.9)


def reference(out: str) -> None:
    x, y = data()
    params, key = start()
    opt_state = OPTIMIZER.init(params)
    for _ in range(STEPS):
        key, rows = batch(key)
        grads = jax.grad(loss)(params, x[rows], y[rows])
        updates, opt_state = OPTIMIZER.update(grads, opt_state, params)
        params = optax.apply_updates(params, updates)
    write_final(out, params, size=1, steps=STEPS)


def write_final(out: str, params, size: int, steps: int) -> None:
    values = [float(v) for leaf in jax.tree.leaves(params) for v in jnp.ravel(leaf)]
    with open(os.path.join(out, "final.json"), "w") as f:
        json.dump({"params": values, "size": size, "steps": steps}, f)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--kill-step", type=int, default=0)
    parser.add_argument("--reference", action="store_true")
    args = parser.parse_args()
    if args.reference:
        return reference(args.out)

    hvd.init()
    restart = int(os.environ.get("HOROVODLITE_ELASTIC_RESTART", "0"))
    x, y = data()
    tx = hvd.DistributedOptimizer(OPTIMIZER, op=hvd.Sum)
    params, key = start()
    state = hvd.elastic.JaxState(params=params, opt_state=tx.init(params), key=key, step=0)
    log = open(os.path.join(args.out, "steps.jsonl"), "a")

    @jax.jit
    def train_step(params, opt_state, x, y):
        grads = jax.grad(loss)(params, x, y)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state

    @hvd.elastic.run
    def train(state):
        while state.step < STEPS:
            step = state.step + 1
            if restart == 0 and step == args.kill_step and hvd.rank() == 1:
                time.sleep(0.5)  # the others wait in the step's all-reduce by now
                os.kill(os.getpid(), signal.SIGKILL)
            state.key, rows = batch(state.key)
            mine = rows[hvd.rank() :: hvd.size()]
            state.params, state.opt_state = jax.block_until_ready(
                train_step(state.params, state.opt_state, x[mine], y[mine])
            )  # done before it is logged
            state.step = step
            record = {"restart": restart, "size": hvd.size(), "rank": hvd.rank(), "step": step}
            log.write(json.dumps(record) + "\n")
            log.flush()
            if step % 2 == 0:
                state.commit()

    train(state)
    if hvd.rank() == 0:
        write_final(args.out, state.params, size=hvd.size(), steps=state.step)


if __name__ == "__main__":
    main()
