"""`python -m sru_lightning generate key=value ...`: write text with a trained language model.

The command alone: its settings, and the choice of model. The model and its vocabulary are
rebuilt from the checkpoint (:mod:`sru_lightning.app.runs.trained_model`) or read from an export
folder; the text is written by :func:`sru_lightning.app.decoding.generate_text` (the prompt read
once, every further token one recurrent step). Text streams to stdout, speed goes to stderr.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from sru_lightning.app.decoding import GenerationStats, generate_text
from sru_lightning.app.key_value import setting, wants_help
from sru_lightning.app.runs.trained_model import load_trained
from sru_lightning.app.usage import UsageError, command_prog, print_error

PROG = command_prog("generate")


@dataclass
class GenerateSettings:
    """The command's settings (`key=value` on the command line)."""

    ckpt_path: str = setting("last", 'a .ckpt file, a run directory, or "last" (newest run under resume_dir)')
    prompt: str = setting("The ", "text the output continues; read once, echoed first")
    length: int = setting(200, "tokens to generate after the prompt (characters, bytes or words)")
    temperature: float = setting(0.8, "> 0 scales the logits before sampling; 0 picks the likeliest token (greedy)")
    top_k: int = setting(0, "sample among the k likeliest tokens; 0 = all")
    seed: int = setting(0, "the same seed, checkpoint and settings give the same text")
    resume_dir: str = setting("outputs", "where ckpt_path=last looks")
    device: str = setting("cpu", "cpu or cuda")
    model: str = setting(
        "", "an export folder (`python -m sru_lightning export`) to generate with instead of ckpt_path"
    )
    backend: str = setting(
        "", "for `model`: onnxruntime (format=onnx) or pt2 (format=pt2/aoti); empty = from the folder"
    )


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
        else:
            path, checkpoint, model, codec = load_trained(settings.ckpt_path, settings.resume_dir)
            model = model.to(settings.device)
            step = checkpoint.get("global_step", "?")
            print(f"{PROG}: {path} (step {step}, {codec.level} level)", file=sys.stderr)
        stats = generate_text(
            model,
            codec,
            sys.stdout,
            prompt=settings.prompt,
            length=settings.length,
            temperature=settings.temperature,
            top_k=settings.top_k,
            seed=settings.seed,
        )
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
