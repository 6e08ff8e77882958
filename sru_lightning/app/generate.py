"""`python -m sru_lightning generate key=value ...`: write text with a trained language model.

The model and its vocabulary are rebuilt from the checkpoint alone (its hyperparameters and
the data module's saved vocabulary). The prompt is read once; every further token costs
one recurrent step from the carried state. Text streams to stdout, speed goes to stderr.
"""

from __future__ import annotations

import os
import sys
import time
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import torch

from sru_lightning.app.key_value import wants_help
from sru_lightning.app.usage import UsageError, command_prog, print_error

PROG = command_prog("generate")


@dataclass
class GenerateSettings:
    """The command's settings (`key=value` on the command line)."""

    ckpt_path: str = "last"  # a .ckpt file, a run directory, or "last" (newest run under resume_dir)
    prompt: str = "The "  # text the output continues; read once, echoed first
    length: int = 200  # tokens to generate after the prompt (characters, bytes or words)
    temperature: float = 0.8  # > 0 scales the logits before sampling; 0 picks the likeliest token (greedy)
    top_k: int = 0  # sample among the k likeliest tokens; 0 = all
    seed: int = 0  # the same seed, checkpoint and settings give the same text
    resume_dir: str = "outputs"  # where ckpt_path=last looks
    device: str = "cpu"  # "cpu" or "cuda"
    model: str = ""  # an export folder (`python -m sru_lightning export`) to generate with instead of ckpt_path
    backend: str = ""  # for `model`: onnxruntime (format=onnx) or pt2 (format=pt2/aoti); empty = from the folder


# --------------------------------------------------------------------------------------------
# settings
def usage() -> str:
    from sru_lightning.app.key_value import command_usage

    notes = [
        "temperature=0 is greedy decoding (always the likeliest token). Text goes to stdout,",
        "tokens per second to stderr.",
    ]
    example = f"{PROG} ckpt_path=outputs/<date>/<time> prompt='The ' length=200 temperature=0.8 top_k=0 seed=0"
    return command_usage(PROG, "Write text with a trained checkpoint.", GenerateSettings, notes, [example])


def parse_settings(argv: Sequence[str]) -> GenerateSettings:
    """`key=value` arguments -> validated settings; a problem raises UsageError naming the key.

    OmegaConf checks and converts the types against `GenerateSettings`; `prompt` is taken
    verbatim (YAML parsing would strip its spaces or turn `yes` into true).
    """
    from sru_lightning.app.key_value import check_device, parse_key_values

    settings, raw = parse_key_values(argv, GenerateSettings, UsageError)
    if settings.model and "ckpt_path" in raw:  # the default ckpt_path=last is no choice of the user's
        raise UsageError(
            f"`model` ({settings.model!r}, an export folder) and `ckpt_path` ({raw['ckpt_path']!r}) "
            "both name the model to generate with; give only one of them"
        )
    if settings.length < 1:
        raise UsageError(f"`length` must be a positive integer (tokens to generate), got {settings.length}")
    if not settings.temperature >= 0 or settings.temperature == float("inf"):
        raise UsageError(f"`temperature` must be a finite number >= 0 (0 = greedy), got {raw.get('temperature')}")
    if settings.top_k < 0:
        raise UsageError(f"`top_k` must be an integer >= 0 (0 = no limit), got {settings.top_k}")
    check_device(settings.device, UsageError)
    if settings.prompt == "":
        raise UsageError("`prompt` must hold at least one token, got ''")
    return settings


# --------------------------------------------------------------------------------------------
# checkpoint -> model and vocabulary
def load_trained(setting: str, resume_dir: str, command: str = "generate"):
    """(path, checkpoint, model, codec) of the trained run `ckpt_path` names, the model in eval
    mode; a problem, including a vocabulary that does not match the model, raises UsageError."""
    path, checkpoint = load_checkpoint(setting, resume_dir, command)
    model = build_model(checkpoint, path)
    codec = load_codec(checkpoint, path)
    if codec.vocab_size != model.net.vocab_size:
        raise UsageError(
            f"the vocabulary of {str(path)!r} has {codec.vocab_size} tokens but the model "
            f"{model.net.vocab_size}; the checkpoint does not match its run's data config"
        )
    return path, checkpoint, model, codec


def load_checkpoint(setting: str, resume_dir: str, command: str = "generate") -> tuple[Path, dict[str, Any]]:
    """The checkpoint `ckpt_path` names (see `model_checkpoint`) and its contents; a problem
    raises UsageError in one line."""
    from sru_lightning.app.runs.checkpoints import CheckpointError
    from sru_lightning.app.runs.ckpt_path import read_trained_checkpoint

    try:
        return read_trained_checkpoint(setting, resume_dir, command)
    except CheckpointError as error:
        raise UsageError(str(error).splitlines()[0]) from None


def build_model(checkpoint: Mapping[str, Any], path: Path):
    """The language model the checkpoint was saved from, with its weights, in eval mode."""
    from sru_lightning.models import SRULanguageModel

    hyper_parameters = dict(checkpoint["hyper_parameters"])
    try:
        with warnings.catch_warnings():
            # The run already warned about its own configuration; sampling changes nothing.
            warnings.simplefilter("ignore", FutureWarning)
            model = SRULanguageModel(**hyper_parameters)
        model.load_state_dict(checkpoint["state_dict"])
    except (TypeError, ValueError, RuntimeError) as error:
        raise UsageError(f"cannot rebuild the model of {str(path)!r}: {str(error).splitlines()[0]}") from None
    return model.eval()


def load_codec(checkpoint: Mapping[str, Any], path: Path):
    """The vocabulary the data module saved with the checkpoint."""
    from sru_lightning.data import TokenCodec

    for entry in checkpoint.values():  # Lightning files the data module's state under its class name
        if isinstance(entry, Mapping) and isinstance(entry.get("token_codec"), Mapping):
            try:
                return TokenCodec.from_state_dict(entry["token_codec"])
            except (ValueError, TypeError, KeyError, ImportError) as error:
                reason = str(error).splitlines()[0] if str(error) else type(error).__name__
                where = f"the checkpoint {str(path)!r}"
                raise UsageError(f"the vocabulary saved in {where} cannot be read: {reason}") from None
    raise UsageError(
        f"the checkpoint {str(path)!r} holds no vocabulary (its data module saved none): generate with a "
        "checkpoint of a run of sru_lightning's data modules"
    )


# --------------------------------------------------------------------------------------------
# decoding
def sample(logits: torch.Tensor, temperature: float, top_k: int, generator: torch.Generator) -> torch.Tensor:
    """Next token ids (B,) from logits (B, vocab): greedy at temperature 0, else sampled from
    softmax(logits / temperature) restricted to the `top_k` likeliest tokens (0 = all)."""
    if temperature == 0:
        return logits.argmax(dim=-1)
    logits = logits.float() / temperature
    if 0 < top_k < logits.size(-1):
        values, indices = logits.topk(top_k, dim=-1)
        choice = torch.multinomial(torch.softmax(values, dim=-1), 1, generator=generator)
        return indices.gather(-1, choice).squeeze(-1)
    return torch.multinomial(torch.softmax(logits, dim=-1), 1, generator=generator).squeeze(-1)


def sample_rows(
    logits: torch.Tensor, temperatures: list[float], top_ks: list[int], generators: list[torch.Generator | None]
) -> torch.Tensor:
    """Next token ids (B,) of B independent requests: row r is exactly
    ``sample(logits[r:r+1], temperatures[r], top_ks[r], generators[r])``, with the work that does
    not depend on a row's generator done once for the batch (the greedy rows' argmax, the
    softmax of the rows sampled from the whole vocabulary)."""
    rows = range(logits.size(0))
    tokens = torch.empty(logits.size(0), dtype=torch.long, device=logits.device)
    greedy = [row for row in rows if temperatures[row] == 0]
    if greedy:
        tokens[greedy] = logits[greedy].argmax(dim=-1)
    whole = [row for row in rows if temperatures[row] != 0 and not 0 < top_ks[row] < logits.size(-1)]
    if whole:
        scale = torch.tensor([temperatures[row] for row in whole], dtype=torch.float32, device=logits.device)
        probabilities = torch.softmax(logits[whole].float() / scale[:, None], dim=-1)
        for index, row in enumerate(whole):
            tokens[row] = torch.multinomial(probabilities[index : index + 1], 1, generator=generators[row])[0, 0]
    for row in rows:
        if temperatures[row] != 0 and 0 < top_ks[row] < logits.size(-1):
            tokens[row] = sample(logits[row : row + 1], temperatures[row], top_ks[row], generators[row])[0]
    return tokens


@dataclass
class GenerationStats:
    prompt_tokens: int
    tokens: int
    seconds: float  # the decoding loop after the prompt pass: sampling, steps, writing

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else float("inf")


def generate_text(model, codec, settings: GenerateSettings, out: TextIO) -> GenerationStats:
    """Write the prompt, then `settings.length` generated tokens, to `out` (flushed per token).

    The prompt is read in one pass; each further token costs one `step` of the network from the
    carried recurrent state. The random draws come from a generator seeded with `settings.seed`.
    """
    try:
        prompt_ids = codec.encode(settings.prompt)
    except ValueError as error:
        raise UsageError(f"`prompt` cannot be read by this model: {error}") from None
    if not prompt_ids:
        raise UsageError(f"`prompt` must hold at least one token, got {settings.prompt!r}")
    # A language model's network, a network, or an exported model: each steps and has a device.
    network = getattr(model, "net", model)
    device = model.device if hasattr(model, "device") else next(network.parameters()).device
    generator = torch.Generator(device=device).manual_seed(settings.seed)
    write = codec.decoder(after=settings.prompt)
    out.write(settings.prompt)
    out.flush()
    length, temperature, top_k = settings.length, settings.temperature, settings.top_k
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


# --------------------------------------------------------------------------------------------
# entry point
def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if wants_help(argv):
        print(usage())
        return 0
    try:
        settings = parse_settings(argv)
        if settings.model:
            model, codec = _exported_model(settings)
            stats = generate_text(model, codec, settings, sys.stdout)
            _report(stats)
            return 0
        path, checkpoint, model, codec = load_trained(settings.ckpt_path, settings.resume_dir)
        model = model.to(settings.device)
        print(f"{PROG}: {path} (step {checkpoint.get('global_step', '?')}, {codec.level} level)", file=sys.stderr)
        stats = generate_text(model, codec, settings, sys.stdout)
    except UsageError as error:
        print_error(str(error), PROG)
        return 2
    except BrokenPipeError:  # e.g. `| head`: the reader has seen enough
        # Point stdout at /dev/null so the interpreter's final flush does not complain again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except KeyboardInterrupt:
        print(f"\n{PROG}: interrupted", file=sys.stderr)
        return 130
    _report(stats)
    return 0


def _report(stats: GenerationStats) -> None:
    print(file=sys.stdout, flush=True)
    print(
        f"{PROG}: {stats.tokens} tokens in {stats.seconds:.3f} s ({stats.tokens_per_second:.0f} tokens/s; "
        f"prompt of {stats.prompt_tokens} tokens read in one pass)",
        file=sys.stderr,
    )


def _exported_model(settings: GenerateSettings):
    """The export folder `settings.model` run by `settings.backend`, and its vocabulary."""
    from sru_lightning.export import ExportError
    from sru_lightning.export.generate_backend import load_for_generation

    if settings.device != "cpu":
        raise UsageError(f"`device` must be 'cpu' with `model` (an export folder), got {settings.device!r}")
    try:
        model, codec, description = load_for_generation(settings.model, settings.backend, torch.get_num_threads())
    except ExportError as error:
        raise UsageError(str(error)) from None
    print(f"{PROG}: {description}", file=sys.stderr)
    return model, codec
