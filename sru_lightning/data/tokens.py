"""Token ids <-> text for one corpus: bytes, characters, words or byte-level BPE subwords.

A `TokenCodec` is all a trained model needs to read a prompt and write its output, so it is
saved in checkpoints (as plain lists and strings: loadable with `weights_only=True`).
"""

from __future__ import annotations

import codecs
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from .subwords import BytePairs

TOKEN_LEVELS = ("byte", "char", "word", "bpe")
END_OF_LINE = "<eos>"  # word level: the token closing every line (see streams.word_tokens)
UNKNOWN_WORD = "<unk>"


#: The unit metrics are counted in per level: a byte or character is a "char", a BPE subword a
#: "token" (several bytes, a different number for every vocabulary: compare runs in bits per byte).
TOKEN_UNITS = {"byte": "char", "char": "char", "word": "word", "bpe": "token"}


def token_unit(level: str) -> str:
    """The unit metrics are counted in: "word" for words, "char" for characters and bytes,
    "token" for BPE subwords."""
    if level not in TOKEN_LEVELS:
        raise ValueError(f"token_unit: `level` must be one of {TOKEN_LEVELS}, got {level!r}")
    return TOKEN_UNITS[level]


class TokenCodec:
    """Encodes text to token ids and decodes ids to text.

    * ``byte``: ids are UTF-8 byte values (vocabulary 256, no table);
    * ``char``: one character per id, ``itos[id]``;
    * ``word``: whitespace-separated words; the end-of-line token is a newline, every other
      word is separated from the text before it by one space;
    * ``bpe``: byte-level BPE subwords; `tokenizer` is the trained tokenizer's JSON
      (:func:`sru_lightning.data.subwords.train_bpe`), each id stands for one or more bytes.
    """

    def __init__(
        self,
        level: str,
        itos: Sequence[str] | None = None,
        *,
        unknown: str | None = None,
        end_of_line: str = END_OF_LINE,
        tokenizer: str | None = None,
    ) -> None:
        if level not in TOKEN_LEVELS:
            raise ValueError(f"TokenCodec: `level` must be one of {TOKEN_LEVELS}, got {level!r}")
        if (level in ("byte", "bpe")) != (itos is None):
            raise ValueError(
                f"TokenCodec: `itos` must be None at byte and bpe level and a list of tokens otherwise, "
                f"got {type(itos).__name__} for level {level!r}"
            )
        if (level == "bpe") != (tokenizer is not None):
            raise ValueError(
                f"TokenCodec: `tokenizer` must be the tokenizer's JSON at bpe level and None otherwise, "
                f"got {type(tokenizer).__name__} for level {level!r}"
            )
        self.level = level
        self.itos = None if itos is None else list(itos)
        self.unknown = unknown
        self.end_of_line = end_of_line
        self.tokenizer = tokenizer
        self.stoi = {} if self.itos is None else {token: index for index, token in enumerate(self.itos)}
        self._pairs = None if tokenizer is None else BytePairs(tokenizer)

    @property
    def vocab_size(self) -> int:
        if self._pairs is not None:
            return self._pairs.size
        return 256 if self.itos is None else len(self.itos)

    def token_byte_lengths(self) -> list[int]:
        """How many UTF-8 bytes each token id stands for (index: id), what bits per byte divide
        by: 1 per byte, each character's UTF-8 length, each word's plus 1 for the space or
        newline that separates it (the end-of-line token: 1), each BPE token's bytes."""
        if self._pairs is not None:
            return [len(token) for token in self._pairs.token_bytes]
        if self.itos is None:
            return [1] * 256
        if self.level == "char":
            return [len(token.encode("utf-8")) for token in self.itos]
        return [1 if token == self.end_of_line else len(token.encode("utf-8")) + 1 for token in self.itos]

    # -- checkpoint form --------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Plain lists and strings (a BPE vocabulary as the tokenizer's JSON text), so a checkpoint
        holding it loads with ``torch.load(weights_only=True)``."""
        state = {"level": self.level, "itos": self.itos, "unknown": self.unknown, "end_of_line": self.end_of_line}
        if self.tokenizer is not None:
            state["tokenizer"] = self.tokenizer
        return state

    @classmethod
    def from_state_dict(cls, state: Mapping[str, Any]) -> TokenCodec:
        return cls(
            state["level"],
            state.get("itos"),
            unknown=state.get("unknown"),
            end_of_line=state.get("end_of_line", END_OF_LINE),
            tokenizer=state.get("tokenizer"),
        )

    # -- text -> ids ------------------------------------------------------------------------
    def encode(self, text: str) -> list[int]:
        """Token ids of `text`; unknown words map to the unknown token, unknown characters are an error."""
        if self.level == "byte":
            return list(text.encode("utf-8"))
        if self._pairs is not None:
            return self._pairs.encode(text)
        if self.level == "char":
            missing = sorted({character for character in text if character not in self.stoi})
            if missing:
                raise ValueError(
                    f"characters {''.join(missing[:10])!r} are not in the model's vocabulary of "
                    f"{self.vocab_size} characters"
                )
            return [self.stoi[character] for character in text]
        tokens: list[str] = []
        for index, line in enumerate(text.split("\n")):
            if index > 0:
                tokens.append(self.end_of_line)
            tokens.extend(line.split())
        unknown_id = self.stoi.get(self.unknown) if self.unknown is not None else None
        missing = [token for token in tokens if token not in self.stoi]
        if missing and unknown_id is None:
            raise ValueError(f"words {missing[:5]!r} are not in the model's vocabulary of {self.vocab_size} words")
        return [self.stoi.get(token, unknown_id) for token in tokens]

    def encode_in_parts(self, text: str) -> Iterable[list[int]]:
        """`encode(text)` in consecutive parts (the same ids, in order); a long BPE text is encoded
        a few pieces at a time."""
        if self._pairs is not None:
            yield from self._pairs.encode_in_parts(text)
        else:
            yield self.encode(text)

    # -- ids -> text ------------------------------------------------------------------------
    def decode(self, ids: Iterable[int]) -> str:
        write = self.decoder()
        return "".join(write(int(index)) for index in ids) + write.flush()

    def decoder(self, after: str = "") -> _StreamDecoder:
        """A callable turning one id at a time into the text to append to `after`."""
        return _StreamDecoder(self, after)


class _StreamDecoder:
    """Incremental decoding: bytes (and BPE tokens, which may end inside a character) wait for
    the rest of their UTF-8 sequence, and a word gets a space unless the text so far ends with
    whitespace (or is empty)."""

    def __init__(self, codec: TokenCodec, after: str) -> None:
        self.codec = codec
        self.needs_space = bool(after) and not after[-1].isspace()
        self.token_bytes = codec._pairs.token_bytes if codec._pairs is not None else None
        reads_bytes = codec.level in ("byte", "bpe")
        self.bytes = codecs.getincrementaldecoder("utf-8")(errors="replace") if reads_bytes else None

    def __call__(self, index: int) -> str:
        codec = self.codec
        if self.token_bytes is not None:
            return self.bytes.decode(self.token_bytes[index])
        if self.bytes is not None:
            return self.bytes.decode(bytes((index,)))
        token = codec.itos[index]
        if codec.level == "char":
            return token
        if token == codec.end_of_line:
            self.needs_space = False
            return "\n"
        piece = f" {token}" if self.needs_space else token
        self.needs_space = True
        return piece

    def flush(self) -> str:
        """Whatever an unfinished byte sequence stands for (a replacement character)."""
        return self.bytes.decode(b"", final=True) if self.bytes is not None else ""
