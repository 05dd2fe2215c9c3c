"""Run every multi-rank test module in tests/ranks/ under mpiexec with 1, 2, 3 and 4 ranks.

Each module runs as a pytest session on every rank at once (collectives need all ranks), under a
timeout. A failure shows the output of all ranks, each line prefixed by its rank.
"""

import pathlib
import shutil

import pytest
from mpirun import RANK_COUNTS, run_ranks

RANKS_DIR = pathlib.Path(__file__).parent / "ranks"
MODULES = sorted(p.name for p in RANKS_DIR.glob("rank_*.py"))
# TensorFlow takes seconds per rank to import: these modules run at fewer rank counts.
RANK_COUNTS_FOR = {
    "rank_keras.py": (2, 3),
    "rank_tensorflow.py": (2, 3),
    "rank_adasum_tensorflow.py": (2, 3),
    "rank_tensorflow_graphs.py": (2, 3),
    "rank_transport.py": (2, 3, 4),  # on 1 rank no transport moves anything
    "rank_equivalence_keras.py": (2, 3),
    "rank_equivalence_tensorflow.py": (2, 3),
    # Lightning's import and Trainer set-up take seconds per rank too.
    "rank_lightning.py": (2, 3),
}
# Without an NVIDIA driver (nvidia-smi) every test in rank_gpu.py would skip on every rank: skip
# the launches instead. With one, rank_gpu.py skips what its ranks cannot run (CuPy, torch CUDA).
NO_GPU = pytest.mark.skipif(shutil.which("nvidia-smi") is None, reason="needs an NVIDIA GPU")
CASES = [
    pytest.param(module, np, marks=NO_GPU if module == "rank_gpu.py" else ())
    for module in MODULES
    for np in RANK_COUNTS_FOR.get(module, RANK_COUNTS)
]
# The torch tests again with torch.distributed's Gloo moving the data (docs/gpu.md): the CPU twin
# of the NCCL transport, so the seam and everything above it run in CI.
GLOO = {"HOROVODLITE_TRANSPORT": "gloo"}
GLOO_CASES = [
    pytest.param(module, np, id=f"gloo-{module}-{np}")
    for module in ("rank_torch.py", "rank_torch_training.py")
    for np in (2, 3, 4)
]


@pytest.mark.mpi
@pytest.mark.parametrize("module, np", CASES)
def test_module_on_ranks(module, np):
    _run_module(module, np)


@pytest.mark.mpi
@pytest.mark.parametrize("module, np", GLOO_CASES)
def test_torch_module_over_gloo(module, np):
    pytest.importorskip("torch")
    _run_module(module, np, env=GLOO)


def _run_module(module: str, np: int, env: dict = None) -> None:
    result = run_ranks(
        np,
        # Hypothesis's pytest plugin imports hypothesis at start-up, a second of CPU per rank;
        # rank_property.py uses hypothesis without it.
        ["-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:hypothesispytest",
         "-o", "python_files=rank_*.py", "--rootdir", str(RANKS_DIR), str(RANKS_DIR / module)],
        timeout=240,
        env=env,
    )  # fmt: skip
    where = f"{np} ranks" + (f" with {env}" if env else "")
    assert result.returncode == 0, f"{module} failed on {where}:\n{result.stdout[-20000:]}"
