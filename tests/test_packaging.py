"""The package layout: bindings/<framework> installs as horovodlite.<framework>."""

import importlib.util
import pathlib
import subprocess
import sys
import zipfile

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
BINDINGS = sorted(p.parent.name for p in ROOT.glob("bindings/*/__init__.py"))


def test_wheel_maps_bindings_into_the_package(tmp_path):
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
         "-w", str(tmp_path), str(ROOT)],
        check=True, timeout=300,
    )  # fmt: skip
    (wheel,) = tmp_path.glob("horovodlite-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert "horovodlite/__init__.py" in names
    assert "horovodlite/algorithms/ring.py" in names
    assert BINDINGS, "no binding found under bindings/"
    for binding in BINDINGS:
        assert f"horovodlite/{binding}/__init__.py" in names
    assert not any(name.startswith("bindings/") for name in names)


@pytest.mark.parametrize("binding", BINDINGS)
def test_installed_binding_resolves_to_bindings_folder(binding):
    spec = importlib.util.find_spec(f"horovodlite.{binding}")
    assert spec is not None, f"horovodlite.{binding} is not installed: pip install -e ."
    assert pathlib.Path(spec.origin).resolve() == ROOT / "bindings" / binding / "__init__.py"
