"""The architecture holds: no import cycle, no framework in the core, small modules.

Every import statement of horovodlite/ and bindings/ counts, at module level and inside
functions alike: an import that runs late still ties two modules together. The layer order
itself is enforced by import-linter in CI (pyproject.toml, docs/architecture.md).
"""

import ast
import graphlib
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
FRAMEWORKS = ("torch", "tensorflow", "keras")
MAX_MODULE_LINES = 500


def _module_name(path: pathlib.Path) -> str:
    """Return the installed name of a source file: bindings/torch/x.py is horovodlite.torch.x."""
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[0] == "bindings":
        parts[0] = "horovodlite"
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _sources() -> dict:
    files = sorted(ROOT.glob("horovodlite/**/*.py")) + sorted(ROOT.glob("bindings/*/**/*.py"))
    return {_module_name(path): path for path in files}


SOURCES = _sources()


def _from_module(module: str, path: pathlib.Path, node: ast.ImportFrom) -> str:
    """Return the full name of the module a `from ... import` statement in `module` reads."""
    if not node.level:
        return node.module
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    parts = package.split(".")
    package = ".".join(parts[: len(parts) - node.level + 1])
    return f"{package}.{node.module}" if node.module else package


def _imported_modules(module: str, path: pathlib.Path, node) -> list:
    """Return the full names of the modules an import statement in `module` imports."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    base = _from_module(module, path, node)
    # `from pkg import sub` imports the module pkg.sub; `from pkg import name`, pkg itself.
    members = [f"{base}.{alias.name}" for alias in node.names]
    return [name for name in members if name in SOURCES] or [base]


def _own_module(name: str):
    """Return the horovodlite module `name` is or lies in, or None for another package's."""
    while name and name not in SOURCES:
        name = name.rpartition(".")[0]
    return name or None


def import_graph() -> dict:
    """Return {module: set of horovodlite modules it imports}, every import statement counted."""
    graph = {}
    for module, path in SOURCES.items():
        targets = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                targets |= {_own_module(n) for n in _imported_modules(module, path, node)}
        graph[module] = targets - {None, module}
    return graph


def test_every_source_file_is_seen():
    assert "horovodlite.state" in SOURCES and "horovodlite.torch.optimizer" in SOURCES


def test_the_import_graph_resolves_relative_and_member_imports():
    graph = import_graph()
    assert "horovodlite.state" in graph["horovodlite.process_sets"]  # from . import state
    assert "horovodlite.algorithms.scratch" in graph["horovodlite.fusion"]  # from .a.b import x
    assert "horovodlite" in graph["horovodlite.torch.mpi_ops"]  # import horovodlite as core


def test_no_import_cycle():
    """Imports form a DAG: a cycle would name the modules that import each other."""
    sorter = graphlib.TopologicalSorter(import_graph())
    try:
        sorter.prepare()
    except graphlib.CycleError as exc:
        pytest.fail(f"import cycle: {' -> '.join(exc.args[1])}")


def test_the_core_imports_no_framework():
    """The core runs without torch, TensorFlow or Keras: only the bindings import them."""
    offenders = []
    for module, path in SOURCES.items():
        if path.is_relative_to(ROOT / "bindings") or module.startswith("horovodlite.bench"):
            continue  # the benchmarks compare against the frameworks' own parallelism
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                names = _imported_modules(module, path, node)
                offenders += [f"{module}: {n}" for n in names if n.split(".")[0] in FRAMEWORKS]
    assert offenders == []


def test_core_modules_stay_small():
    core = [path for path in SOURCES.values() if path.is_relative_to(ROOT / "horovodlite")]
    long = {
        str(path.relative_to(ROOT)): lines
        for path in core
        if (lines := path.read_text().count("\n")) > MAX_MODULE_LINES
    }
    assert long == {}, f"split these modules by concern (at most {MAX_MODULE_LINES} lines)"


def _private(name: str) -> bool:
    """Whether `name` is private: a leading underscore, but not a dunder (`__version__`)."""
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def test_no_binding_imports_a_private_name_of_horovodlite():
    """A binding uses the core's and the other bindings' public names only.

    What a binding needs from the core or from another binding module is public there (or moves
    to horovodlite/training/), so the core can change its private parts without breaking a
    binding, and a reader sees each module's interface in its public names. Other packages'
    private names (torch's _BatchNorm) are their own affair.
    """
    offenders = []
    for module, path in SOURCES.items():
        if not path.is_relative_to(ROOT / "bindings"):
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = _from_module(module, path, node)
                names = [f"{base}.{alias.name}" for alias in node.names]
            else:
                continue
            offenders += [
                f"{module}:{node.lineno} imports {name}"
                for name in names
                if name.split(".")[0] == "horovodlite" and any(map(_private, name.split(".")))
            ]
    assert offenders == [], "make these public where they live, or move them to the core"


def test_the_private_name_check_sees_relative_and_absolute_imports():
    module, path = "horovodlite.torch.zero", ROOT / "bindings" / "torch" / "zero.py"
    relative = ast.parse("from .optimizer import _hidden, public").body[0]
    absolute = ast.parse("from horovodlite.state import _reader").body[0]
    assert _from_module(module, path, relative) == "horovodlite.torch.optimizer"
    assert _from_module(module, path, absolute) == "horovodlite.state"
    assert _private("_hidden") and _private("_state") and not _private("__version__")
