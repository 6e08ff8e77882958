"""The package is a one-way stack: the library at the bottom, the application on it, the
diagnostics on top (docs/architecture.md). Checked on the source: every `import` statement of
every module, at module level or inside a function, is an edge of the import graph."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE_DIR = Path(__file__).resolve().parents[1] / "sru_lightning"
PACKAGE = PACKAGE_DIR.name

# The layers, bottom first: the application is sru_lightning.app (and `python -m`'s
# __main__), the diagnostics sru_lightning.diagnostics, every other module is library.
APPLICATION = f"{PACKAGE}.app"
DIAGNOSTICS = f"{PACKAGE}.diagnostics"
LAYERS = ("library", "application", "diagnostics")


def layer_of(module: str) -> str:
    if module == f"{PACKAGE}.__main__":  # `python -m sru_lightning`: the application's entry point
        return "application"
    if module == DIAGNOSTICS or module.startswith(DIAGNOSTICS + "."):
        return "diagnostics"
    if module == APPLICATION or module.startswith(APPLICATION + "."):
        return "application"
    return "library"


def module_names() -> dict[str, Path]:
    names = {}
    for path in PACKAGE_DIR.rglob("*.py"):
        parts = path.relative_to(PACKAGE_DIR.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        names[".".join(parts)] = path
    return names


def _resolve(importer: str, is_package: bool, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = importer.split(".")
    if not is_package:
        base = base[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def imports_of(module: str, path: Path, known: set[str]) -> set[str]:
    """The package's modules that `module` imports: `from pkg import sub` counts as an import
    of the submodule `pkg.sub` when it is one, else of `pkg` (whose __init__ defines the name)."""
    found = set()
    is_package = path.name == "__init__.py"
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            source = _resolve(module, is_package, node)
            for alias in node.names:
                submodule = f"{source}.{alias.name}"
                found.add(submodule if submodule in known else source)
    edges = set()
    for name in found:
        while name and name not in known:  # `import a.b.c` of a name inside a module
            name = name.rpartition(".")[0]
        if name and name != module:
            edges.add(name)
    return edges


def import_graph() -> dict[str, set[str]]:
    names = module_names()
    known = set(names)
    return {module: imports_of(module, path, known) for module, path in names.items()}


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's algorithm, iterative; returns the components with more than one module."""
    index, low, on_stack, stack, found = {}, {}, set(), [], []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_the_graph_reader_sees_imports_of_every_form(tmp_path):
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("from .a import thing\n")
    (package / "a.py").write_text("def f():\n    from .sub import b\n    import pkg.sub.c\n")
    (package / "sub" / "__init__.py").write_text("")
    (package / "sub" / "b.py").write_text("from .. import a\nfrom ..sub import c\n")
    (package / "sub" / "c.py").write_text("from pkg import thing\n")
    known = {"pkg", "pkg.a", "pkg.sub", "pkg.sub.b", "pkg.sub.c"}
    assert imports_of("pkg", package / "__init__.py", known) == {"pkg.a"}
    assert imports_of("pkg.a", package / "a.py", known) == {"pkg.sub.b", "pkg.sub.c"}
    assert imports_of("pkg.sub.b", package / "sub" / "b.py", known) == {"pkg.a", "pkg.sub.c"}
    assert imports_of("pkg.sub.c", package / "sub" / "c.py", known) == {"pkg"}
    graph = {
        m: imports_of(m, p, known)
        for m, p in [
            ("pkg", package / "__init__.py"),
            ("pkg.a", package / "a.py"),
            ("pkg.sub", package / "sub" / "__init__.py"),
            ("pkg.sub.b", package / "sub" / "b.py"),
            ("pkg.sub.c", package / "sub" / "c.py"),
        ]
    }
    assert strongly_connected(graph) == [["pkg", "pkg.a", "pkg.sub.b", "pkg.sub.c"]]  # pkg.sub imports nothing


def test_the_layers_are_where_the_architecture_says():
    names = module_names()
    assert layer_of(f"{PACKAGE}.app.cli") == "application" and f"{PACKAGE}.app.cli" in names
    assert layer_of(f"{PACKAGE}.diagnostics.bench") == "diagnostics" and f"{PACKAGE}.diagnostics.bench" in names
    assert layer_of(f"{PACKAGE}.ops.op") == "library" and f"{PACKAGE}.ops.op" in names
    # every module of the top level that is not a layer's package is library: no stray application module
    top_level = {name.split(".")[1] for name in names if name.count(".") >= 1}
    assert {"app", "diagnostics", "ops", "nn", "precision", "callbacks"} <= top_level


def test_imports_point_down_the_stack_only():
    graph = import_graph()
    upward = [
        f"{module} ({layer_of(module)}) imports {target} ({layer_of(target)})"
        for module, targets in sorted(graph.items())
        for target in sorted(targets)
        if LAYERS.index(layer_of(target)) > LAYERS.index(layer_of(module))
    ]
    assert upward == [], "imports against the stack:\n" + "\n".join(upward)


# Inside the library, bottom first (docs/architecture.md): a package imports only its own level
# and those below. The top-level modules (the version, the atomic writer, resource paths, seeds,
# Lightning's private API behind one fence, the CSV logger) are at the bottom.
LIBRARY_ORDER = (
    ("__init__", "_atomic", "_resources", "_seeds", "_lightning_compat", "loggers"),
    ("ops",),
    ("nn",),
    ("precision", "strategies"),
    ("callbacks", "models"),
    ("data",),
    ("export",),
    ("hf",),
)


def library_level(module: str) -> int:
    parts = module.split(".")
    package = parts[1] if len(parts) > 1 else "__init__"
    for level, packages in enumerate(LIBRARY_ORDER):
        if package in packages:
            return level
    raise AssertionError(f"{module}: its package {package!r} has no place in LIBRARY_ORDER")


def test_the_library_imports_down_its_own_order():
    graph = import_graph()
    library = {module for module in graph if layer_of(module) == "library"}
    for module in library:
        library_level(module)  # every library module has its place
    upward = [
        f"{module} imports {target}"
        for module in sorted(library)
        for target in sorted(graph[module] & library)
        if library_level(target) > library_level(module)
    ]
    assert upward == [], (
        "imports against the library's order "
        + " -> ".join("/".join(packages) for packages in LIBRARY_ORDER)
        + ":\n"
        + "\n".join(upward)
    )


def test_the_models_know_no_strategy_class():
    """A model asks the strategy (duck-typed hooks such as `shard`); it never imports one, so the
    engines stay below the models and a new engine needs no change in them."""
    graph = import_graph()
    reaching = sorted(
        f"{module} imports {target}"
        for module, targets in graph.items()
        for target in targets
        if module.startswith(f"{PACKAGE}.models") and target.startswith(f"{PACKAGE}.strategies")
    )
    assert reaching == []


def test_the_import_graph_has_no_cycle():
    cycles = strongly_connected(import_graph())
    assert cycles == [], "modules that import each other (directly or around a loop):\n" + "\n".join(
        " <-> ".join(component) for component in cycles
    )


@pytest.mark.slow
def test_the_library_imports_without_hydra_or_the_application():
    library = sorted(name for name in module_names() if layer_of(name) == "library")
    script = "\n".join(
        [
            "import importlib, sys",
            "sys.modules.update(hydra=None, omegaconf=None)  # as if not installed",
            f"for name in {library!r}:",
            "    importlib.import_module(name)",
            f"above = sorted(n for n in sys.modules if n.startswith(({APPLICATION!r}, {DIAGNOSTICS!r})))",
            "assert not above, f'the library imported {above}'",
        ]
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, cwd=PACKAGE_DIR.parent, timeout=300
    )
    assert result.returncode == 0, result.stderr[-3000:]


# What a user of the layers alone must not pay for: each is seconds of import time.
NOT_FOR_LAYER_USERS = (
    "torch._dynamo",
    "lightning",
    "hydra",
    "omegaconf",
    "torchmetrics",
    "scipy",
    "safetensors",
    "transformers",
)


@pytest.mark.slow  # imports in a fresh interpreter
@pytest.mark.parametrize(
    "statement", ["import sru_lightning", "import sru_lightning.nn", "from sru_lightning.nn import SRU, SRUCell, SRUpp"]
)
def test_the_layers_import_like_torch(statement):
    script = "\n".join(
        [
            "import sys",
            statement,
            f"loaded = [name for name in {NOT_FOR_LAYER_USERS!r} if name in sys.modules]",
            "print(' '.join(loaded))",
        ]
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, cwd=PACKAGE_DIR.parent, timeout=300
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip() == "", f"`{statement}` loaded {result.stdout.strip()}"


def test_no_application_module_imports_another_modules_private_name():
    """A name with a leading underscore belongs to its module (the sweep watchdog once imported
    the CLI's `_sweeper_counts_failures`); a module so named (`_lightning_compat`) is the
    package's own and may be imported."""
    names = module_names()
    found = []
    for module, path in names.items():
        if layer_of(module) != "application":
            continue
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if not isinstance(node, ast.ImportFrom):
                continue
            source = _resolve(module, path.name == "__init__.py", node)
            if source != PACKAGE and not source.startswith(PACKAGE + "."):
                continue
            for alias in node.names:
                private = alias.name.startswith("_") and not alias.name.startswith("__")
                if private and f"{source}.{alias.name}" not in names:
                    found.append(f"{module} imports {source}.{alias.name}")
    assert not found, found


CONTAINER_TYPES = ("dict", "list", "set", "defaultdict", "OrderedDict")
CONTAINER_CHANGES = ("append", "extend", "insert", "pop", "popitem", "update", "clear", "add", "discard", "remove")
CONTAINER_CHANGES += ("setdefault",)


def state_writes(tree: ast.Module) -> list[tuple[str, str]]:
    """(function, what) for each write of module-level state inside a function of `tree`: an
    assignment to an attribute of an imported name (`directories.command = ...`, `sys.argv =
    ...`), a `setattr` on one, a `global` statement (a module's own global rebound at run time),
    and a change to a dict, list or set the module made at import (`_held[folder] = hold`)."""
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            imported.update((alias.asname or alias.name).split(".")[0] for alias in node.names)
    containers = set()
    for node in tree.body:
        target = node.targets[0] if isinstance(node, ast.Assign) and len(node.targets) == 1 else None
        target = node.target if isinstance(node, ast.AnnAssign) else target
        value = node.value if isinstance(node, (ast.Assign, ast.AnnAssign)) else None
        made = isinstance(value, (ast.Dict, ast.List, ast.Set)) or (
            isinstance(value, ast.Call) and getattr(value.func, "id", None) in CONTAINER_TYPES
        )
        if isinstance(target, ast.Name) and made:
            containers.add(target.id)
    found = []

    def visit(node: ast.AST, function: str) -> None:
        for child in ast.iter_child_nodes(node):
            name = child.name if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) else function
            targets: list[ast.expr] = []
            if isinstance(child, (ast.Assign, ast.Delete)):
                targets = child.targets
            elif isinstance(child, (ast.AugAssign, ast.AnnAssign)):
                targets = [child.target]
            for target in targets:
                if isinstance(target, ast.Subscript) and isinstance(target.value, ast.Name) and function:
                    if target.value.id in containers:
                        found.append((function, f"{target.value.id}[...] ="))
                for part in ast.walk(target):
                    if isinstance(part, ast.Attribute) and isinstance(part.ctx, ast.Store):
                        if isinstance(part.value, ast.Name) and part.value.id in imported and function:
                            found.append((function, f"{part.value.id}.{part.attr} ="))
            if isinstance(child, ast.Global) and function:
                found.append((function, f"global {', '.join(child.names)}"))
            method = child.func if isinstance(child, ast.Call) and isinstance(child.func, ast.Attribute) else None
            if method is not None and isinstance(method.value, ast.Name) and method.value.id in containers:
                if method.attr in CONTAINER_CHANGES and function:
                    found.append((function, f"{method.value.id}.{method.attr}()"))
            if isinstance(child, ast.Call) and isinstance(child.func, ast.Name) and child.func.id == "setattr":
                first = child.args[0] if child.args else None
                if isinstance(first, ast.Name) and first.id in imported and function:
                    found.append((function, f"setattr({first.id}, ...)"))
            visit(child, name)

    visit(tree, "")
    return found


def test_the_state_writer_sees_every_form():
    source = """
import sys
from pkg import directories
LIMIT = 1
_held = {}
def ok(self):
    self.x = 1
    local = [1]; local[0] = 2
    return _held.get(1)
def bad():
    global LIMIT
    directories.command = "fit"
    sys.argv = []
    setattr(directories, "current", None)
    _held[1] = 2
    _held.pop(1)
"""
    found = state_writes(ast.parse(source))
    assert [what for _, what in found] == [
        "global LIMIT",
        "directories.command =",
        "sys.argv =",
        "setattr(directories, ...)",
        "_held[...] =",
        "_held.pop()",
    ]
    assert {function for function, _ in found} == {"bad"}


def test_the_application_writes_no_module_state_at_run_time():
    """A command's state travels in its RunContext (sru_lightning/app/runs/context.py), never
    through a module's globals, so that commands can run one after another in one process. The
    one exception: `sys.argv`, which Lightning's DDP launcher re-runs in the other ranks, set in
    one function (and put back there)."""
    writes = []
    for module, path in module_names().items():
        if layer_of(module) == "application":
            for function, what in state_writes(ast.parse(path.read_text(), filename=str(path))):
                writes.append((module, function, what))
    argv = {(module, function) for module, function, what in writes if what == "sys.argv ="}
    assert len(argv) <= 1, f"sys.argv is set in more than one place: {sorted(argv)}"
    others = [f"{module}.{function}: {what}" for module, function, what in writes if what != "sys.argv ="]
    assert others == [], others


def test_no_function_of_the_application_is_over_80_lines():
    # A function that long does several jobs; the application's commands are lists of steps.
    long = []
    for path in sorted((PACKAGE_DIR / "app").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > 80:
                    long.append(f"{path.name}:{node.lineno} {node.name} ({lines} lines)")
    assert long == []


def test_one_helper_renames_files_into_place():
    # "Write beside, then rename" is written once (sru_lightning/_atomic.py); every other module
    # calls it, so a fix to the rule (a folder in the way, a failed rename) reaches all of them.
    renames = []
    for path in sorted(PACKAGE_DIR.rglob("*.py")):
        if path.name == "_atomic.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "replace"
                and isinstance(node.func.value, ast.Name)
                and node.func.value.id == "os"
            ):
                renames.append(f"{path.relative_to(PACKAGE_DIR)}:{node.lineno}")
    assert renames == [], f"os.replace outside sru_lightning/_atomic.py: {renames}"
