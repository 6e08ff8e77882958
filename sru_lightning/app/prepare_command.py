"""`python -m sru_lightning prepare data=<option> [data.key=value ...] out=<folder>`: read a corpus
once, tokenize it with every core and write token shards and their index, which `fit
data=shards data.path=<folder>` (and validate, test, generate) reads by memory map
(:mod:`sru_lightning.data.prepare`)."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass

from sru_lightning.app.key_value import wants_help
from sru_lightning.app.usage import UsageError, command_prog, print_error

PROG = command_prog("prepare")
#: Overrides composed by Hydra, as `fit` composes them: the data group and experiments.
HYDRA_PREFIXES = ("data=", "data.", "+data.", "++data.", "experiment=")


@dataclass
class PrepareSettings:
    """The command's own settings (`key=value`); the data settings are Hydra's."""

    out: str = ""  # the folder to write (required)
    overwrite: bool = False  # replace a corpus prepared in `out` before (one holding only its own files)
    workers: int = 0  # processes that encode; 0: every core
    shard_mb: float = 256  # size of a token shard
    bpe_sample_mb: int = 200  # with data.tokenizer=bpe: the first MB of the training split it learns from
    progress: bool = True  # progress bars on stderr (when it is a terminal)


def usage() -> str:
    from sru_lightning.app.key_value import command_usage

    notes = [
        "Data settings are those of `fit` (data=pydoc|stdlib|text|documents|enwik8, data.path=...,",
        "data.level=word, data.tokenizer=bpe data.vocab_size=N, experiment=enwik8 ...). The text is read",
        "in pieces, never whole; the shards hold the ids the in-memory data module would compute, so",
        "`fit data=shards data.path=<out>` trains on the same batches. The folder is written beside",
        "`out` under a hidden name and renamed when complete; docs/corpus.md describes its index.",
    ]
    examples = [
        f"{PROG} data=text data.path=corpus.txt out=corpus-shards",
        f"{PROG} data=text data.path=corpus.txt data.tokenizer=bpe data.vocab_size=8000 out=corpus-bpe",
        f"{PROG} experiment=enwik8 data.path=/data/enwik8 out=enwik8-shards",
        "python -m sru_lightning fit data=shards data.path=corpus-shards",
    ]
    return command_usage(PROG, "Prepare a corpus once into token shards.", PrepareSettings, notes, examples)


def split_arguments(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    """(Hydra overrides of the data, the command's own key=value settings)."""
    overrides, own = [], []
    for argument in argv:
        (overrides if argument.startswith(HYDRA_PREFIXES) else own).append(argument)
    return overrides, own


def compose_data(overrides: list[str]):
    """The `data` config `fit` would compose from `overrides`; Hydra's refusal as a UsageError."""
    from hydra import compose, initialize_config_dir

    from sru_lightning._resources import conf_dir
    from sru_lightning.app.hydra_errors import configuration_error, unparsable_override

    problem = unparsable_override(overrides)
    if problem:
        raise UsageError(problem)
    try:
        with initialize_config_dir(config_dir=str(conf_dir()), version_base="1.3"):
            cfg = compose("config", overrides=overrides)
    except Exception as error:
        message = configuration_error(error)
        if message is None:
            raise
        raise UsageError(message) from None
    return cfg.data


def parse_settings(argv: Sequence[str]) -> tuple[PrepareSettings, object]:
    """(the command's settings, the composed data config); a problem raises UsageError."""
    from sru_lightning.app.key_value import parse_key_values

    overrides, own = split_arguments(argv)
    settings, _ = parse_key_values(own, PrepareSettings, UsageError)
    if not settings.out:
        raise UsageError("`out` is required: the folder to write, e.g. out=corpus-shards")
    for key, least in (("workers", 0), ("shard_mb", 1e-3), ("bpe_sample_mb", 1)):
        if getattr(settings, key) < least:
            raise UsageError(f"`{key}` must be at least {least:g}, got {getattr(settings, key)}")
    data_config = compose_data(overrides)
    if str(data_config.get("_target_", "")).endswith("ShardDataModule"):
        raise UsageError(
            "prepare reads a corpus (data=pydoc, stdlib, text, documents or enwik8), got data=shards, which is "
            "prepared already"
        )
    return settings, data_config


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if wants_help(argv):
        print(usage())
        return 0
    settings = PrepareSettings()
    try:
        settings, data_config = parse_settings(argv)
        prepared = _prepare(data_config, settings, split_arguments(argv)[0])
    except UsageError as error:
        print_error(str(error), PROG)
        return 2
    except KeyboardInterrupt:
        print_error(
            f"interrupted (Ctrl+C): nothing was written to {settings.out!r} (the incomplete folder beside it was "
            "removed); run the same command again",
            PROG,
        )
        return 130
    _report(prepared)
    print(prepared.folder)
    return 0


def _prepare(data_config, settings: PrepareSettings, overrides: list[str]):
    from omegaconf import OmegaConf

    from sru_lightning.app.runs.refusals import instantiate_setting
    from sru_lightning.data.prepare import PrepareOptions, prepare_corpus
    from sru_lightning.data.sources import reading_of

    datamodule = instantiate_setting(data_config)
    options = PrepareOptions(settings.workers, settings.shard_mb, settings.bpe_sample_mb, settings.progress)
    source = {"data": OmegaConf.to_container(data_config, resolve=True), "overrides": overrides}
    try:
        reading = reading_of(datamodule)
        return prepare_corpus(
            reading,
            datamodule.token_level,
            settings.out,
            bpe_vocab_size=getattr(datamodule, "bpe_vocab_size", None),
            overwrite=settings.overwrite,
            options=options,
            source=source,
        )
    except OSError as error:
        where = f" {error.filename}" if error.filename else ""
        raise UsageError(
            f"cannot write{where}: {error.strerror or error}; nothing was left in {settings.out!r}'s place (the "
            "incomplete folder beside it was removed): free space or fix the folder, then run the same command again"
        ) from None
    except ValueError as error:
        raise UsageError(str(error)) from None


def _report(prepared) -> None:
    index = prepared.index
    splits = " / ".join(f"{name} {split['tokens']:,}" for name, split in index["splits"].items())
    shard_count = sum(len(split["shards"]) for split in index["splits"].values())
    rate = prepared.read_units / max(prepared.seconds, 1e-9) / 1e6
    unit = "MB" if index["token_level"] == "byte" else "M chars"
    print(
        f"{PROG}: {prepared.read_units / 1e6:.1f} {unit} -> {prepared.folder} ({index['token_level']} level, "
        f"{index['vocab_size']} tokens as {index['dtype']}; tokens {splits}; {shard_count} shard(s)) in "
        f"{prepared.seconds:.1f} s ({rate:.1f} {unit}/s)",
        file=sys.stderr,
    )
