"""An export folder's tokenizer.json is read by AutoTokenizer / PreTrainedTokenizerFast at every
token level, with the package codec's ids and text; both loaders read the folder, also after
transformers' own save_pretrained of the model and the tokenizer."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip(
    "transformers", reason="the transformers classes need the `hf` extra: pip install 'sru_lightning[hf]'"
)

from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerFast  # noqa: E402

from sru_lightning.data import TokenCodec  # noqa: E402
from sru_lightning.data.subwords import train_bpe  # noqa: E402
from sru_lightning.export.pretrained import from_pretrained, save_pretrained  # noqa: E402
from sru_lightning.nn import LanguageNet  # noqa: E402

TRAINING_TEXT = "the cat sat on the mat.\nnaïve café, the end\n\nso it goes\t here\n" * 4
TEXTS = ["the cat sat", "so it goes\n\nthe end", "naïve café, the\tmat.\n", " the  cat \n", "€ ünïcode\n"]


def codec_of(level: str) -> TokenCodec:
    if level == "byte":
        return TokenCodec("byte")
    if level == "char":
        return TokenCodec("char", sorted(set(TRAINING_TEXT + "€ü")))
    if level == "word":
        words = sorted({word for line in TRAINING_TEXT.split("\n") for word in line.split()} | {"<eos>", "<unk>"})
        return TokenCodec("word", words, unknown="<unk>")
    return TokenCodec("bpe", tokenizer=train_bpe([TRAINING_TEXT], 300))


@pytest.fixture(scope="module", params=["byte", "char", "word", "bpe"])
def folder(request, tmp_path_factory):
    codec = codec_of(request.param)
    torch.manual_seed(0)
    net = LanguageNet(codec.vocab_size, embedding_dim=8, hidden_size=16, num_layers=1).eval()
    return save_pretrained(net, tmp_path_factory.mktemp(request.param) / "hf", codec), codec


def test_the_tokenizer_gives_the_codecs_ids_and_text(folder):
    path, codec = folder
    for tokenizer in (AutoTokenizer.from_pretrained(path), PreTrainedTokenizerFast.from_pretrained(path)):
        for text in TEXTS:
            ids = codec.encode(text)
            assert tokenizer(text)["input_ids"] == ids, (codec.level, text)
            assert tokenizer.decode(ids) == codec.decode(ids), (codec.level, text)
            assert tokenizer.decode(ids, skip_special_tokens=True) == codec.decode(ids)
        assert tokenizer.pad_token_id == codec.vocab_size and tokenizer.padding_side == "left"
        if codec.level != "char":  # (its characters are not in the char vocabulary)
            assert tokenizer("a <pad>")["input_ids"] == codec.encode("a <pad>")  # the pad token is never read from text


def test_both_loaders_read_what_transformers_save_pretrained_writes(folder, tmp_path):
    path, codec = folder
    model, tokenizer = AutoModelForCausalLM.from_pretrained(path), AutoTokenizer.from_pretrained(path)
    model.save_pretrained(tmp_path / "again")
    tokenizer.save_pretrained(tmp_path / "again")
    net, again_codec = from_pretrained(tmp_path / "again")
    assert again_codec.state_dict() == codec.state_dict() or again_codec.level == "bpe"
    assert again_codec.encode(TEXTS[2]) == codec.encode(TEXTS[2])
    again = AutoModelForCausalLM.from_pretrained(tmp_path / "again")
    tokens = torch.tensor([codec.encode(TEXTS[0])])
    with torch.no_grad():
        expected = model(input_ids=tokens).logits
        assert torch.equal(net(tokens)[0], expected) and torch.equal(again(input_ids=tokens).logits, expected)
    assert AutoTokenizer.from_pretrained(tmp_path / "again")(TEXTS[1])["input_ids"] == codec.encode(TEXTS[1])
