"""Pieces of a corpus to provisional token ids, for `prepare`.

Before the whole corpus has been read, its vocabulary is not known (characters sort by code
point over all the text; words come from the training split alone), so tokens get provisional
ids, in order of first appearance, mapped to the final ids once every piece has been read.
Characters are looked up in a table, vectorised, in the main process. Words are split in worker
processes, each piece against a vocabulary of its own (its words, and per token the index of
its word), so every core splits; a bounded number of pieces is in flight at a time, so memory
stays flat.
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.pool
import os
import signal
import threading
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from queue import Empty, Full, Queue
from typing import Any

import numpy as np

from .streams import word_tokens

#: Unicode's code points: the size of a per-character lookup table.
CODE_POINTS = 0x110000
#: The table's mark of a character not seen yet (so at most 65535 distinct characters).
UNSEEN = 2**16 - 1


#: Indices looked up at a time by `look_up`: its index copies stay in the processor's cache.
_LOOK_UP_CHUNK = 1 << 16


def look_up(table: np.ndarray, indices: np.ndarray) -> np.ndarray:
    """``table[indices]``, about twice as fast on long arrays: numpy makes each index an int64
    first, and a block at a time keeps that copy in the cache instead of memory."""
    out = np.empty(indices.size, dtype=table.dtype)
    for start in range(0, indices.size, _LOOK_UP_CHUNK):
        np.take(table, indices[start : start + _LOOK_UP_CHUNK], out=out[start : start + _LOOK_UP_CHUNK])
    return out


def word_symbols(piece: str) -> tuple[list[str], np.ndarray, np.ndarray]:
    """(the words the piece holds, in order of appearance; per token the index of its word; per
    word the index of its first token), with the end-of-line token closing each line, as
    :func:`~sru_lightning.data.streams.word_tokens` splits a text."""
    local: dict[str, int] = {}
    ids, firsts = [], []
    for position, token in enumerate(word_tokens(piece)):
        index = local.get(token)
        if index is None:
            index = local[token] = len(local)
            firsts.append(position)
        ids.append(index)
    return list(local), np.asarray(ids, dtype=np.uint32), np.asarray(firsts, dtype=np.int64)


def ordered_map(
    function: Callable[[Any], Any],
    items: Iterable[Any],
    workers: int,
    initializer: Callable[..., None] | None = None,
    initargs: tuple = (),
    child_environment: dict[str, str] | None = None,
) -> Iterator[Any]:
    """`map(function, items)` on `workers` processes, in order, with at most 2 x `workers` items
    in flight (multiprocessing's own imap reads all of `items` ahead). `initializer(*initargs)`
    runs once in each worker (in this process when `workers` <= 1); `child_environment` is set
    while the workers start (so it is theirs from their first instruction) and then undone."""
    if workers <= 1:
        if initializer is not None:
            initializer(*initargs)
        yield from map(function, items)
        return
    saved = {name: os.environ.get(name) for name in child_environment or {}}
    os.environ.update(child_environment or {})
    try:
        pool = _pool_context().Pool(workers, _start_worker, (initializer, initargs))
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
    try:
        pending: deque = deque()
        for item in items:
            pending.append(pool.apply_async(function, (item,)))
            if len(pending) >= 2 * workers:
                yield pending.popleft().get()
        while pending:
            yield pending.popleft().get()
        pool.close()  # done: the workers end once their queue is empty
        pool.join()
    except BaseException:  # an error, Ctrl+C or an abandoned iterator (GeneratorExit)
        _end_pool(pool)
        raise


#: Seconds a terminated pool's workers get to end on SIGTERM before they are killed.
TERMINATE_GRACE_S = 10.0


def _end_pool(pool: multiprocessing.pool.Pool) -> None:
    """`pool.terminate()` (SIGTERM to each worker), killing the workers still alive after
    TERMINATE_GRACE_S: a worker forked while another thread of this process held a lock can hang
    before `_start_worker` resets its SIGTERM handler, and with a parent's handler that only takes
    note, SIGTERM would never end it and terminate would wait for it forever."""
    ended = threading.Event()

    def kill_the_rest() -> None:
        if not ended.wait(TERMINATE_GRACE_S):
            for worker in list(pool._pool):  # the pool's worker processes (multiprocessing's own list)
                if worker.is_alive():
                    worker.kill()

    threading.Thread(target=kill_the_rest, name="pool-terminate-grace", daemon=True).start()
    try:
        pool.terminate()
    finally:
        ended.set()


def _pool_context() -> multiprocessing.context.BaseContext:
    """Forked workers where the system has fork (they start in milliseconds, with the parent's
    imports), whatever the process-wide start method: LitData's `optimize` sets it to spawn, after
    which every worker would start a new interpreter and import the package again (seconds)."""
    if "fork" in multiprocessing.get_all_start_methods():
        return multiprocessing.get_context("fork")
    return multiprocessing.get_context()


def _start_worker(initializer: Callable[..., None] | None, initargs: tuple) -> None:
    # Ctrl+C reaches every process of the terminal's group: this one's parent says it in one line
    # and ends the workers, which would otherwise each print a traceback
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # A forked worker inherits its parent's handlers; one that only notes a SIGTERM (a fit's
    # signal handling, a job's preemption hook) would keep the pool's terminate waiting forever.
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    if initializer is not None:
        initializer(*initargs)


def read_ahead(items: Iterable[Any], depth: int = 2) -> Iterator[Any]:
    """`items` in order, produced by a thread up to `depth` items ahead of the consumer: reading
    and decoding a file, numpy's gathers, hashing and writing release the GIL, so the producer
    and the consumer share two cores. An exception of the producer is raised to the consumer."""
    done = object()
    queue: Queue = Queue(maxsize=depth)
    stopped = threading.Event()

    def produce() -> None:
        try:
            for item in items:
                while not stopped.is_set():
                    try:
                        queue.put((item, None), timeout=0.1)
                        break
                    except Full:
                        continue
                if stopped.is_set():
                    return
            queue.put((done, None))
        except BaseException as error:  # handed to the consumer, raised there
            queue.put((done, error))

    producer = threading.Thread(target=produce, name="read-ahead", daemon=True)
    producer.start()
    try:
        while True:
            item, error = queue.get()
            if item is done:
                if error is not None:
                    raise error
                return
            yield item
    finally:
        stopped.set()
        while producer.is_alive():  # unblock a producer waiting to put, then let it end
            try:
                queue.get(timeout=0.1)
            except Empty:
                pass
        producer.join()


class ProvisionalVocabulary:
    """Symbols (code points or words) numbered in order of first appearance, and for words the
    position of the first token of each (what decides whether it is in the training split)."""

    def __init__(self, unit: str) -> None:
        self.unit = unit
        # code point -> provisional id; UNSEEN until the character appears
        self.table = np.full(CODE_POINTS, UNSEEN, dtype=np.uint16) if unit == "char" else None
        self.words: dict[str, int] = {}
        self.first_position: list[int] = []
        self.size = 0

    def char_ids(self, piece: str) -> np.ndarray:
        """The provisional ids (uint16) of a piece's characters: one table look-up per character,
        new characters numbered as they appear (vectorised: this is the speed of `prepare`)."""
        encoded = piece.encode("utf-16-le")
        if len(encoded) == 2 * len(piece):  # no character past U+FFFF: the units are the code points
            code_points = np.frombuffer(encoded, dtype=np.uint16)  # half the bytes to read
        else:
            code_points = np.frombuffer(piece.encode("utf-32-le"), dtype=np.uint32)
        ids = look_up(self.table, code_points)
        if ids.max(initial=0) == UNSEEN:  # UNSEEN is the largest uint16: a maximum is the cheapest test
            unseen = np.flatnonzero(ids == UNSEEN)
            present = np.zeros(CODE_POINTS, dtype=bool)  # marking beats sorting many new characters
            present[code_points[unseen]] = True
            new = np.flatnonzero(present)
            if self.size + new.size >= UNSEEN:
                raise ValueError(
                    f"the text holds more than {UNSEEN - 1} distinct characters; prepare it with data.tokenizer=bpe "
                    "(a byte-level vocabulary) instead"
                )
            self.table[new] = np.arange(self.size, self.size + new.size, dtype=np.uint16)
            self.size += new.size
            ids[unseen] = self.table[code_points[unseen]]  # only these: a new character is rare
        return ids

    def word_ids(self, symbols: list[str], local_ids: np.ndarray, firsts: np.ndarray, position: int) -> np.ndarray:
        """The provisional ids (uint32) of a piece's words (`symbols`, `local_ids`, `firsts` from
        :func:`word_symbols`); `position` is the piece's first token's position in the corpus."""
        mapping = np.empty(len(symbols), dtype=np.uint32)
        for index, word in enumerate(symbols):
            known = self.words.get(word)
            if known is None:
                known = self.words[word] = self.size
                self.size += 1
                self.first_position.append(position + int(firsts[index]))
            mapping[index] = known
        return mapping[local_ids] if local_ids.size else np.zeros(0, dtype=np.uint32)

    def char_itos(self) -> tuple[list[str], np.ndarray]:
        """(the characters sorted by code point, provisional id -> final id)."""
        code_points = np.flatnonzero(self.table != UNSEEN)
        final = np.empty(self.size, dtype=np.int64)
        final[self.table[code_points]] = np.arange(code_points.size)
        return [chr(point) for point in code_points], final

    def word_itos(self, train_tokens: int, unknown: str) -> tuple[list[str], np.ndarray]:
        """(the vocabulary: the unknown word, then the training split's words sorted; provisional
        id -> final id, a word first seen after the training split -> the unknown word)."""
        in_train = sorted(
            word for word, index in self.words.items() if self.first_position[index] < train_tokens and word != unknown
        )
        itos = [unknown, *in_train]
        stoi = {word: index for index, word in enumerate(itos)}
        final = np.zeros(self.size, dtype=np.int64)
        for word, index in self.words.items():
            final[index] = stoi.get(word, 0)
        return itos, final
