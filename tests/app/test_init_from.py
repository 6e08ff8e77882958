"""`fit model.init_from=<folder | run | .ckpt>`: a new run whose network starts from trained
weights, with their vocabulary; a network of other shapes, a text with characters the vocabulary
lacks or a missing source is refused in one line before training."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from helpers.tiny_run import TINY_RUN

pytest.importorskip("safetensors", reason="pretrained folders need the `hub` extra: pip install 'sru_lightning[hub]'")

from sru_lightning.app import cli  # noqa: E402
from sru_lightning.data import TokenCodec  # noqa: E402
from sru_lightning.export.pretrained import from_pretrained, save_pretrained  # noqa: E402
from sru_lightning.nn import LanguageNet  # noqa: E402

TEXT = "the cat sat on the mat. a bat ate the hat, then sat.\n" * 60
#: The folder's vocabulary: the text's characters and some it never uses (so the run must take
#: the folder's ids, not learn its own).
ALPHABET = sorted(set(TEXT) | set("XYZ"))
# debug=tiny's network (conf/debug/tiny.yaml over conf/model/sru.yaml)
SHAPE = dict(embedding_dim=8, hidden_size=16, num_layers=1, sru_options={"highway_bias": -2.0, "rescale": True})


def result_of(run_dir: Path) -> dict:
    return json.loads((run_dir / "result.json").read_text())


@pytest.fixture
def setup(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "text.txt").write_text(TEXT)
    torch.manual_seed(3)
    net = LanguageNet(len(ALPHABET), **SHAPE).eval()
    folder = save_pretrained(net, tmp_path / "pretrained", TokenCodec("char", ALPHABET))
    data = ["data=text", f"data.path={tmp_path / 'text.txt'}"]
    return tmp_path, folder, data


def _fit(*args: str) -> int:
    return cli.main(["fit", *TINY_RUN, *args])


@pytest.mark.slow  # two fits and a validation
def test_a_fit_starts_from_the_folders_weights_and_vocabulary(setup):
    tmp_path, folder, data = setup
    run = tmp_path / "outputs" / "from-folder"
    assert _fit(*data, f"model.init_from={folder}", "model.optimizer.lr=0", f"hydra.run.dir={run}") == 0
    state = torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"]
    net, _ = from_pretrained(folder)
    for name, tensor in net.state_dict().items():  # lr=0: still the folder's weights, bit for bit
        assert torch.equal(state[f"net.{name}"], tensor), name
    first_bits = result_of(run)["metrics"]["val_bpc"]
    # the folder's own bits on that text: its weights, evaluated by the package on the same data
    evaluation = tmp_path / "outputs" / "evaluation"
    assert cli.main(["validate", *TINY_RUN, *data, f"ckpt_path={run}", f"hydra.run.dir={evaluation}"]) == 0
    assert result_of(evaluation)["metrics"]["val_bpc"] == pytest.approx(first_bits, rel=1e-6)
    # and a run from its own initial weights does not give them
    fresh = tmp_path / "outputs" / "fresh"
    assert _fit(*data, "model.optimizer.lr=0", f"hydra.run.dir={fresh}") == 0
    assert result_of(fresh)["metrics"]["val_bpc"] != pytest.approx(first_bits, rel=1e-3)
    # a run directory names the same weights
    from_run = tmp_path / "outputs" / "from-run"
    assert _fit(*data, f"model.init_from={run}", "model.optimizer.lr=0", f"hydra.run.dir={from_run}") == 0
    assert result_of(from_run)["metrics"]["val_bpc"] == pytest.approx(first_bits, rel=1e-6)


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["model.net.hidden_size=32"], "do not fit the network model.net describes (tensors decoder.weight, "),
        (["model.net.hidden_size=32"], "; set model.net.hidden_size=16 (got 32)"),
        (["model.init_from=/nowhere/at/all"], "`model.init_from` must be a pretrained folder"),
    ],
    ids=["hidden-size", "hidden-size-named", "missing"],
)
def test_a_bad_start_is_refused_in_one_line_before_training(overrides, message, setup, capsys):
    tmp_path, folder, data = setup
    run = tmp_path / "outputs" / "refused"
    assert _fit(*data, f"model.init_from={folder}", *overrides, f"hydra.run.dir={run}") == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert not (run / "checkpoints").exists()


def test_characters_the_folders_vocabulary_lacks_are_named(setup, capsys):
    tmp_path, folder, data = setup
    (tmp_path / "text.txt").write_text(TEXT + "Quq!\n")
    assert _fit(*data, f"model.init_from={folder}", f"hydra.run.dir={tmp_path / 'run'}") == 2
    err = capsys.readouterr().err
    assert "'!Qqu'" in err and "not in the checkpoint's vocabulary" in err and "Traceback" not in err
