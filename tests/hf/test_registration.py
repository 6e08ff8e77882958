"""The transformers classes cost nothing to users who never use them, and `import sru_lightning`
is all the Auto classes need, whichever of the two is imported first."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip(
    "transformers", reason="the transformers classes need the `hf` extra: pip install 'sru_lightning[hf]'"
)

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow  # fresh interpreters


def _run(script: str) -> str:
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=REPO, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout.strip()


@pytest.mark.parametrize(
    "statement", ["import sru_lightning", "import sru_lightning.nn", "import sru_lightning.export"]
)
def test_the_package_imports_no_transformers(statement):
    assert _run(f"import sys\n{statement}\nprint('transformers' in sys.modules)") == "False"


@pytest.mark.parametrize(
    "imports",
    [
        "import sru_lightning\nfrom transformers import AutoConfig, AutoModelForCausalLM",
        "from transformers import AutoConfig, AutoModelForCausalLM\nimport sru_lightning",
    ],
    ids=["package-first", "transformers-first"],
)
def test_importing_the_package_registers_the_auto_classes(imports):
    script = "\n".join(
        [
            imports,
            "from sru_lightning.hf import SRULightningConfig, SRULightningForCausalLM",
            "config = AutoConfig.for_model('sru_lightning', vocab_size=7, hidden_size=8, embedding_dim=4)",
            "model = AutoModelForCausalLM.from_config(config)",
            "print(type(config) is SRULightningConfig, type(model) is SRULightningForCausalLM)",
        ]
    )
    assert _run(script) == "True True"
