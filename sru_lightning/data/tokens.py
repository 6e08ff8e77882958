"""Token ids <-> text for one corpus: bytes, characters or words.

A `TokenCodec` is all a trained model needs to read a prompt and write its output, so it is
saved in checkpoints (as plain lists and strings: loadable with `weights_only=True`).
"""

from __future__ import annotations

import codecs
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

TOKEN_LEVELS = ("byte", "char", "word")
END_OF_LINE = "<eos>"  # word level: the token closing every line (see streams.word_tokens)
UNKNOWN_WORD = "<unk>"


def token_unit(level: str) -> str:
    """The unit metrics are counted in: "word" for words, "char" for characters and bytes."""
    if level not in TOKEN_LEVELS:
        raise ValueError(f"token_unit: `level` must be one of {TOKEN_LEVELS}, got {level!r}")
    return "word" if level == "word" else "char"


class TokenCodec:
    """Encodes text to token ids and decodes ids to text.

    * ``byte``: ids are UTF-8 byte values (vocabulary 256, no table);
    * ``char``: one character per id, ``itos[id]``;
    * ``word``: whitespace-separated words; the end-of-line token is a newline, every other
      word is separated from the text before it by one space.
    """

    def __init__(
        self,
        level: str,
        itos: Sequence[str] | None = None,
        *,
        unknown: str | None = None,
        end_of_line: str = END_OF_LINE,
    ) -> None:
        if level not in TOKEN_LEVELS:
            raise ValueError(f"TokenCodec: `level` must be one of {TOKEN_LEVELS}, got {level!r}")
        if (level == "byte") != (itos is None):
            raise ValueError(
                f"TokenCodec: `itos` must be None at byte level and a list of tokens otherwise, "
                f"got {type(itos).__name__} for level {level!r}"
            )
        self.level = level
        self.itos = None if itos is None else list(itos)
        self.unknown = unknown
        self.end_of_line = end_of_line
        self.stoi = {} if self.itos is None else {token: index for index, token in enumerate(self.itos)}

    @property
    def vocab_size(self) -> int:
        return 256 if self.itos is None else len(self.itos)

    # -- checkpoint form --------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {"level": self.level, "itos": self.itos, "unknown": self.unknown, "end_of_line": self.end_of_line}

    @classmethod
    def from_state_dict(cls, state: Mapping[str, Any]) -> TokenCodec:
        return cls(
            state["level"],
            state.get("itos"),
            unknown=state.get("unknown"),
            end_of_line=state.get("end_of_line", END_OF_LINE),
        )

    # -- text -> ids ------------------------------------------------------------------------
    def encode(self, text: str) -> list[int]:
        """Token ids of `text`; unknown words map to the unknown token, unknown characters are an error."""
        if self.level == "byte":
            return list(text.encode("utf-8"))
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

    # -- ids -> text ------------------------------------------------------------------------
    def decode(self, ids: Iterable[int]) -> str:
        write = self.decoder()
        return "".join(write(int(index)) for index in ids) + write.flush()

    def decoder(self, after: str = "") -> _StreamDecoder:
        """A callable turning one id at a time into the text to append to `after`."""
        return _StreamDecoder(self, after)


class _StreamDecoder:
    """Incremental decoding: bytes wait for the rest of their UTF-8 sequence, and a word gets
    a space unless the text so far ends with whitespace (or is empty)."""

    def __init__(self, codec: TokenCodec, after: str) -> None:
        self.codec = codec
        self.needs_space = bool(after) and not after[-1].isspace()
        self.bytes = codecs.getincrementaldecoder("utf-8")(errors="replace") if codec.level == "byte" else None

    def __call__(self, index: int) -> str:
        codec = self.codec
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
