"""Benchmark of packed documents: training throughput packed against padded, and what the op's
document boundaries (``reset``) cost.

``python -m sru_lightning bench documents [length=128 batch=32 hidden=256]``

* trains a small character model (embedding, a 2-layer SRU, a linear decoder, Adam) on the same
  documents of random lengths (uniform in 1..length, so padding each to the length pads about
  half) twice: one document per row padded with ``mask_pad``, and packed end to
  end into full rows with ``reset`` flags; prints the documents' tokens per second of each and
  the ratio (timed interleaved in one process);
* times the recurrence op alone (one layer, forward+backward, float32, k = 3) without flags
  (``reset=None``), with flags that mark no boundary (all False) and with a document start every
  32 steps (every length // 2 steps when the length is under 64, so a boundary falls inside the
  sequence; left out at length 1), with each time's ratio to the call without flags.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from sru_lightning.diagnostics.tables import (
    count_setting,
    fixed_width_lines,
    intra_op_threads,
    repeats_setting,
    statistic_of,
    statistic_setting,
    threads_setting,
    warmup_setting,
)

CASES = ("no flags (reset=None)", "flags, no boundary")
#: Steps between document starts in the op's timing, at lengths of twice this or more.
BOUNDARY_PERIOD = 32


def boundary_period(length: int) -> int:
    """Steps between document starts at sequence `length`: every 32 steps, fewer in a sequence
    under 64 steps, so each document is shorter than the sequence; 0 (no such case) at length 1."""
    return min(BOUNDARY_PERIOD, length // 2)


def cases(length: int) -> tuple[str, ...]:
    """The op timing's cases at sequence `length`: :data:`CASES`, then one with boundaries."""
    period = boundary_period(length)
    return CASES + (f"a document every {period} steps",) if period else CASES


@dataclass
class DocumentsBenchConfig:
    length: int = count_setting(128, "sequence length L")
    batch: int = count_setting(32, "batch size B")
    hidden: int = count_setting(256, "hidden size D (input size too)")
    threads: int = threads_setting(2)
    repeats: int = repeats_setting(15)
    warmup: int = warmup_setting(3)
    statistic: str = statistic_setting("min")


def measure_reset_overhead(config: DocumentsBenchConfig) -> dict[str, float]:
    """Best (or median) milliseconds of one forward+backward of the op for each of :data:`CASES`."""
    from sru_lightning.ops import functional
    from sru_lightning.ops.testing import make_case

    (U, x, weight_c, bias, c0), kwargs = make_case(config.length, config.batch, config.hidden, dtype=torch.float32)
    leaves = [t.requires_grad_(True) for t in (U, x, weight_c, bias, c0)]
    grad_h = torch.randn(config.length, config.batch, config.hidden)
    names = cases(config.length)
    flags = {CASES[0]: None, CASES[1]: torch.zeros(config.length, config.batch, dtype=torch.bool)}
    if len(names) > len(CASES):
        starts = torch.zeros(config.length, config.batch, dtype=torch.bool)
        starts[:: boundary_period(config.length)] = True
        flags[names[-1]] = starts

    def step(reset):
        for leaf in leaves:
            leaf.grad = None
        h, _ = functional.sru_recurrence(*leaves, reset=reset, **kwargs)
        h.backward(grad_h)

    samples: dict[str, list[float]] = {name: [] for name in names}
    with intra_op_threads(config.threads):
        for name in names:
            for _ in range(config.warmup):
                step(flags[name])
        for _ in range(config.repeats):
            for name in names:
                start = time.perf_counter()
                step(flags[name])
                samples[name].append((time.perf_counter() - start) * 1e3)
    pick = statistic_of(config.statistic)
    return {name: pick(times) for name, times in samples.items()}


def _documents(config: DocumentsBenchConfig, count: int) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    lengths = torch.randint(1, config.length + 1, (count,), generator=generator)
    return [torch.randint(0, VOCAB, (int(n),), generator=generator) for n in lengths]


VOCAB = 64


def padded_batches(documents: list[torch.Tensor], batch: int, length: int) -> list[tuple]:
    """(tokens, targets, mask_pad, None) per batch: one document per row, padded to `length` (its
    targets ignored)."""
    batches = []
    for first in range(0, len(documents), batch):
        rows = documents[first : first + batch]
        tokens = torch.zeros(len(rows), length, dtype=torch.long)
        targets = torch.full((len(rows), length), -100, dtype=torch.long)
        for r, document in enumerate(rows):
            tokens[r, : document.numel()] = document
            targets[r, : document.numel() - 1] = document[1:]
        batches.append((tokens, targets, _padding(rows, length), None))
    return batches


def _padding(rows: list[torch.Tensor], length: int) -> torch.Tensor:
    return torch.arange(length)[None, :] >= torch.tensor([row.numel() for row in rows])[:, None]


def packed_batches(documents: list[torch.Tensor], batch: int, length: int) -> list[tuple]:
    """(tokens, targets, None, reset) per batch: the documents end to end in full rows of `length`
    (the last batch padded by ignored targets), a flag at each document's first token."""
    stream = torch.cat(documents)
    starts = torch.zeros(stream.numel(), dtype=torch.bool)
    starts[torch.cumsum(torch.tensor([0] + [d.numel() for d in documents[:-1]]), 0)] = True
    targets = torch.full_like(stream, -100)
    targets[:-1] = torch.where(starts[1:], torch.full_like(stream[1:], -100), stream[1:])
    rows = -(-stream.numel() // length)
    padded = rows * length - stream.numel()
    stream = torch.cat([stream, torch.zeros(padded, dtype=torch.long)]).view(rows, length)
    targets = torch.cat([targets, torch.full((padded,), -100, dtype=torch.long)]).view(rows, length)
    starts = torch.cat([starts, torch.ones(padded, dtype=torch.bool)]).view(rows, length)
    return [
        (stream[first : first + batch], targets[first : first + batch], None, starts[first : first + batch])
        for first in range(0, rows, batch)
    ]


def measure_packing(config: DocumentsBenchConfig) -> dict[str, float]:
    """Tokens per second (the documents' tokens, padding not counted) of one training pass over the
    same documents, padded and packed, and the padding fraction of the padded layout."""
    from torch import nn

    from sru_lightning.nn import SRU

    documents = _documents(config, 4 * config.batch)
    tokens = sum(document.numel() for document in documents)
    layouts = {
        "padded": padded_batches(documents, config.batch, config.length),
        "packed": packed_batches(documents, config.batch, config.length),
    }
    torch.manual_seed(0)
    embedding = nn.Embedding(VOCAB, config.hidden)
    rnn = SRU(config.hidden, config.hidden, num_layers=2, batch_first=True)
    decoder = nn.Linear(config.hidden, VOCAB)
    parameters = [*embedding.parameters(), *rnn.parameters(), *decoder.parameters()]
    optimizer = torch.optim.Adam(parameters, lr=1e-3)

    def epoch(batches):
        for inputs, targets, mask_pad, reset in batches:
            optimizer.zero_grad()
            output, _ = rnn(embedding(inputs), mask_pad=mask_pad, reset=reset)
            logits = decoder(output)
            loss = nn.functional.cross_entropy(logits.reshape(-1, VOCAB), targets.reshape(-1))
            loss.backward()
            optimizer.step()

    samples: dict[str, list[float]] = {name: [] for name in layouts}
    with intra_op_threads(config.threads):
        for batches in layouts.values():
            for _ in range(config.warmup):
                epoch(batches)
        for _ in range(config.repeats):
            for name, batches in layouts.items():
                start = time.perf_counter()
                epoch(batches)
                samples[name].append(time.perf_counter() - start)
    pick = statistic_of(config.statistic)
    rates = {name: tokens / pick(times) for name, times in samples.items()}
    cells = sum(inputs.numel() for inputs, *_ in layouts["padded"])
    return {**rates, "padding": 1.0 - tokens / cells, "tokens": float(tokens)}


def format_packing(config: DocumentsBenchConfig, measured: dict[str, float]) -> str:
    title = (
        f"training on {4 * config.batch} documents of 1..{config.length} tokens ({int(measured['tokens'])} tokens; "
        f"padded to {config.length}: {measured['padding']:.0%} padding), 2-layer SRU, hidden {config.hidden}, "
        f"batch {config.batch}, {config.threads} threads ({config.statistic} of {config.repeats})"
    )
    rows = [
        ("padded (mask_pad)", f"{measured['padded']:.0f}", "1.00"),
        ("packed (reset)", f"{measured['packed']:.0f}", f"{measured['packed'] / measured['padded']:.2f}"),
    ]
    columns = (("layout", "<28"), ("tokens/s", ">10"), ("ratio to padded", ">20"))
    return "\n".join([title, *fixed_width_lines(columns, rows)])


def format_table(config: DocumentsBenchConfig, times: dict[str, float]) -> str:
    base = times[CASES[0]]
    rows = [(name, f"{times[name]:.3f}", f"{times[name] / base:.3f}") for name in times]
    title = (
        f"recurrence op, forward+backward, float32, L={config.length} B={config.batch} D={config.hidden}, "
        f"{config.threads} threads ({config.statistic} of {config.repeats})"
    )
    columns = (("reset", "<28"), ("ms", ">10"), ("ratio to no flags", ">20"))
    return "\n".join([title, *fixed_width_lines(columns, rows)])
