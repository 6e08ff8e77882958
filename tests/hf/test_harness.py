"""EleutherAI's evaluation harness on an export folder (`python -m sru_lightning.hf.lm_eval`): a
task on a local JSON Lines file, run offline, gives the bits per byte that the package's own
`validate` gives on the same documents, each scored alone."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers.hf_folders import ALPHABET
from helpers.tiny_run import TINY_RUN

pytest.importorskip("lm_eval", reason="the evaluation harness needs the `hf` extra: pip install 'sru_lightning[hf]'")

from transformers import AutoTokenizer  # noqa: E402

from sru_lightning.app import cli  # noqa: E402
from sru_lightning.data import DocumentsDataModule, TokenCodec  # noqa: E402
from sru_lightning.export.pretrained import save_pretrained  # noqa: E402
from sru_lightning.hf.harness import prefix_token_of  # noqa: E402
from sru_lightning.nn import LanguageNet  # noqa: E402

#: The task definition docs/huggingface.md shows ({path} filled in).
TASK_YAML = """\
task: local_text
dataset_path: json
dataset_kwargs:
  data_files:
    test: {path}
test_split: test
output_type: loglikelihood_rolling
doc_to_text: ""
doc_to_target: "{{{{text}}}}"
metric_list:
  - metric: bits_per_byte
  - metric: byte_perplexity
  - metric: word_perplexity
"""


def test_a_document_starts_from_the_line_end_token(folders):
    tokenizer = AutoTokenizer.from_pretrained(folders["sru"])
    assert prefix_token_of(tokenizer) == ALPHABET.index("\n")


def test_a_vocabulary_without_a_line_end_asks_for_the_prefix_token(tmp_path):
    alphabet = [c for c in ALPHABET if c != "\n"]
    net = LanguageNet(len(alphabet), embedding_dim=8, hidden_size=16, num_layers=1)
    folder = save_pretrained(net, tmp_path / "no-newline", TokenCodec("char", alphabet))
    with pytest.raises(ValueError, match=r"add prefix_token_id=<a token id> to --model_args"):
        prefix_token_of(AutoTokenizer.from_pretrained(folder))


def _documents(count: int) -> list[str]:
    """Documents of a few lines each, regular enough that a short fit learns something."""
    words = "the cat sat on a mat and ate hat bat then".split()
    rng = random.Random(0)
    documents = []
    for _ in range(count):
        lines = [" ".join(rng.choice(words) for _ in range(rng.randint(6, 12))) + "." for _ in range(rng.randint(5, 9))]
        documents.append("\n".join(lines))
    return documents


def _metrics(run_dir: Path) -> dict:
    return json.loads((run_dir / "result.json").read_text())["metrics"]


@pytest.mark.slow  # a fit, a validation, an export and the harness in its own process
def test_the_harness_gives_the_bits_per_byte_of_validate(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    corpus = tmp_path / "documents.jsonl"
    corpus.write_text("".join(json.dumps({"text": text}) + "\n" for text in _documents(60)))
    data = ["data=documents", f"data.path={corpus}", "data.val_fraction=0.2"]
    run = tmp_path / "run"
    torch.manual_seed(0)
    fit = ["fit", *TINY_RUN, *data, "trainer.limit_train_batches=60", "model.optimizer.lr=0.01", f"hydra.run.dir={run}"]
    assert cli.main(fit) == 0
    evaluation = tmp_path / "evaluation"
    validate = ["validate", *TINY_RUN, f"ckpt_path={run}", "trainer.limit_val_batches=1.0"]
    assert cli.main([*validate, f"hydra.run.dir={evaluation}"]) == 0
    package_bits = _metrics(evaluation)["val_bpb"]
    assert package_bits < 3.0  # trained: well below the uniform 4.0 bits of this 15-character text
    folder = tmp_path / "exported"
    assert cli.main(["export", f"ckpt_path={run}", "format=hf", f"out={folder}"]) == 0

    # The validation documents, by the data module's own split, as the harness's local dataset.
    module = DocumentsDataModule(path=str(corpus), val_fraction=0.2)
    texts = [module.codec.decode(document.tolist()) for document in module.documents("val")]
    assert len(texts) == 12
    (tmp_path / "validation.jsonl").write_text("".join(json.dumps({"text": text}) + "\n" for text in texts))
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    (tasks / "local_text.yaml").write_text(TASK_YAML.format(path=tmp_path / "validation.jsonl"))

    offline = {**os.environ, "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1"}
    command = [sys.executable, "-m", "sru_lightning.hf.lm_eval", "--model", "sru_lightning"]
    command += ["--model_args", f"pretrained={folder}", "--tasks", "local_text", "--include_path", str(tasks)]
    command += ["--output_path", str(tmp_path / "harness"), "--batch_size", "4"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=600, env=offline)
    assert result.returncode == 0, result.stderr[-3000:]
    (written,) = (tmp_path / "harness").rglob("results_*.json")
    harness = json.loads(written.read_text())["results"]["local_text"]
    assert harness["sample_len"] == len(texts)
    harness_bits = harness["bits_per_byte,none"]
    print(f"validate val_bpb={package_bits:.5f}, harness bits_per_byte={harness_bits:.5f}")
    assert harness_bits == pytest.approx(package_bits, rel=0.01)
