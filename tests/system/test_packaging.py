"""The distributions: the sdist carries what its own tests need, the wheel its types and kernel
sources, and the metadata one version, an SPDX licence and extras that cannot conflict.

Both are built here with setuptools' PEP 517 backend of this environment, without a network
(``setuptools.build_meta``, as ``python -m build --no-isolation`` calls it).
"""

from __future__ import annotations

import email
import os
import subprocess
import sys
import tarfile
import tomllib
import zipfile
from pathlib import Path

import pytest

import opruntime

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
KERNEL_SOURCES = (".cu", ".cuh", ".cl")
SKIP_DIRS = {"__pycache__", "build", ".pytest_cache", ".hypothesis"}

setuptools = pytest.importorskip("setuptools")
if int(setuptools.__version__.split(".")[0]) < 77:
    pytest.skip("building needs setuptools>=77 (PEP 639 licence metadata), as pyproject's build-system says",
                allow_module_level=True)


def _build(kind: str, source: Path, out: Path) -> Path:
    """``kind`` ("sdist" or "wheel") of the project at ``source``, built by setuptools' backend in a
    child process (it writes into the current directory and imports the project's configuration)."""
    code = f"import sys; from setuptools import build_meta; print(build_meta.build_{kind}(sys.argv[1]))"
    proc = subprocess.run([sys.executable, "-c", code, str(out)], cwd=source, capture_output=True, text=True,
                          timeout=300, env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"})
    assert proc.returncode == 0, f"build_{kind} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return out / proc.stdout.strip().splitlines()[-1]


def _files(top: Path, under: str, suffixes: tuple[str, ...] | None = None) -> set[str]:
    """The files below ``top/under`` (relative to ``top``), outside caches and build folders."""
    found = set()
    for path in (top / under).rglob("*"):
        rel = path.relative_to(top)
        if path.is_file() and not SKIP_DIRS & set(rel.parts) and not any(p.endswith(".egg-info") for p in rel.parts) \
                and path.suffix not in (".pyc", ".so") and (suffixes is None or path.suffix in suffixes):
            found.add(rel.as_posix())
    return found


@pytest.fixture(scope="module")
def sdist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The sdist of this tree, unpacked: the folder ``opruntime-<version>``."""
    out = tmp_path_factory.mktemp("sdist")
    archive = _build("sdist", ROOT, out)
    with tarfile.open(archive) as tar:
        tar.extractall(out, filter="data")
    (top,) = [p for p in out.iterdir() if p.is_dir()]
    return top


def test_the_sdist_holds_what_its_tests_need(sdist: Path) -> None:
    assert sdist.name == f"opruntime-{opruntime.__version__}"
    needed = _files(ROOT, "tests") | _files(ROOT, "examples") | _files(ROOT, "backends", KERNEL_SOURCES)
    needed |= {"tests/conftest.py", "tests/fake_backend.py", "LICENSE", "README.md", "pyproject.toml",
               "opruntime/py.typed", "docs/gen_reference.py", "scripts/compile_cu.py", "scripts/gen_samples.py"}
    needed |= {p.relative_to(ROOT).as_posix() for p in (ROOT / "docs").glob("*.md")}  # the pages tests compare
    missing = sorted(n for n in needed if not (sdist / n).is_file())
    assert not missing, f"the sdist lacks {missing}: add them to MANIFEST.in"
    assert not list(sdist.rglob("__pycache__")), "the sdist carries __pycache__ folders"


def test_the_wheel_holds_the_types_the_kernels_and_the_licence(sdist: Path, tmp_path: Path) -> None:
    wheel = _build("wheel", sdist, tmp_path)  # from the sdist, as pip builds it
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        meta = email.message_from_bytes(zf.read(next(n for n in names if n.endswith(".dist-info/METADATA"))))
    assert "opruntime/py.typed" in names
    sources = {n for n in _files(ROOT, "backends", KERNEL_SOURCES)}
    assert sources and {s.removeprefix("backends/") for s in sources} <= names, "kernel sources missing from the wheel"
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)
    assert meta["Version"] == opruntime.__version__
    assert meta["License-Expression"] == "Apache-2.0" and "License" not in meta  # SPDX, not the old free text
    urls = dict(u.split(", ", 1) for u in meta.get_all("Project-URL"))
    assert {"Documentation", "Source", "Issues"} <= set(urls)
    assert "Typing :: Typed" in meta.get_all("Classifier")


def test_one_version_source() -> None:
    from importlib.metadata import version

    assert "version" in PYPROJECT["project"]["dynamic"] and "version" not in PYPROJECT["project"]
    assert PYPROJECT["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "opruntime._version.__version__"}
    assert opruntime.__version__ == version("opruntime")


def test_license_is_the_full_apache_text() -> None:
    text = (ROOT / "LICENSE").read_text()
    assert text.lstrip().startswith("Apache License") and "Version 2.0, January 2004" in text
    assert "END OF TERMS AND CONDITIONS" in text and "9. Accepting Warranty or Additional Liability." in text
    assert PYPROJECT["project"]["license"] == "Apache-2.0" and PYPROJECT["project"]["license-files"] == ["LICENSE"]


def test_cuda_extras_never_mix_cuda_versions() -> None:
    """cupy-cuda12x and cupy-cuda13x install the same module: no extra may pull both, or a CUDA 12
    package into the CUDA 13 extra (and the reverse), and ``all`` holds no CUDA extra."""
    extras = PYPROJECT["project"]["optional-dependencies"]
    assert "cuda" not in extras, "an unversioned `cuda` extra picks one CUDA for every machine"
    for major, other in (("12", "13"), ("13", "12")):
        reqs = " ".join(extras[f"cuda{major}"])
        assert f"cupy-cuda{major}x" in reqs and f"cu{other}" not in reqs and f"cuda{other}" not in reqs
        assert "cudnn" in reqs and "nvmath" in reqs  # the vendor candidates of the CUDA backend
        assert all("sys_platform == 'linux'" in r for r in extras[f"cuda{major}"]), "CUDA has no macOS wheels"
    assert not any("cuda" in r or "cupy" in r for r in extras["all"])
    assert set(extras["dev"]) == {"opruntime[test,lint,docs,plot]"}


def test_makefile_extras_exist() -> None:
    """The Makefile installs .venv with ``EXTRAS``: each must be an extra of pyproject."""
    line = next(ln for ln in (ROOT / "Makefile").read_text().splitlines() if ln.startswith("EXTRAS"))
    wanted = line.split("=", 1)[1].strip().split(",")
    assert set(wanted) <= set(PYPROJECT["project"]["optional-dependencies"]), wanted
