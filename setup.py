"""Install horovodlite: the core package plus the framework bindings under horovodlite.*."""

import os

from setuptools import find_packages, setup

HERE = os.path.dirname(os.path.abspath(__file__))

# bindings/<framework> installs as horovodlite.<framework>; only those present are packaged.
BINDINGS = [
    name
    for name in ("torch", "tensorflow", "keras", "lightning", "jax")
    if os.path.isfile(os.path.join(HERE, "bindings", name, "__init__.py"))
]
packages = find_packages(include=["horovodlite", "horovodlite.*"])
package_dir = {"horovodlite": "horovodlite"}
for b in BINDINGS:
    # A binding's subpackages too (horovodlite.tensorflow.keras, Horovod's Keras module path).
    subpackages = find_packages(where=os.path.join(HERE, "bindings", b))
    packages += [f"horovodlite.{b}"] + [f"horovodlite.{b}.{sub}" for sub in subpackages]
    package_dir[f"horovodlite.{b}"] = f"bindings/{b}"


def read_version() -> str:
    with open(os.path.join(HERE, "horovodlite", "version.py")) as f:
        namespace: dict = {}
        exec(f.read(), namespace)
    return namespace["__version__"]


extras = {
    "mpich": ["mpich"],
    # CuPy 13 and later: staging copies down on the current stream without waiting (`get`'s
    # `blocking`) and up on it (`set`), as horovodlite/staging.py queues them.
    "cuda": ["cupy-cuda12x>=13", "nvidia-nccl-cu12"],
    "torch": ["torch>=2.1"],
    "tensorflow": ["tensorflow>=2.16", "keras>=3"],
    "lightning": ["torch>=2.1", "pytorch-lightning>=2.6"],
    "jax": ["jax>=0.10", "optax>=0.2.8"],
    "test": ["pytest>=7", "pytest-timeout", "hypothesis"],
    "docs": ["mkdocs>=1.5"],
    "bench": ["matplotlib", "tqdm"],
}
extras["all"] = sorted({req for reqs in extras.values() for req in reqs})

setup(
    name="horovodlite",
    version=read_version(),
    description="Data-parallel training on MPI in pure Python: a drop-in successor to Horovod.",
    long_description=open(os.path.join(HERE, "README.md")).read()
    if os.path.exists(os.path.join(HERE, "README.md"))
    else "",
    long_description_content_type="text/markdown",
    python_requires=">=3.9",
    packages=packages,
    package_dir=package_dir,
    install_requires=["mpi4py>=4", "numpy", "ml_dtypes", "cloudpickle"],
    extras_require=extras,
    entry_points={"console_scripts": ["horovodlite-run=horovodlite.run:main"]},
    license="Apache-2.0",
)
