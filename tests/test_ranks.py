"""Run every multi-rank test module in tests/ranks/ under mpiexec at 1, 2, 3 and 4 ranks.

Each launch runs one or more modules as one pytest session on every rank at once (collectives
need all ranks), under a timeout. A failure shows the output of all ranks, each line prefixed by
its rank. Starting torch or TensorFlow costs seconds of CPU per rank, more than most modules' tests:
the modules that import one run together, one launch per rank count, so each rank pays it once.
"""

import pathlib
import shutil

import pytest
from mpirun import RANK_COUNTS, run_ranks

RANKS_DIR = pathlib.Path(__file__).parent / "ranks"
MODULES = sorted(p.name for p in RANKS_DIR.glob("rank_*.py"))

# numpy and mpi4py only: cheap to start, run at every rank count.
CORE = ["rank_adasum.py", "rank_allreduce.py", "rank_collectives.py", "rank_engine.py",
        "rank_errors.py", "rank_join.py", "rank_point_to_point.py", "rank_process_sets.py",
        "rank_property.py", "rank_staging.py", "rank_state.py"]  # fmt: skip
TORCH = ["rank_adasum_torch.py", "rank_elastic.py", "rank_gradients_torch.py", "rank_pipeline.py",
         "rank_torch.py", "rank_torch_parity.py", "rank_torch_training.py",
         "rank_zero.py"]  # fmt: skip
# Training against one process for every torch.optim optimizer (2.5 minutes a launch): at 1 rank
# and at 3 (odd, and its uneven batch split and ZeRO shards do not divide evenly); the same code
# at 2 and 4 ranks proves nothing 3 does not (rank_zero.py and rank_torch_training.py run there).
EQUIVALENCE_TORCH = "rank_equivalence_torch.py"
# On 1 rank no transport moves anything.
TRANSPORT = "rank_transport.py"
TENSORFLOW = ["rank_keras.py", "rank_tensorflow.py", "rank_adasum_tensorflow.py",
              "rank_tensorflow_graphs.py", "rank_gradients_tensorflow.py"]  # fmt: skip
# The gradients of the collectives against one process (docs/equivalence.md) hold at every rank
# count: at 1 and 4 ranks too, alone.
GRADIENTS_TENSORFLOW = "rank_gradients_tensorflow.py"
# Training against one process, in float64. At 3 ranks after rank_keras.py and before
# rank_tensorflow.py's Keras layers: float64 after float32 and float32 after float64 must both hold
# (Keras fixes its dtype policy at first use; rank_equivalence_keras.py sets and restores it).
TENSORFLOW_3 = ["rank_keras.py", "rank_equivalence_keras.py", "rank_equivalence_tensorflow.py",
                *TENSORFLOW[1:]]  # fmt: skip
# torch.compile costs seconds per rank: the compiled model is checked at 2 ranks only.
COMPILED = "test_compiled_model_trains_as_the_uncompiled_one"
# JAX takes seconds per rank to import and compiles every jitted case: its modules run together,
# at 2 and 3 ranks (70 and 100 s on 2 cores), and training against one process alone at 1 rank
# (15 s). At 4 ranks (2 minutes, oversubscribed) they are run by hand.
JAX = ["rank_jax.py", "rank_gradients_jax.py", "rank_jax_equivalence.py", "rank_jax_elastic.py"]

# (name, modules, rank count, tests left out as a -k expression): one launch each.
LAUNCHES = [
    ("core", CORE, np, "") for np in RANK_COUNTS
] + [
    ("torch", TORCH + [EQUIVALENCE_TORCH] * (np in (1, 3)) + [TRANSPORT] * (np > 1), np,
     "" if np == 2 else f"not {COMPILED}")
    for np in RANK_COUNTS
] + [
    # TensorFlow takes ~8 s of CPU per rank to import: at 2 and 3 ranks. Training against one
    # process at 3 only (odd, batches split unevenly), as test_keras_backends.py on the torch
    # backend; the examples train Keras and TF at 2.
    ("tensorflow", TENSORFLOW, 2, ""), ("tensorflow", TENSORFLOW_3, 3, "")
] + [
    ("tensorflow-gradients", [GRADIENTS_TENSORFLOW], np, "") for np in (1, 4)
] + [
    # Lightning's import and Trainer set-up take seconds per rank too; it sets torch state of
    # its own (mixed precision), so it runs alone. At 3 ranks (odd, a last group of one batch):
    # test_examples_lightning.py trains, tests and checkpoints at 2.
    ("lightning", ["rank_lightning.py"], 3, "")
] + [
    ("jax", JAX, np, "") for np in (2, 3)
] + [
    ("jax-equivalence", ["rank_jax_equivalence.py"], 1, "")
] + [
    # Without an NVIDIA driver these skip (below); the parameter server tests are run as before.
    (module[: -len(".py")], [module], np, "") for module in ("rank_gpu.py", "rank_ps.py")
    for np in RANK_COUNTS
]  # fmt: skip
# Without an NVIDIA driver (nvidia-smi) every test in rank_gpu.py would skip on every rank: skip
# the launches instead. With one, rank_gpu.py skips what its ranks cannot run (CuPy, torch CUDA).
NO_GPU = pytest.mark.skipif(shutil.which("nvidia-smi") is None, reason="needs an NVIDIA GPU")
CASES = [
    pytest.param(
        modules, np, deselect, id=f"{name}-{np}", marks=NO_GPU if "rank_gpu.py" in modules else ()
    )
    for name, modules, np, deselect in LAUNCHES
]
# The torch tests again with torch.distributed's Gloo moving the data (docs/gpu.md): the CPU twin
# of the NCCL transport, so the seam and everything above it run in CI (ZeroOptimizer's shards
# then go as tensors: tensor_plans.py). At 3 ranks: rank_transport runs every core collective
# over Gloo at 2, 3 and 4.
GLOO = {"HOROVODLITE_TRANSPORT": "gloo"}
GLOO_CASES = [
    pytest.param(
        ["rank_torch.py", "rank_torch_training.py", "rank_gradients_torch.py", "rank_zero.py"],
        3,
        id="gloo-torch-3",
    )
]


def test_every_module_is_launched():
    launched = {module for _, modules, _, _ in LAUNCHES for module in modules}
    assert launched == set(MODULES), set(MODULES) ^ launched


@pytest.mark.mpi
@pytest.mark.parametrize("modules, np, deselect", CASES)
def test_modules_on_ranks(modules, np, deselect):
    _run_modules(modules, np, deselect)


@pytest.mark.mpi
@pytest.mark.parametrize("modules, np", GLOO_CASES)
def test_torch_modules_over_gloo(modules, np):
    pytest.importorskip("torch")
    _run_modules(modules, np, env=GLOO)


def _run_modules(modules: list, np: int, deselect: str = "", env: dict = None) -> None:
    result = run_ranks(
        np,
        # Hypothesis's pytest plugin imports hypothesis at start-up, a second of CPU per rank;
        # rank_property.py uses hypothesis without it.
        ["-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:hypothesispytest",
         "-o", "python_files=rank_*.py", "--rootdir", str(RANKS_DIR),
         *(["-k", deselect] if deselect else []), *(str(RANKS_DIR / m) for m in modules)],
        # 4 minutes for a module alone, 3 more for each module beside it in the session (on a
        # 2-core machine under a load of 30, 4 TensorFlow modules at 3 ranks took 495 s).
        timeout=240 + 180 * (len(modules) - 1),
        env=env,
    )  # fmt: skip
    where = f"{np} ranks" + (f" with {env}" if env else "")
    assert result.returncode == 0, f"{modules} failed on {where}:\n{result.stdout[-20000:]}"
