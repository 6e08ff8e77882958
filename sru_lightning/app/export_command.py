"""`python -m sru_lightning export ckpt_path=... format=onnx|pt2|aoti|hf out=<dir>`: export a
trained language model's checkpoint for deployment (see :mod:`sru_lightning.export`)."""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass

from sru_lightning.app.key_value import setting, wants_help
from sru_lightning.app.usage import UsageError, command_prog, print_error

PROG = command_prog("export")


@dataclass
class ExportSettings:
    """The command's settings (`key=value` on the command line)."""

    ckpt_path: str = setting("last", 'a .ckpt file, a run directory, or "last" (newest run under resume_dir)')
    format: str = setting("onnx", "onnx | pt2 | aoti | hf")
    out: str = setting("", "the folder to create (required)")
    overwrite: bool = setting(False, "replace an earlier export in `out` (one that holds nothing but its own files)")
    resume_dir: str = setting("outputs", "where ckpt_path=last looks")


def usage() -> str:
    from sru_lightning.app.key_value import command_usage

    notes = [
        "format=onnx runs with onnxruntime alone; pt2 (torch.export) and aoti (AOTInductor, compiled)",
        "need torch and sru_lightning. The folder holds the model, vocabulary.json and manifest.json,",
        "which lists them; overwrite=true refuses a folder holding anything else. format=hf writes the",
        "network's weights in the Hugging Face layout (config.json, model.safetensors, tokenizer.json),",
        "read by sru_lightning.from_pretrained(<dir>) and shared with huggingface_hub.upload_folder.",
    ]
    examples = [
        f"{PROG} ckpt_path=outputs/<date>/<time> format=onnx out=exports/sru-onnx",
        "python -m sru_lightning generate model=exports/sru-onnx prompt='The ' temperature=0",
    ]
    return command_usage(PROG, "Export a trained checkpoint for deployment.", ExportSettings, notes, examples)


def parse_settings(argv: Sequence[str]) -> ExportSettings:
    from sru_lightning.app.key_value import parse_key_values
    from sru_lightning.export.graph_module import ExportError
    from sru_lightning.export.package import check_format

    settings, _ = parse_key_values(argv, ExportSettings, UsageError)
    try:
        check_format(settings.format)
    except ExportError as error:
        raise UsageError(str(error)) from None
    if not settings.out:
        raise UsageError("`out` is required: the folder to create, e.g. out=exports/sru-onnx")
    return settings


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if wants_help(argv):
        print(usage())
        return 0
    from sru_lightning.app.runs.trained_model import load_trained
    from sru_lightning.export.graph_module import ExportError

    try:
        settings = parse_settings(argv)
        path, checkpoint, model, codec = load_trained(settings.ckpt_path, settings.resume_dir, "export")
        from sru_lightning.export.exporter import export_language_model

        started = time.perf_counter()
        source = {"checkpoint": str(path), "global_step": checkpoint.get("global_step")}
        folder = export_language_model(
            model, settings.out, settings.format, codec, overwrite=settings.overwrite, source=source
        )
    except (UsageError, ExportError) as error:
        print_error(str(error), PROG)
        return 2
    seconds = time.perf_counter() - started
    print(
        f"{PROG}: {model.net.rnn_type} model of {path} (step {checkpoint.get('global_step', '?')}) -> "
        f"{folder} (format={settings.format}, {seconds:.1f} s)",
        file=sys.stderr,
    )
    print(folder)
    return 0
