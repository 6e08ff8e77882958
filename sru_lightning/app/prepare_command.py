"""`python -m sru_lightning prepare data=<option> [data.key=value ...] out=<folder>`: read a corpus
once, tokenize it with every core and write token shards and their index, which `fit
data=shards data.path=<folder>` (and validate, test, generate) reads by memory map
(:mod:`sru_lightning.data.prepare`)."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass

from sru_lightning.app.key_value import setting, wants_help
from sru_lightning.app.usage import UsageError, command_prog, print_error

PROG = command_prog("prepare")
#: Overrides composed by Hydra, as `fit` composes them: the data group and experiments.
HYDRA_PREFIXES = ("data=", "data.", "+data.", "++data.", "experiment=")
FORMATS = ("shards", "litdata")


@dataclass
class PrepareSettings:
    """The command's own settings (`key=value`); the data settings are Hydra's."""

    out: str = setting("", "the folder to write (required)")
    format: str = setting("shards", "shards (read by memory map: data=shards) or litdata (LitData's: data=litdata)")
    overwrite: bool = setting(False, "replace a corpus prepared in `out` before (one holding only its own files)")
    workers: int = setting(0, "processes that split words or encode BPE pieces; 0: every core")
    shard_mb: float = setting(256.0, "size of a token shard")
    bpe_sample_mb: int = setting(8, "with data.tokenizer=bpe: the first MB of the training split it learns from")
    progress: bool = setting(True, "progress bars on stderr (when it is a terminal)")
    chunk_tokens: int = setting(1 << 24, "with format=litdata: tokens per LitData chunk (data.seq_len must divide it)")


def usage() -> str:
    from sru_lightning.app.key_value import command_usage

    notes = [
        "Data settings are those of `fit` (data=pydoc|stdlib|text|documents|enwik8, data.path=...,",
        "data.level=word, data.tokenizer=bpe data.vocab_size=N, experiment=enwik8 ...). The text is read",
        "in pieces, never whole; the shards hold the ids the in-memory data module would compute, so",
        "`fit data=shards data.path=<out>` trains on the same batches. The folder is written beside",
        "`out` under a hidden name and renamed when complete; docs/corpus.md describes its index.",
        "format=litdata writes LitData's format instead (the `data` extra), which `fit data=litdata",
        "data.path=<out or s3://...>` streams on any number of machines.",
    ]
    examples = [
        f"{PROG} data=text data.path=corpus.txt out=corpus-shards",
        f"{PROG} data=text data.path=corpus.txt data.tokenizer=bpe data.vocab_size=8000 out=corpus-bpe",
        f"{PROG} experiment=enwik8 data.path=/data/enwik8 out=enwik8-shards",
        "python -m sru_lightning fit data=shards data.path=corpus-shards",
        f"{PROG} data=text data.path=corpus.txt out=corpus-litdata format=litdata",
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
    if settings.format not in FORMATS:
        raise UsageError(f"`format` must be one of {', '.join(FORMATS)}, got {settings.format!r}")
    if settings.format == "litdata":
        from sru_lightning.data.litdata_format import require_litdata

        try:
            require_litdata("format=litdata")
        except ValueError as error:
            raise UsageError(str(error)) from None
    for key, least in (("workers", 0), ("shard_mb", 1e-3), ("bpe_sample_mb", 1), ("chunk_tokens", 1)):
        if getattr(settings, key) < least:
            raise UsageError(f"`{key}` must be at least {least:g}, got {getattr(settings, key)}")
    data_config = compose_data(overrides)
    target = str(data_config.get("_target_", ""))
    if target.endswith(("ShardDataModule", "LitDataModule")):
        given = "shards" if target.endswith("ShardDataModule") else "litdata"
        raise UsageError(
            f"prepare reads a corpus (data=pydoc, stdlib, text, documents or enwik8), got data={given}, which is "
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

    def prepare_into(out, overwrite: bool):
        return prepare_corpus(
            reading_of(datamodule),
            datamodule.token_level,
            out,
            bpe_vocab_size=getattr(datamodule, "bpe_vocab_size", None),
            overwrite=overwrite,
            options=options,
            source=source,
        )

    try:
        if settings.format == "litdata":
            return _prepare_litdata(prepare_into, settings)
        return prepare_into(settings.out, settings.overwrite)
    except OSError as error:
        where = f" {error.filename}" if error.filename else ""
        raise UsageError(
            f"cannot write{where}: {error.strerror or error}; nothing was left in {settings.out!r}'s place (the "
            "incomplete folder beside it was removed): free space or fix the folder, then run the same command again"
        ) from None
    except ValueError as error:
        raise UsageError(str(error)) from None


def _prepare_litdata(prepare_into, settings: PrepareSettings):
    """Shards first (beside `out`, hidden, removed after), then LitData's format from them."""
    import shutil
    import tempfile
    import time
    from pathlib import Path

    from sru_lightning.data.litdata_format import check_out, write_litdata
    from sru_lightning.data.prepare import Prepared
    from sru_lightning.data.shards import PreparedCorpus

    started = time.perf_counter()
    out = Path(settings.out).expanduser().absolute()
    check_out(out, settings.overwrite)  # before the work, not after it
    out.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=f".{out.name}.shards-", dir=out.parent))
    try:
        prepared = prepare_into(scratch / "shards", False)
        index = write_litdata(
            PreparedCorpus(prepared.folder), out, chunk_tokens=settings.chunk_tokens, overwrite=settings.overwrite
        )
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return Prepared(out, index, prepared.read_units, time.perf_counter() - started, prepared.extra)


def _report(prepared) -> None:
    index = prepared.index
    splits = " / ".join(f"{name} {split['tokens']:,}" for name, split in index["splits"].items())
    if "chunk_tokens" in index:  # format=litdata
        written = f"LitData format, chunks of {index['chunk_tokens']:,} tokens"
    else:
        written = f"{sum(len(split['shards']) for split in index['splits'].values())} shard(s)"
    rate = prepared.read_units / max(prepared.seconds, 1e-9) / 1e6
    unit = "MB" if index["token_level"] == "byte" else "M chars"
    print(
        f"{PROG}: {prepared.read_units / 1e6:.1f} {unit} -> {prepared.folder} ({index['token_level']} level, "
        f"{index['vocab_size']} tokens as {index['dtype']}; tokens {splits}; {written}) in "
        f"{prepared.seconds:.1f} s ({rate:.1f} {unit}/s)",
        file=sys.stderr,
    )
