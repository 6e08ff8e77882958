"""A token codec as Hugging Face `tokenizers` JSON: the ``tokenizer.json`` of a pretrained folder,
which ``PreTrainedTokenizerFast`` / ``AutoTokenizer`` read at every token level, and back.

The tokenizer gives the codec's ids for every text the codec reads
(:class:`~sru_lightning.data.tokens.TokenCodec`), and decodes ids to the codec's text:

* ``byte``: a byte-level BPE without merges, token `b` standing for byte `b`;
* ``char``: one token per character (each character its own piece, looked up in the list); a
  character outside the vocabulary is an error, as in the codec;
* ``word``: the codec's words: a newline becomes the end-of-line token, other whitespace
  separates words, an unknown word is the codec's unknown token (none: an error); decoding puts
  one space between words and none around a newline;
* ``bpe``: the trained tokenizer's own JSON, unchanged.

Padding needs a token of its own that no text encodes to: ``tokenizer_config.json`` adds
``<pad>`` after the vocabulary (id = vocabulary size) as a special token with
``split_special_tokens`` on, so the string "<pad>" in a text is read as text. The model
never reads a padded position (its attention mask is 0 there).

`tokenizers` is imported only when a file is written or read.
"""

from __future__ import annotations

import json
from typing import Any

__all__ = ["PAD_TOKEN", "codec_state_from_tokenizer_json", "tokenizer_config", "tokenizer_json"]

#: The padding token tokenizer_config.json adds after the vocabulary.
PAD_TOKEN = "<pad>"


def _tokenizers():
    try:
        import tokenizers
    except ImportError:
        raise ImportError(
            "a pretrained folder's tokenizer.json needs the Hugging Face `tokenizers` package: "
            "pip install sru_lightning[tokenizers]"
        ) from None
    return tokenizers


def tokenizer_json(codec) -> str:
    """The `tokenizers` JSON of `codec` (a TokenCodec) at its level."""
    if codec.level == "bpe":
        return codec.tokenizer
    tokenizers = _tokenizers()
    from tokenizers import Regex, decoders, models, normalizers, pre_tokenizers

    from sru_lightning.data.subwords import byte_symbols

    if codec.level == "byte":
        vocabulary = {symbol: value for value, symbol in enumerate(byte_symbols())}
        tokenizer = tokenizers.Tokenizer(models.BPE(vocab=vocabulary, merges=[]))
        tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
        tokenizer.decoder = decoders.ByteLevel()
        return tokenizer.to_str()
    vocabulary = {token: index for index, token in enumerate(codec.itos)}
    if codec.level == "char":
        tokenizer = tokenizers.Tokenizer(models.WordLevel(vocab=vocabulary, unk_token=None))
        tokenizer.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), "isolated")  # every character a piece
        tokenizer.decoder = decoders.Fuse()
        return tokenizer.to_str()
    unknown = codec.unknown if codec.unknown in vocabulary else None
    tokenizer = tokenizers.Tokenizer(models.WordLevel(vocab=vocabulary, unk_token=unknown))
    end_of_line = codec.end_of_line
    tokenizer.normalizer = normalizers.Replace("\n", f" {end_of_line} ")
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    # " w1 w2 <eos> w3": a space before every token, then the end-of-line token (a whole token:
    # followed by a space or the end) becomes a newline with no space on either side.
    tokenizer.decoder = decoders.Sequence(
        [
            decoders.Replace(Regex("^"), " "),
            decoders.Fuse(),
            decoders.Replace(Regex(f" {_escaped(end_of_line)}(?= |$)"), "\n"),
            decoders.Replace("\n ", "\n"),
            decoders.Strip(" ", 1, 0),
        ]
    )
    return tokenizer.to_str()


def _escaped(text: str) -> str:
    """`text` as a literal inside an Oniguruma pattern."""
    return "".join(f"\\{character}" if not character.isalnum() else character for character in text)


def tokenizer_config(codec) -> dict[str, Any]:
    """tokenizer_config.json: the class that reads tokenizer.json (no code of ours needed), the
    padding token added after the vocabulary, and left padding (what generation needs)."""
    pad_id = codec.vocab_size
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "pad_token": PAD_TOKEN,
        "padding_side": "left",
        "split_special_tokens": True,
        "clean_up_tokenization_spaces": False,
        "model_max_length": 1_000_000_000,  # a recurrent network reads any length
        "added_tokens_decoder": {
            str(pad_id): {
                "content": PAD_TOKEN,
                "special": True,
                "lstrip": False,
                "rstrip": False,
                "normalized": False,
                "single_word": False,
            }
        },
    }


def codec_state_from_tokenizer_json(text: str, entry: dict[str, Any]) -> dict[str, Any]:
    """The codec state (TokenCodec.state_dict) of a tokenizer.json at the level config.json's
    `tokenizer` entry names. Raises ValueError in one line for a file that is not such JSON or
    whose vocabulary is not a list of ids 0..n-1. Tokens added on top (padding) are left out."""
    level = entry.get("level")
    try:
        document = json.loads(text)
    except ValueError as error:
        raise ValueError(f"it is not JSON ({error})") from None
    if not isinstance(document, dict) or not isinstance(document.get("model"), dict):
        raise ValueError("it is not a Hugging Face tokenizers file (no `model` object)")
    state = {"level": level, "itos": None, "unknown": entry.get("unknown"), "end_of_line": entry.get("end_of_line")}
    if level == "bpe":
        # The trained tokenizer itself; tokens added on top (a padding token that
        # tokenizer.save_pretrained wrote in) are not part of the codec's vocabulary.
        if document.get("added_tokens"):
            document["added_tokens"] = []
            text = json.dumps(document)
        state["tokenizer"] = text
        return state
    vocabulary = document["model"].get("vocab")
    if level == "byte":
        if not isinstance(vocabulary, dict) or len(vocabulary) != 256:
            raise ValueError("its `model.vocab` must hold the 256 bytes at byte level")
        return state
    if not isinstance(vocabulary, dict) or sorted(vocabulary.values()) != list(range(len(vocabulary))):
        raise ValueError(f"its `model.vocab` must map {level} tokens to the ids 0..n-1, each once")
    itos = [""] * len(vocabulary)
    for token, index in vocabulary.items():
        itos[index] = token
    state["itos"] = itos
    return state
