"""The wheel built from the repository ships every subpackage, the kernel sources and the Hydra configs."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_wheel_contains_kernel_sources_and_configs(tmp_path):
    # Built from a clean copy: a checkout's leftover build/ folder would supply files the
    # package list forgot.
    source = tmp_path / "source"
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for name in ("sru_lightning", "csrc", "conf", "hydra_plugins"):
        shutil.copytree(REPO / name, source / name, ignore=ignore)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, source / name)
    built = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            str(source),
            "--no-deps",
            "--no-build-isolation",
            "--quiet",
            "-w",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
    )
    assert built.returncode == 0, built.stderr[-3000:]
    # What a user installing the package reads: no warnings of the build backend (a config group
    # missing from pyproject.toml's packages, a deprecated field).
    backend_warnings = [line for line in built.stderr.splitlines() if "Warning" in line and "Location" not in line]
    assert backend_warnings == [], "\n".join(backend_warnings)
    (wheel,) = tmp_path.glob("sru_lightning-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())

    expected_sources = {p.name for p in (REPO / "csrc").iterdir() if p.suffix in {".h", ".cpp", ".cu"}}
    assert {"sru_step.h", "sru_cuda_kernels.cu", "sru_ops.cpp"} <= expected_sources
    for name in expected_sources:
        assert f"sru_lightning/csrc/{name}" in names, f"{name} missing from the wheel"

    subpackages = {p.parent.relative_to(REPO).as_posix() for p in (REPO / "sru_lightning").rglob("__init__.py")}
    assert {"sru_lightning/ops", "sru_lightning/precision"} <= subpackages
    for package in subpackages:
        assert f"{package}/__init__.py" in names, f"{package} missing from the wheel (list it in pyproject.toml)"

    # Hydra finds the search's sweeper only inside the hydra_plugins namespace (no __init__.py there)
    assert "hydra_plugins/sru_lightning_search/__init__.py" in names
    assert "hydra_plugins/__init__.py" not in names

    expected_configs = {str(p.relative_to(REPO / "conf")) for p in (REPO / "conf").rglob("*.yaml")}
    assert "config.yaml" in expected_configs and len(expected_configs) > 5
    for rel in expected_configs:
        assert f"sru_lightning/conf/{rel}" in names, f"conf/{rel} missing from the wheel"


def test_resources_resolve_in_checkout():
    from sru_lightning._resources import conf_dir, csrc_dir

    assert (csrc_dir() / "sru_step.h").is_file()
    assert (conf_dir() / "config.yaml").is_file()
