"""The examples run (or, where they need GPUs, their commands compose)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import preloaded
from hydra import compose, initialize_config_dir

from sru_lightning._resources import conf_dir

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"


def env_with_package():
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}


@pytest.mark.slow
@pytest.mark.parametrize("precision,steps", [("bf16-mixed", 3), ("16-true", 32)])
def test_callback_in_an_existing_script_trains(precision, steps, tmp_path):
    done = preloaded.run(
        [
            sys.executable,
            str(EXAMPLES / "callback_in_existing_script.py"),
            "--max-steps",
            str(steps),
            "--precision",
            precision,
            "--accelerator",
            "cpu",
        ],
        cwd=tmp_path,
        env=env_with_package(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert re.search(r"val_loss=\d+\.\d+ nats/char", done.stdout)
    assert "SRU recurrence precision" in done.stdout + done.stderr  # the callback reported the regime


@pytest.mark.parametrize("script", ["sweep.sh", "deepspeed_fit.sh"])
def test_shell_examples_are_valid_bash_with_composable_overrides(script):
    text = (EXAMPLES / script).read_text()
    assert subprocess.run(["bash", "-n", str(EXAMPLES / script)]).returncode == 0
    command = text[text.index("python -m sru_lightning fit", text.index("set -euo")) :]
    overrides = [
        token.replace('"', "").replace("${STAGE}", "2").replace("${PRECISION}", "bf16-mixed")
        for token in command.replace("\\\n", " ").split("\n")[0].split()[4:]
        if token not in ("-m", '"$@"', '"${PLACEMENT[@]}"')
    ]
    sweeps = [o for o in overrides if "," in o]
    fixed = [o for o in overrides if "," not in o]
    choices = [o.split("=")[0] + "=" + o.split("=")[1].split(",")[0] for o in sweeps]
    with initialize_config_dir(config_dir=str(conf_dir()), version_base="1.3"):
        cfg = compose("config", overrides=fixed + choices)
    assert cfg.trainer._target_ == "lightning.pytorch.Trainer"
