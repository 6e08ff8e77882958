"""`fit data=documents`: a folder of documents trains and validates from the command line, and a
model that cannot keep documents apart is refused in one line before anything runs."""

from __future__ import annotations

import json

from helpers.tiny_run import TINY_RUN

from sru_lightning.app import cli

SENTENCES = [
    "Documents are read one per file, in the order of their names. ",
    "Each starts the recurrence from a zero state, wherever it lands in a row. ",
    "The last token of one document never predicts the first of the next. ",
]


def documents_folder(tmp_path):
    folder = tmp_path / "documents"
    folder.mkdir()
    for index in range(12):
        (folder / f"{index:02d}.txt").write_text(SENTENCES[index % 3] * (2 + index % 4))
    return folder


def test_fit_on_a_folder_of_documents_trains_and_validates(tmp_path, capsys):
    run_dir = tmp_path / "run"
    overrides = ["data=documents", f"data.path={documents_folder(tmp_path)}", f"hydra.run.dir={run_dir}"]
    assert cli.main(["fit", *TINY_RUN, *overrides]) == 0
    result = json.loads((run_dir / "result.json").read_text())
    assert result["status"] == "completed" and result["metrics"]["val_bpc"] > 0
    assert "final val_bpc=" in capsys.readouterr().out


def test_a_model_that_cannot_keep_documents_apart_is_refused_in_one_line(tmp_path, capsys):
    run_dir = tmp_path / "run"
    overrides = ["data=documents", f"data.path={documents_folder(tmp_path)}", "model=lstm", f"hydra.run.dir={run_dir}"]
    assert cli.main(["fit", *TINY_RUN, *overrides]) == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if "error:" in line]
    assert len(errors) == 1 and "packs documents" in errors[0] and "use model=sru" in errors[0]
    assert not run_dir.exists()


def test_a_validation_split_with_nothing_to_predict_is_refused_before_training(tmp_path, capsys):
    folder = documents_folder(tmp_path)
    for index in (10, 11):  # the last tenth of 12 documents is validation, then test: 1 character each
        (folder / f"{index:02d}.txt").write_text("x")
    run_dir = tmp_path / "run"
    overrides = ["data=documents", f"data.path={folder}", f"hydra.run.dir={run_dir}"]
    assert cli.main(["fit", *TINY_RUN, *overrides]) == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if "error:" in line]
    assert len(errors) == 1, errors
    assert "the val split (data.val_fraction)" in errors[0] and "has nothing to predict" in errors[0]
    assert not list(run_dir.rglob("*.ckpt"))
