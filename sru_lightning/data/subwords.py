"""Byte-level BPE vocabularies, trained and applied by Hugging Face `tokenizers`.

A vocabulary is the tokenizer's own JSON (``Tokenizer.to_str()``), a plain string: it is what a
checkpoint and an export's vocabulary.json keep. Its first 256 ids are the single bytes, the
rest merges learned from the training text, so every text (any UTF-8) is encoded without an
unknown token and decoded back to itself.

`tokenizers` is imported only here, and only when a BPE vocabulary is trained or read.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

#: The smallest `data.vocab_size` of a BPE vocabulary: the 256 single bytes and one merge.
MIN_BPE_VOCAB_SIZE = 257
#: Texts are encoded in pieces of about this many characters (see `text_pieces`).
_PIECE_CHARS = 1 << 20
#: Pieces encoded together (in parallel) at a time.
_PIECES_PER_BATCH = 8


def _tokenizers():
    try:
        import tokenizers
    except ImportError:
        raise ImportError(
            "data.tokenizer=bpe needs the Hugging Face `tokenizers` package: pip install sru_lightning[tokenizers]"
        ) from None
    return tokenizers


def byte_symbols() -> list[str]:
    """The character standing for each byte value (index) in a byte-level vocabulary's tokens.

    Bytes that are printable Latin-1 characters stand for themselves; the others (controls, the
    space, the no-break space, the soft hyphen) for the characters from U+0100 on, in byte
    order, so every token is a printable string (a space is ``Ġ``, a newline ``Ċ``)."""
    printable = {*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)}
    symbols, shifted = [], 0
    for value in range(256):
        if value in printable:
            symbols.append(chr(value))
        else:
            symbols.append(chr(0x100 + shifted))
            shifted += 1
    return symbols


def train_bpe(texts: Iterable[str], vocab_size: int) -> str:
    """The JSON of a byte-level BPE tokenizer with at most `vocab_size` tokens learned from `texts`
    (fewer when the texts hold fewer pairs worth merging). The same texts give the same JSON."""
    tokenizers = _tokenizers()
    from tokenizers import decoders, models, pre_tokenizers, trainers

    tokenizer = tokenizers.Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),  # every byte, seen in training or not
        special_tokens=[],
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    return tokenizer.to_str()


class BytePairs:
    """A trained tokenizer (from its JSON) and the bytes each of its token ids stands for."""

    def __init__(self, tokenizer_json: str) -> None:
        if not isinstance(tokenizer_json, str) or not tokenizer_json:
            raise ValueError(
                f"TokenCodec: a bpe vocabulary must be the tokenizer's JSON text, got {type(tokenizer_json).__name__}"
            )
        tokenizers = _tokenizers()
        try:
            self.tokenizer = tokenizers.Tokenizer.from_str(tokenizer_json)
        except Exception as error:  # the Rust side raises plain Exception for a malformed file
            raise ValueError(f"TokenCodec: the bpe vocabulary is not a tokenizer's JSON: {error}") from None
        symbol_bytes = {symbol: value for value, symbol in enumerate(byte_symbols())}
        vocabulary: dict[str, int] = self.tokenizer.get_vocab(with_added_tokens=True)
        self.size = len(vocabulary)
        table: list[bytes | None] = [None] * self.size
        for token, index in vocabulary.items():
            if not 0 <= index < self.size or any(symbol not in symbol_bytes for symbol in token):
                raise ValueError(
                    f"TokenCodec: the bpe vocabulary is not a byte-level one (token {token!r}, id {index})"
                )
            table[index] = bytes(symbol_bytes[symbol] for symbol in token)
        self.token_bytes: list[bytes] = table  # type: ignore[assignment]  (ids are 0..size-1, each once)

    def encode(self, text: str) -> list[int]:
        return [index for ids in self.encode_in_parts(text) for index in ids]

    def encode_in_parts(self, text: str) -> Iterator[list[int]]:
        """The ids of `text` in consecutive parts of a few pieces each (encoded in parallel), so a
        long text never has all its encodings in memory at once."""
        pieces = list(text_pieces(text))
        for start in range(0, len(pieces), _PIECES_PER_BATCH):
            encodings = self.tokenizer.encode_batch(pieces[start : start + _PIECES_PER_BATCH], add_special_tokens=False)
            yield [index for encoding in encodings for index in encoding.ids]


def text_pieces(text: str, piece_chars: int | None = None) -> Iterator[str]:
    """`text` cut into pieces of about `piece_chars` characters that encode to the same ids as the
    whole: each cut is before a newline that follows a non-space character, where the byte-level
    pre-tokenizer always starts a new word (no word runs from a non-space character into a space)."""
    piece_chars = piece_chars or _PIECE_CHARS
    start = 0
    while start < len(text):
        cut = len(text)
        if start + piece_chars < len(text):
            cut = text.find("\n", start + piece_chars)
            while cut != -1 and text[cut - 1].isspace():
                cut = text.find("\n", cut + 1)
            if cut == -1:
                cut = len(text)
        yield text[start:cut]
        start = cut
