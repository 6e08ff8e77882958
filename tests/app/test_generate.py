"""`python -m sru_lightning generate`: text from a trained run, deterministic for a seed, at
character and word level; bad settings get one named error."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from helpers.tiny_run import TINY_RUN

from sru_lightning.app import cli


class Finished:
    """What one in-process command run returned and printed."""

    def __init__(self, returncode: int, stdout: str, stderr: str) -> None:
        self.returncode, self.stdout, self.stderr = returncode, stdout, stderr


def run_command(capsys, *args: str) -> Finished:
    """`python -m sru_lightning <args>` run in this process: exit status and what it printed."""
    capsys.readouterr()
    status = cli.main(list(args))
    captured = capsys.readouterr()
    return Finished(status, captured.out, captured.err)


def fit_tiny_run(capsys, run_dir: Path, *overrides: str) -> Finished:
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    fit = run_command(capsys, "fit", *TINY_RUN, *overrides, f"hydra.run.dir={run_dir}")
    assert fit.returncode == 0, fit.stderr[-2000:]
    return fit


def generated(result: Finished, prompt: str) -> str:
    """The text after the echoed prompt (generate ends its output with one newline)."""
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.startswith(prompt) and result.stdout.endswith("\n")
    return result.stdout[len(prompt) : -1]


@pytest.mark.parametrize(
    "argument,message",
    [
        ("lenght=5", "unknown setting 'lenght' (did you mean 'length'?)"),
        ("length=abc", "`length` must be an integer, got 'abc'"),
        ("length=0", "`length` must be a positive integer (tokens to generate), got 0"),
        ("temperature=-0.5", "`temperature` must be a finite number >= 0 (0 = greedy), got -0.5"),
        ("top_k=-1", "`top_k` must be an integer >= 0 (0 = no limit), got -1"),
        ("seed=1.5", "`seed` must be an integer, got '1.5'"),
        ("prompt", "expected key=value, got 'prompt'"),
        (
            "ckpt_path=/no/such.ckpt",
            "`ckpt_path` must be a checkpoint file, a run directory or 'last', got '/no/such.ckpt'",
        ),
    ],
)
def test_bad_settings_get_one_named_error_and_exit_2(argument, message, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert cli.main(["generate", argument]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_generate_is_listed_and_explains_its_settings(capsys):
    assert cli.main(["--help"]) == 0
    assert "  generate" in capsys.readouterr().out
    assert cli.main(["generate", "--help"]) == 0
    out = capsys.readouterr().out
    assert "temperature=0.8" in out and "temperature=0 is greedy" in out and "top_k=0" in out


def test_last_without_any_run_is_a_usage_error(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    result = run_command(capsys, "generate", "ckpt_path=last")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "`ckpt_path=last` found no checkpoint of a trained run under resume_dir='outputs'" in result.stderr


@pytest.mark.slow
def test_character_level_generation_is_deterministic_and_has_the_requested_length(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    run_dir = tmp_path / "outputs" / "char"
    fit_tiny_run(capsys, run_dir)
    settings = ("prompt=The ", "length=40", "temperature=0.8", "top_k=0")
    first = run_command(capsys, "generate", f"ckpt_path={run_dir}", *settings, "seed=0")
    text = generated(first, "The ")
    assert len(text) == 40
    assert re.search(r"40 tokens in [0-9.]+ s \([0-9]+ tokens/s; prompt of 4 tokens read in one pass\)", first.stderr)
    # ckpt_path=last finds the run under resume_dir (default: outputs); another seed, other text
    other_seed = run_command(capsys, "generate", "ckpt_path=last", *settings, "seed=1")
    assert f"{run_dir / 'checkpoints' / 'last.ckpt'} (step 3, char level)" in other_seed.stderr
    assert len(generated(other_seed, "The ")) == 40 and generated(other_seed, "The ") != text

    # the same seed gives the same text from a copy of the checkpoint elsewhere
    loose = tmp_path / "copy.ckpt"
    loose.write_bytes((run_dir / "checkpoints" / "last.ckpt").read_bytes())
    assert generated(run_command(capsys, "generate", f"ckpt_path={loose}", *settings, "seed=0"), "The ") == text
    # a checkpoint without its vocabulary is refused in one line (nothing rebuilds it)
    checkpoint = torch.load(loose, map_location="cpu", weights_only=True)
    assert checkpoint.pop("PydocDataModule")["token_codec"]["level"] == "char"
    torch.save(checkpoint, loose)
    refused = run_command(capsys, "generate", f"ckpt_path={loose}", *settings)
    assert refused.returncode == 2 and refused.stderr.strip().count("\n") == 0
    assert "holds no vocabulary" in refused.stderr


@pytest.mark.slow
def test_word_level_runs_log_bits_per_word_and_generate_words_joined_by_spaces(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    from pydoc_data.topics import topics

    corpus = tmp_path / "prose.txt"
    corpus.write_text("\n".join(topics[key] for key in sorted(topics))[:60_000])
    run_dir = tmp_path / "word"
    fit = fit_tiny_run(capsys, run_dir, "data=text", f"data.path={corpus}", "data.level=word")
    assert re.search(r"final val_bpw=[0-9.]+ \(unigram baseline bpw=[0-9.]+\)", fit.stdout)
    assert [path.name for path in (run_dir / "checkpoints").glob("*val_bpw*.ckpt")], "ModelCheckpoint monitors val_bpw"
    header = (run_dir / "csv" / "metrics.csv").read_text().splitlines()[0].split(",")
    assert "val_bpw" in header and "val_word_ppl" in header and "val_bpc" not in header

    result = run_command(capsys, "generate", f"ckpt_path={run_dir}", "prompt=The ", "length=25", "seed=0")
    text = generated(result, "The ")
    assert len(re.findall(r"[^\s]+|\n", text)) == 25  # a word or an end of line per token
    assert "  " not in text and " \n" not in text and not text.startswith(" ")
    assert "word level" in result.stderr
