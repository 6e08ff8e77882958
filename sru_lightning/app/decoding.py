"""Decoding: the next token from a model's logits (:func:`sample`, and :func:`sample_rows` for a
batch of independent requests), and the text loop that writes a prompt's continuation
(:func:`generate_text`).

Below the commands that decode (``generate``) and the server (``serving/scheduler.py``), and
used by the decode benchmark, so that the same seed and settings draw the same tokens in each.
The prompt is read once; every further token costs one recurrent step from the carried state.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TextIO

import torch

from sru_lightning.app.usage import UsageError

__all__ = ["GenerationStats", "generate_text", "sample", "sample_rows"]


def sample(
    logits: torch.Tensor, temperature: float, top_k: int, generator: torch.Generator, top_p: float = 1.0
) -> torch.Tensor:
    """Next token ids (B,) from logits (B, vocab): greedy at temperature 0, else sampled from
    softmax(logits / temperature) restricted to the `top_k` likeliest tokens (0 = all) and then
    to the smallest set of likeliest tokens whose probability reaches `top_p` (1 = all; nucleus
    sampling)."""
    if temperature == 0:
        return logits.argmax(dim=-1)
    logits = logits.float() / temperature
    if top_p < 1.0:
        return _sample_nucleus(logits, top_k, top_p, generator)
    if 0 < top_k < logits.size(-1):
        values, indices = logits.topk(top_k, dim=-1)
        choice = torch.multinomial(torch.softmax(values, dim=-1), 1, generator=generator)
        return indices.gather(-1, choice).squeeze(-1)
    return torch.multinomial(torch.softmax(logits, dim=-1), 1, generator=generator).squeeze(-1)


def _sample_nucleus(logits: torch.Tensor, top_k: int, top_p: float, generator: torch.Generator) -> torch.Tensor:
    """A draw among the likeliest tokens (at most `top_k`, 0 = all) whose probabilities, taken in
    order, first reach `top_p`: a token is kept when the tokens likelier than it hold less than
    `top_p` (so the likeliest is always kept)."""
    kept = top_k if 0 < top_k < logits.size(-1) else logits.size(-1)
    values, indices = logits.topk(kept, dim=-1)  # sorted, likeliest first
    probabilities = torch.softmax(values, dim=-1)
    before = probabilities.cumsum(dim=-1) - probabilities
    probabilities = probabilities.masked_fill(before >= top_p, 0.0)
    choice = torch.multinomial(probabilities, 1, generator=generator)
    return indices.gather(-1, choice).squeeze(-1)


def sample_rows(
    logits: torch.Tensor,
    temperatures: list[float],
    top_ks: list[int],
    generators: list[torch.Generator | None],
    top_ps: list[float] | None = None,
) -> torch.Tensor:
    """Next token ids (B,) of B independent requests: row r is exactly
    ``sample(logits[r:r+1], temperatures[r], top_ks[r], generators[r], top_ps[r])``, with the work
    that does not depend on a row's generator done once for the batch (the greedy rows' argmax, the
    softmax of the rows sampled from the whole vocabulary)."""
    rows = range(logits.size(0))
    top_ps = top_ps if top_ps is not None else [1.0] * logits.size(0)
    tokens = torch.empty(logits.size(0), dtype=torch.long, device=logits.device)
    greedy = [row for row in rows if temperatures[row] == 0]
    if greedy:
        tokens[greedy] = logits[greedy].argmax(dim=-1)
    sampled = [row for row in rows if temperatures[row] != 0]
    whole = [row for row in sampled if not 0 < top_ks[row] < logits.size(-1) and top_ps[row] >= 1.0]
    if whole:
        scale = torch.tensor([temperatures[row] for row in whole], dtype=torch.float32, device=logits.device)
        probabilities = torch.softmax(logits[whole].float() / scale[:, None], dim=-1)
        for index, row in enumerate(whole):
            tokens[row] = torch.multinomial(probabilities[index : index + 1], 1, generator=generators[row])[0, 0]
    for row in sorted(set(sampled) - set(whole)):
        tokens[row] = sample(logits[row : row + 1], temperatures[row], top_ks[row], generators[row], top_ps[row])[0]
    return tokens


@dataclass
class GenerationStats:
    prompt_tokens: int
    tokens: int
    seconds: float  # the decoding loop after the prompt pass: sampling, steps, writing

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else float("inf")


def generate_text(
    model, codec, out: TextIO, *, prompt: str, length: int, temperature: float, top_k: int = 0, seed: int = 0
) -> GenerationStats:
    """Write `prompt`, then `length` generated tokens, to `out` (flushed per token).

    `model` is a language model, its network or an exported model: anything with ``step`` (and a
    device). The prompt is read in one pass; each further token costs one `step` of the network
    from the carried recurrent state. The random draws come from a generator seeded with `seed`.
    A prompt the codec cannot read raises UsageError naming `prompt`.
    """
    try:
        prompt_ids = codec.encode(prompt)
    except ValueError as error:
        raise UsageError(f"`prompt` cannot be read by this model: {error}") from None
    if not prompt_ids:
        raise UsageError(f"`prompt` must hold at least one token, got {prompt!r}")
    network = getattr(model, "net", model)
    device = model.device if hasattr(model, "device") else next(network.parameters()).device
    generator = torch.Generator(device=device).manual_seed(seed)
    write = codec.decoder(after=prompt)
    out.write(prompt)
    out.flush()
    with torch.inference_mode():
        logits, state = network.step(torch.tensor([prompt_ids], device=device))
        started = time.perf_counter()
        for index in range(length):
            token = sample(logits, temperature, top_k, generator)
            out.write(write(int(token)))
            out.flush()
            if index + 1 < length:
                logits, state = network.step(token, state)
    out.write(write.flush())
    return GenerationStats(len(prompt_ids), length, time.perf_counter() - started)
