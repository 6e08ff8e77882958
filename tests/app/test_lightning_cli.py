"""examples/lightning_cli.py: SRULanguageModel, the data modules and the callbacks under Lightning's
own LightningCLI (jsonargparse), without Hydra: fit, --print_config round trip, validate."""

from __future__ import annotations

import csv
import importlib.util
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from helpers import preloaded

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "examples" / "lightning_cli.py"
TINY = [
    *("--model.net.hidden_size", "16", "--model.net.embedding_dim", "8", "--model.net.num_layers", "1"),
    *("--data.batch_size", "4", "--data.seq_len", "16"),
    *("--trainer.max_steps", "3", "--trainer.limit_val_batches", "1"),
    *("--trainer.enable_progress_bar", "false", "--trainer.enable_model_summary", "false"),
]


def lightning_cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    # The script imports this checkout's package whether or not it is installed.
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    result = preloaded.run(
        [sys.executable, str(SCRIPT), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, f"{args} exited {result.returncode}:\n{result.stderr[-3000:]}"
    return result


def example_module():
    spec = importlib.util.spec_from_file_location("lightning_cli_example", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_parser_links_the_models_vocabulary_to_the_data(monkeypatch, capsys):
    """In-process: --print_config shows the default data module and leaves out what follows from it."""
    module = example_module()
    monkeypatch.setattr(sys, "argv", [str(SCRIPT)])
    with pytest.raises(SystemExit) as exit:
        module.main(["fit", "--model.compile", "true", "--print_config"])
    assert exit.value.code in (0, None)
    config = yaml.safe_load(capsys.readouterr().out)
    assert config["data"]["class_path"] == "sru_lightning.data.PydocDataModule"
    assert config["model"]["compile"] is True
    # filled in from the data module when it is built
    assert "vocab_size" not in config["model"] and "token_unit" not in config["model"]


@pytest.mark.slow  # starts a process
def test_fit_with_the_precision_callback_ends_with_a_finite_loss(tmp_path):
    result = lightning_cli(
        "fit",
        *("--model.net.hidden_size", "256", "--trainer.precision", "bf16-mixed"),
        "--trainer.callbacks+=sru_lightning.callbacks.SRUPrecisionCallback",
        *TINY,
        *("--trainer.logger", "lightning.pytorch.loggers.CSVLogger", "--trainer.logger.save_dir", str(tmp_path)),
        *("--trainer.log_every_n_steps", "1", "--trainer.enable_checkpointing", "false"),
        cwd=tmp_path,
    )
    output = result.stdout + result.stderr
    # the callback found the model's SRU layer and runs its recurrence in bf16
    assert "SRU recurrence precision" in output and "storage bfloat16" in output
    assert "1: net.rnn.rnn_lst.0" in output
    (metrics,) = tmp_path.glob("lightning_logs/*/metrics.csv")
    losses = [float(row["train_loss"]) for row in csv.DictReader(metrics.open()) if row.get("train_loss")]
    assert len(losses) == 3 and math.isfinite(losses[-1])


@pytest.mark.slow  # starts processes
def test_print_config_writes_a_yaml_that_runs_again_and_validates(tmp_path):
    printed = lightning_cli(
        "fit",
        "--trainer.callbacks+=sru_lightning.callbacks.SRUPrecisionCallback",
        *TINY,
        *("--trainer.logger", "false", "--trainer.default_root_dir", str(tmp_path / "run")),
        "--print_config",
        cwd=tmp_path,
    )
    config_file = tmp_path / "config.yaml"
    config_file.write_text(printed.stdout)
    config = yaml.safe_load(printed.stdout)
    assert config["model"]["net"]["init_args"]["hidden_size"] == 16 and config["trainer"]["max_steps"] == 3
    assert config["trainer"]["callbacks"][0]["class_path"] == "sru_lightning.callbacks.SRUPrecisionCallback"

    fitted = lightning_cli("fit", "--config", str(config_file), cwd=tmp_path)
    assert "`Trainer.fit` stopped: `max_steps=3` reached" in fitted.stdout + fitted.stderr
    (checkpoint,) = (tmp_path / "run" / "checkpoints").glob("*.ckpt")

    validated = lightning_cli("validate", "--config", str(config_file), "--ckpt_path", str(checkpoint), cwd=tmp_path)
    line = next(line for line in validated.stdout.splitlines() if "val_bpc" in line)
    assert math.isfinite(float(line.replace("│", " ").split()[-1]))


def test_a_learning_rate_alone_changes_the_default_optimizers(tmp_path):
    """`--model.optimizer.lr 0.1` sets the learning rate of the model's default optimizer (it was
    taken for an optimizer mapping of its own, without `_target_`, and failed at its first use)."""
    from sru_lightning.data import LanguageModelDataModule
    from sru_lightning.models import SRULanguageModel

    module = example_module()
    settings = [*TINY, *("--trainer.max_steps", "1", "--trainer.logger", "false")]
    settings += ["--trainer.enable_checkpointing", "false"]
    cli = module.LanguageModelCLI(
        SRULanguageModel,
        LanguageModelDataModule,
        subclass_mode_data=True,
        run=False,
        args=[*settings, "--model.optimizer.lr", "0.1", "--trainer.default_root_dir", str(tmp_path)],
    )
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    (optimizer,) = cli.trainer.optimizers
    assert isinstance(optimizer, torch.optim.Adam) and optimizer.param_groups[0]["lr"] == 0.1


def documents_folder(root: Path) -> Path:
    folder = root / "documents"
    folder.mkdir()
    for index in range(30):
        (folder / f"{index:02d}.txt").write_text(f"document number {index}. " * 40)
    return folder


REFUSED = [
    (["--model.net.rnn", "gru"], "LanguageNet: `rnn` must be one of ('sru', 'srupp', 'lstm'), got 'gru'"),
    (
        ["--model.net.rnn", "lstm", "--data", "sru_lightning.data.DocumentsDataModule", "--data.path", "{documents}"],
        "--data DocumentsDataModule packs documents with their boundaries, which --model.net.rnn lstm cannot keep "
        "apart: use --model.net.rnn sru or srupp",
    ),
    (["--model.optimizer", "{lr: 0.1}"], "SRULanguageModel: `model.optimizer` must be a mapping whose `_target_`"),
    (["--model.lr_scheduler.step_size", "3"], "SRULanguageModel: `model.lr_scheduler` must be a mapping whose"),
]


@pytest.mark.parametrize("arguments, message", REFUSED, ids=["rnn-gru", "lstm-documents", "optimizer", "scheduler"])
def test_a_value_the_model_or_data_refuse_is_one_error_line_before_training(arguments, message, tmp_path, capsys):
    module = example_module()
    documents = str(documents_folder(tmp_path))
    arguments = [argument.replace("{documents}", documents) for argument in arguments]
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit:
        module.main(
            ["fit", *TINY, "--trainer.logger", "false", "--trainer.default_root_dir", str(tmp_path), *arguments]
        )
    _, err = capsys.readouterr()
    # The parser's exit, not the model's exception (which would have propagated as itself).
    assert exit.value.code == 2
    assert f"error: {message}" in err, err[-3000:]
    assert not list(tmp_path.rglob("*.ckpt")), "refused before training"
