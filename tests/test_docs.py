"""The documentation site builds with `mkdocs build --strict`, and README.md stays a front page.

Strict mode turns every warning into an error: a link to a page or heading that does not
exist, a page left out of the nav, a docstring mkdocstrings cannot read. The shell commands
of README.md and docs/ are checked by tests/test_doc_commands.py.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS_EXTRA = ("mkdocs", "mkdocstrings", "mkdocstrings_handlers.python", "material")


def missing_docs_packages() -> list[str]:
    missing = []
    for name in DOCS_EXTRA:
        try:
            found = importlib.util.find_spec(name) is not None
        except ModuleNotFoundError:  # a parent package is missing
            found = False
        if not found:
            missing.append(name)
    return missing


@pytest.mark.slow  # runs mkdocs in a process
def test_the_docs_site_builds_strictly(tmp_path):
    missing = missing_docs_packages()
    if missing:
        pytest.skip(
            f"mkdocs and its plugins are not installed ({', '.join(missing)} missing): "
            "pip install -e '.[docs]' (make setup installs it)"
        )
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "mkdocs",
            "build",
            "--strict",
            "--config-file",
            str(ROOT / "mkdocs.yml"),
            "--site-dir",
            str(tmp_path / "site"),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1", "DISABLE_MKDOCS_2_WARNING": "true"},
    )
    assert done.returncode == 0, f"mkdocs build --strict failed:\n{done.stdout[-3000:]}\n{done.stderr[-5000:]}"
    site = tmp_path / "site"
    for page in (
        "layers",
        "kernels",
        "precision",
        "cli",
        "sweeps",
        "fault-tolerance",
        "distributed",
        "clusters",
        "deployment",
        "benchmarks",
        "testing",
        "architecture",
    ):
        assert (site / page / "index.html").is_file(), f"docs/{page}.md was not built"
    # The API reference really holds the docstrings (not just the page titles).
    api = (site / "api" / "nn" / "index.html").read_text()
    assert "set_recurrence_policy" in api and "SRUpp" in api
    # Every public name of a lazily importing package has its entry (the docs tool reads the
    # source, where such a package's names are not defined).
    import importlib

    for package in ("data",):
        page = (site / "api" / package / "index.html").read_text()
        names = importlib.import_module(f"sru_lightning.{package}").__all__
        missing = [name for name in names if not re.search(rf'id="sru_lightning\.{package}\.\w+\.{name}"', page)]
        assert not missing, f"docs/api/{package}.md documents none of {missing}"


def test_every_docs_page_is_in_the_nav():
    nav = (ROOT / "mkdocs.yml").read_text()
    pages = {p.relative_to(ROOT / "docs").as_posix() for p in (ROOT / "docs").rglob("*.md")}
    assert {page for page in pages if page not in nav} == set()


def test_readme_is_a_front_page():
    text = README.read_text()
    assert len(text.splitlines()) <= 250, "README.md holds what a visitor needs first; details go to docs/"
    first_block = re.search(r"```bash\n(.*?)```", text, re.S).group(1).splitlines()
    assert [line.split("#")[0].strip() for line in first_block[:2]] == ["make run", "make test"]
    assert "`make test`" in text  # .ci/run runs it: the README names it as the test command


def test_readme_links_point_at_files_that_exist():
    text = README.read_text()
    targets = re.findall(r"\]\(([^)\s]+)\)", text)
    assert any(t.startswith("docs/") for t in targets), "the README links to the docs pages"
    for target in targets:
        if re.match(r"[a-z]+://", target) or target.startswith("#"):
            continue
        path = target.split("#")[0]
        assert (ROOT / path).exists(), f"README.md links to {target}, which does not exist"
