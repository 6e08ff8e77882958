"""The names of a run directory's files and folders are spelled in one place, on
:class:`~sru_lightning.app.runs.folder.RunFolder`; every other module of the application asks
it. Checked on the source of sru_lightning/app.

What counts as spelling a name: a string literal of code (f-string parts included) that is
the name, or holds a file name (`result.json`, `.hydra`, ...) or `checkpoints/` inside it (a
message naming `.hydra/config.yaml`). Docstrings are prose for readers and are not checked;
comments are not part of the syntax tree and are not checked either."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from sru_lightning.app.runs.folder import RunFolder

APP_DIR = Path(__file__).resolve().parents[2] / "sru_lightning" / "app"
FOLDER_MODULE = APP_DIR / "runs" / "folder.py"

#: Literals that equal a layout name but mean something else, with why.
ALLOWED = {
    ("runs/checkpoint_index.py", "checkpoints"): "the index file's JSON key for its entries, not the folder",
}


def docstrings(tree: ast.AST) -> set[int]:
    """The ids of the string nodes that are docstrings (of the module, a class or a function)."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                found.add(id(first.value))
    return found


def spelled_names(text: str, names: tuple[str, ...]) -> list[str]:
    """The layout names `text` spells: a name it equals, or inside it a file name (one with a
    dot) or a folder followed by `/`, as a whole path part (`.hydra_plugins` is not `.hydra`)."""
    found = []
    for name in names:
        tail = r"(?![\w-])" if "." in name else "/"
        if text == name or re.search(r"(?<![\w.-])" + re.escape(name) + tail, text):
            found.append(name)
    return found


def spellings(path: Path, names: tuple[str, ...]) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(), filename=str(path))
    skipped = docstrings(tree)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skipped:
            found.extend((node.lineno, name) for name in spelled_names(node.value, names))
    return found


def test_the_layout_names_are_the_run_folders():
    assert {"result.json", "history.jsonl", "checkpoints", "checkpoints.json", ".hydra"} <= set(RunFolder.LAYOUT_NAMES)


def test_the_checker_sees_a_name_in_code_and_not_in_a_docstring(tmp_path):
    module = tmp_path / "module.py"
    module.write_text(
        '"""Reads result.json."""\n'
        "def f(run):\n"
        '    """Its checkpoints/ folder."""\n'
        '    return run / "result.json", f"{run}/.hydra/config.yaml", run / "checkpoints"  # result.json\n'
        'MESSAGE = "it holds no checkpoints", "hydra_plugins.hydra_submitit_launcher", "sweep/result.jsonl"\n'
    )
    assert sorted(spellings(module, RunFolder.LAYOUT_NAMES)) == [
        (4, ".hydra"),
        (4, "checkpoints"),
        (4, "config.yaml"),
        (4, "result.json"),
    ]


def test_no_application_module_but_the_run_folders_spells_a_layout_name():
    found = []
    for path in sorted(APP_DIR.rglob("*.py")):
        if path == FOLDER_MODULE:
            continue
        where = path.relative_to(APP_DIR).as_posix()
        found.extend(
            f"{where}:{line}: {name!r}"
            for line, name in spellings(path, RunFolder.LAYOUT_NAMES)
            if (where, name) not in ALLOWED
        )
    assert found == [], "ask RunFolder for these names:\n" + "\n".join(found)
