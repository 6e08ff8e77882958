"""The precision package imports one way: the Regime type at the bottom, the readers of
Lightning / FSDP / APEX setups above it, the DeepSpeed reader (which reads an ``amp`` section
as APEX) above those, detect_regime on top."""

from __future__ import annotations

import ast
from pathlib import Path

import torch

import sru_lightning.precision as precision

PACKAGE = Path(precision.__file__).parent
LAYER = {"regime": 0, "cpu_half": 0, "lightning": 1, "fsdp": 1, "apex": 1, "deepspeed": 2, "detect": 3, "__init__": 4}


def package_imports(module: Path) -> set[str]:
    """The sibling modules `module` imports (relative or absolute spelling)."""
    found = set()
    for node in ast.walk(ast.parse(module.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level == 1:
                found.add(node.module)
            elif (node.module or "").startswith("sru_lightning.precision."):
                found.add(node.module.rsplit(".", 1)[-1])
    return found


def test_every_module_has_a_layer_and_imports_only_lower_layers():
    modules = {path.stem: path for path in PACKAGE.glob("*.py")}
    assert set(modules) == set(LAYER)
    for name, path in modules.items():
        for imported in package_imports(path):
            assert LAYER[imported] < LAYER[name], f"precision/{name}.py imports .{imported} (same or higher layer)"


def test_public_names_are_kept():
    from sru_lightning import detect_regime
    from sru_lightning.precision.apex import register_with_apex

    assert detect_regime is precision.detect_regime and callable(register_with_apex)
    assert set(precision.__all__) == {"Regime", "detect_regime", "regime_from_dtypes", "dtype_name"}
    regime = precision.regime_from_dtypes(
        "bf16-mixed", param_dtype=torch.float32, autocast_dtype=torch.bfloat16, device_type="cpu", source="test"
    )
    assert isinstance(regime, precision.Regime) and regime.storage_dtype("auto") == torch.bfloat16
