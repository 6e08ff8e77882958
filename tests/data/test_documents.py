"""DocumentsDataModule: documents read from a folder or JSON Lines, packed into rows with their
boundaries, and a validation bpc equal to evaluating the documents one by one."""

from __future__ import annotations

import json
import math

import pytest
import torch
import torch.nn.functional as F
from helpers.language_models import language_model
from helpers.tiny_trainer import tiny_trainer
from lightning.pytorch import seed_everything

from sru_lightning.data import DocumentsDataModule
from sru_lightning.data.documents import IGNORED, WholeDocumentRows

TEXTS = [
    "The quick brown fox jumps over the lazy dog. " * 3,
    "Pack my box with five dozen liquor jugs!",
    "How vexingly quick daft zebras jump.",
    "Sphinx of black quartz, judge my vow. " * 2,
    "Two driven jocks help fax my big quiz.",
    "Jackdaws love my big sphinx of quartz.",
    "The five boxing wizards jump quickly.",
    "A wizard's job is to vex chumps quickly in fog.",
    "Watch Jeopardy!, Alex Trebek's fun TV quiz game.",
    "By Jove, my quick study of lexicography won a prize.",
]


@pytest.fixture
def folder(tmp_path):
    root = tmp_path / "documents"
    root.mkdir()
    for index, text in enumerate(TEXTS):
        (root / f"doc{index:02d}.txt").write_text(text)
    return root


def test_a_folder_and_json_lines_give_the_same_documents(folder, tmp_path):
    lines = tmp_path / "documents.jsonl"
    lines.write_text("".join(json.dumps({"body": text, "id": i}) + "\n" for i, text in enumerate(TEXTS)))
    from_folder = DocumentsDataModule(path=str(folder), batch_size=2, seq_len=8)
    from_lines = DocumentsDataModule(path=str(lines), field="body", batch_size=2, seq_len=8)
    assert from_folder.read_documents() == from_lines.read_documents() == TEXTS
    # 10 documents: 1 for validation, 1 for test (a tenth each, at least one), the rest train
    decoded = {
        split: [from_folder.decode(d) for d in from_folder.documents(split)] for split in ("train", "val", "test")
    }
    assert decoded == {"train": TEXTS[:8], "val": [TEXTS[8]], "test": [TEXTS[9]]}


@pytest.mark.parametrize(
    "content, match",
    [
        ('{"text": "a"}\nnot json\n', r"line 2 of `data.path`=.* must be a JSON object .*got invalid JSON"),
        (
            '{"text": "a"}\n{"title": "b"}\n',
            r"line 2 .* must be an object with a string under `data.field`='text', got \['title'\]",
        ),
        ('{"text": "a"}\n{"text": "b"}\n', r"must hold at least 3 non-empty documents .*got 2"),
    ],
)
def test_bad_json_lines_are_refused_naming_the_setting_and_the_line(tmp_path, content, match):
    path = tmp_path / "bad.jsonl"
    path.write_text(content)
    with pytest.raises(ValueError, match=match):
        DocumentsDataModule(path=str(path)).load_corpus()


def test_hidden_files_and_folders_are_skipped_and_a_binary_file_is_named_as_binary(folder):
    (folder / ".git").mkdir()
    (folder / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    (folder / ".ipynb_checkpoints").mkdir()
    (folder / ".ipynb_checkpoints" / "doc00-checkpoint.txt").write_text("an older copy")
    (folder / ".notes.txt").write_text("a hidden file")
    assert DocumentsDataModule(path=str(folder)).read_documents() == TEXTS
    (folder / "sub").mkdir()
    (folder / "sub" / "index").write_bytes(b"DIRC\x00\x00\x00\x02\xff\xfe")
    with pytest.raises(ValueError, match=r"'.*sub/index' under `data.path` is a binary file \(it holds NUL bytes\)"):
        DocumentsDataModule(path=str(folder)).read_documents()
    (folder / "sub" / "index").write_bytes(b"valid utf-8 with a NUL \x00 byte")
    with pytest.raises(ValueError, match=r"is a binary file") as refused:
        DocumentsDataModule(path=str(folder)).read_documents()
    assert "data.encoding" not in str(refused.value)
    (folder / "sub" / "index").write_bytes("caf\xe9 in latin-1".encode("latin-1"))
    with pytest.raises(ValueError, match=r"cannot read .* as utf-8 text .*; set data.encoding if it is text"):
        DocumentsDataModule(path=str(folder)).read_documents()


def test_json_lines_split_at_newlines_only(tmp_path):
    texts = ["a line separator\u2028inside", "a next line\x85inside", "a paragraph\u2029and a form feed\x0c", "four"]
    path = tmp_path / "separators.jsonl"
    path.write_text("".join(json.dumps({"text": text}, ensure_ascii=False) + "\r\n" for text in texts), "utf-8")
    assert DocumentsDataModule(path=str(path)).read_documents() == texts


def test_a_split_with_nothing_to_predict_is_refused_naming_it(tmp_path):
    path = tmp_path / "short.jsonl"
    texts = ["a longer document", "another one", "x", "y"]
    path.write_text("".join(json.dumps({"text": text}) + "\n" for text in texts))
    data = DocumentsDataModule(path=str(path), batch_size=1, seq_len=4, val_fraction=0.25, test_fraction=0.25)
    assert [data.decode(d) for d in data.documents("val")] == ["x"]
    message = r"the val split \(data.val_fraction\) of data.path=.* has nothing to predict: its 1 document\(s\) are 1"
    with pytest.raises(ValueError, match=message):
        data.check_sizes()
    with pytest.raises(ValueError, match=message):
        data.setup("fit")


def test_the_unigram_baseline_counts_only_the_predicted_characters(tmp_path):
    # Every document starts with "Q", which the model never predicts; the rest is "ab" repeated.
    texts = ["Qababab", "Qabab", "Qbbbb", "Qaab"]
    path = tmp_path / "q.jsonl"
    path.write_text("".join(json.dumps({"text": text}) + "\n" for text in texts))
    data = DocumentsDataModule(path=str(path), batch_size=1, seq_len=2, val_fraction=0.25, test_fraction=0.25)
    # training predicts "ababab" + "abab" (a: 5, b: 5); add-one over the vocabulary Q, a, b
    p_a, p_b = 6 / 13, 6 / 13
    expected_val = -(4 * math.log2(p_b)) / 4  # "bbbb"
    expected_test = -(2 * math.log2(p_a) + math.log2(p_b)) / 3  # "aab"
    assert data.unigram_bpc("val") == pytest.approx(expected_val, rel=1e-12)
    assert data.unigram_bpc("test") == pytest.approx(expected_test, rel=1e-12)


def test_a_missing_path_and_bad_fractions_are_refused(tmp_path):
    with pytest.raises(ValueError, match=r"`data.path` must point to a folder of text files or a JSON Lines file"):
        DocumentsDataModule(path=str(tmp_path / "nowhere"))
    with pytest.raises(ValueError, match=r"`data.path` is not set"):
        DocumentsDataModule()
    with pytest.raises(ValueError, match=r"`data.val_fraction` must be in \(0, 0.5\), got 0.7"):
        DocumentsDataModule(path=str(tmp_path), val_fraction=0.7)


def test_training_windows_flag_each_document_start_and_lose_no_token(folder):
    data = DocumentsDataModule(path=str(folder), batch_size=2, seq_len=7)
    data.setup()
    windows = list(data.train_dataloader())
    inputs = torch.cat([w[0] for w in windows], 1)
    targets = torch.cat([w[1] for w in windows], 1)
    reset = torch.cat([w[2] for w in windows], 1)
    assert all(w[0].shape == w[1].shape == w[2].shape == (2, 7) for w in windows)
    tokens, starts = data.corpus.train, data.starts("train")
    stream_len = (tokens.numel() - 1) // 2
    for row in range(2):
        begin = row * stream_len
        expected = tokens[begin : begin + inputs.shape[1]]
        assert torch.equal(inputs[row], expected)
        flags = starts[begin : begin + inputs.shape[1]].clone()
        flags[0] = True
        assert torch.equal(reset[row], flags)
        # the next token is the target, except where it starts another document
        following = tokens[begin + 1 : begin + 1 + inputs.shape[1]]
        next_starts = starts[begin + 1 : begin + 1 + inputs.shape[1]]
        assert torch.equal(targets[row], torch.where(next_starts, torch.full_like(following, IGNORED), following))


def test_evaluation_rows_hold_whole_documents_and_ignore_their_padding():
    documents = [torch.arange(1, n + 1) for n in (9, 4, 6, 3)]
    rows = WholeDocumentRows(documents, batch_size=2, seq_len=4)
    windows = list(rows)
    inputs = torch.cat([w[0] for w in windows], 1)
    targets = torch.cat([w[1] for w in windows], 1)
    reset = torch.cat([w[2] for w in windows], 1)
    # longest first, each to the shorter row: row 0 = [9 tokens, 3 tokens], row 1 = [6, 4]
    assert inputs[0, :12].tolist() == list(range(1, 10)) + [1, 2, 3]
    assert inputs[1, :10].tolist() == list(range(1, 7)) + [1, 2, 3, 4]
    assert reset[0, :12].nonzero().flatten().tolist() == [0, 9]
    assert reset[1, :10].nonzero().flatten().tolist() == [0, 6]
    predicted = (targets != IGNORED).sum().item()
    assert predicted == sum(d.numel() - 1 for d in documents)  # every token after a document's first


SRUPP = dict(rnn="srupp", sru_options={"proj_size": 8, "attention_last_n_layers": 1}, memory_length=200)


@pytest.mark.parametrize("options", [{}, SRUPP], ids=["sru", "srupp-with-memory"])
def test_packed_validation_bpc_equals_the_documents_evaluated_one_by_one(folder, options):
    data = DocumentsDataModule(path=str(folder), batch_size=2, seq_len=5, val_fraction=0.3, test_fraction=0.1)
    seed_everything(0, verbose=False)
    model = language_model(
        vocab_size=data.vocab_size, embedding_dim=8, hidden_size=16, num_layers=2, dropout=0.0, **options
    ).double()
    trainer = tiny_trainer(precision="64-true")
    packed = trainer.validate(model, datamodule=data, verbose=False)[0]["val_bpc"]

    nats, predicted = 0.0, 0
    model.eval()
    with torch.no_grad():
        for document in data.documents("val"):
            document = document.long()
            logits, _ = model(document[:-1].unsqueeze(0))
            nats += F.cross_entropy(logits[0], document[1:], reduction="sum").item()
            predicted += document.numel() - 1
        # the packed windows, read as validation reads them (state carried), in float64
        packed_nats, packed_predicted, state = 0.0, 0, None
        for inputs, targets, reset in data.val_dataloader():
            logits, state = model(inputs, state, reset)
            packed_nats += F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1), reduction="sum")
            packed_predicted += int((targets != IGNORED).sum())
    assert len(data.documents("val")) == 3 and predicted > 3 * 5  # documents longer than a window
    assert packed_predicted == predicted
    assert packed_nats.item() == pytest.approx(nats, rel=1e-12)
    # the run's metric: the loss in float32 (as every run computes it), per predicted character
    assert packed == pytest.approx(nats / predicted / math.log(2), rel=1e-6)


def test_the_lstm_model_refuses_document_boundaries():
    tokens, reset = torch.zeros(2, 4, dtype=torch.long), torch.zeros(2, 4, dtype=torch.bool)
    lstm = language_model(vocab_size=5, rnn="lstm", embedding_dim=4, hidden_size=4, num_layers=1)
    with pytest.raises(ValueError, match=r"need rnn='sru' or 'srupp', got rnn='lstm'"):
        lstm(tokens, None, reset)
