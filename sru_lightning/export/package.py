"""Export folders: write one (model file, vocabulary, manifest) so that a failure never leaves a
folder that looks complete, replace one only when every file in it is the export's own, and read
one back after checking that it is one this package can run.

Layout of ``<out>/``::

    manifest.json     what the folder holds (see :func:`manifest`), named by `format_name`, with
                      `owned_files`: every file of the export, itself included
    model.onnx        format=onnx: standard ONNX, runs with onnxruntime alone
    model.pt2         format=pt2: a torch.export program; format=aoti: an AOTInductor package
    vocabulary.json   the token codec (level and token list, or at bpe level the tokenizer's
                      JSON under `tokenizer`) that reads prompts and writes text
    config.json, model.safetensors, tokenizer.json, tokenizer_config.json
                      format=hf: the network's arguments, weights and tokenizer in the Hugging
                      Face layout (:mod:`sru_lightning.export.pretrained`)

Nothing else belongs in the folder: overwrite=true refuses a folder that holds anything its
manifest does not own, since replacing the folder would delete it.
"""

from __future__ import annotations

import importlib
import json
import os
import tempfile
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from sru_lightning._atomic import discard, put_in_place
from sru_lightning.nn import pretrained as pretrained_folder

from .graph_module import BATCH, LENGTH, ExportError

#: Bumped when the folder layout, the manifest or the graph's signature changes incompatibly.
EXPORT_FORMAT_VERSION = 1
#: The manifest's `format_name`: what tells our manifest.json from any other file of that name.
FORMAT_NAME = "sru_lightning-export"
FORMATS = ("onnx", "pt2", "aoti", "hf")
MANIFEST_NAME = "manifest.json"
VOCABULARY_NAME = "vocabulary.json"
MODEL_FILES = {"onnx": "model.onnx", "pt2": "model.pt2", "aoti": "model.pt2", "hf": pretrained_folder.WEIGHTS_FILE}
#: The files of format=hf besides its weights (see :mod:`sru_lightning.export.pretrained`).
PRETRAINED_FILES = {
    "config": pretrained_folder.CONFIG_FILE,
    "tokenizer": "tokenizer.json",
    "tokenizer_config": "tokenizer_config.json",
}
#: Every name an export folder can own; a manifest claiming another is not one we wrote.
EXPORT_FILE_NAMES = frozenset({MANIFEST_NAME, VOCABULARY_NAME, *MODEL_FILES.values(), *PRETRAINED_FILES.values()})


def check_format(fmt: str) -> str:
    if fmt not in FORMATS:
        raise ExportError(f"`format` must be one of {', '.join(FORMATS)}, got {fmt!r}")
    return fmt


def owned_files(files: Mapping[str, str]) -> list[str]:
    """The manifest's `owned_files` for the `files` it maps (model, vocabulary): those and itself."""
    return sorted({MANIFEST_NAME, *files.values()})


_JSON_KINDS = {
    dict: "an object",
    list: "a list",
    str: "a string",
    int: "a number",
    float: "a number",
    bool: "true or false",
    type(None): "null",
}
_MISSING = object()  # a field a file does not have (None is JSON's null)


def _shown(value: Any) -> str:
    """A value from a file for a one-line message: missing, or its repr cut short."""
    if value is _MISSING or value is None:
        return "missing" if value is _MISSING else "null"
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def write_atomically(out: Path, fill: Callable[[Path], None], overwrite: bool = False) -> Path:
    """Create the folder `out` by calling ``fill(folder)`` on a hidden temporary folder next to
    it and renaming that into place once complete.

    An existing `out` is refused unless `overwrite`, and even then unless it is an export whose
    manifest owns every file in it (:func:`replaceable_files`), checked before the export starts
    and again just before the swap. It is replaced only after the new folder is complete, so a
    failed export leaves the old one untouched; of the old folder only the files its manifest
    owns are deleted, so a file that appears in it during the export is never lost.
    """
    out = Path(out).expanduser().absolute()
    if out.exists() and not overwrite:
        raise ExportError(
            f"`out` {str(out)!r} already exists; choose another folder or pass overwrite=true to replace it"
        )
    if out.exists():
        replaceable_files(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.incomplete-", dir=out.parent))
    try:
        fill(staging)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(staging, 0o777 & ~umask)  # mkdtemp's private mode is for the staging phase only
        owned = replaceable_files(out) if out.exists() else []
        put_in_place(staging, out, dispose=lambda replaced: _remove_owned(replaced, owned, out))
    except BaseException:
        discard(staging)
        raise
    return out


def replaceable_files(out: Path) -> list[str]:
    """The files of the existing folder `out` that overwrite=true may delete: all of them, when
    its manifest is one we wrote and owns each; otherwise ExportError says what is in the way."""

    def refuse(reason: str) -> ExportError:
        return ExportError(
            f"`out` {str(out)!r} cannot be replaced: {reason}; overwrite=true replaces only a folder written by "
            "`python -m sru_lightning export` that holds nothing else (move it away or choose another `out`)"
        )

    if not out.is_dir() or out.is_symlink():
        raise refuse("it is not a folder" if not out.is_dir() else "it is a symbolic link, not an export folder")
    path = out / MANIFEST_NAME
    if not path.is_file():
        raise refuse(f"it has no {MANIFEST_NAME}, so it is not an export")
    try:
        manifest = _load_manifest(path)
    except ExportError as error:
        raise refuse(str(error)) from None
    name, version = manifest.get("format_name", _MISSING), manifest.get("export_format_version", _MISSING)
    if name is _MISSING and manifest.get("producer") == "sru_lightning export":
        raise refuse(
            "it is an export made before manifests named their format and listed their files (no "
            "`format_name`, no `owned_files`), so which files are its own cannot be checked"
        )
    if name != FORMAT_NAME:
        raise refuse(
            f"its {MANIFEST_NAME} is not an export manifest (`format_name` is {_shown(name)}, expected {FORMAT_NAME!r})"
        )
    if version != EXPORT_FORMAT_VERSION:
        raise refuse(
            f"it is an export of format version {_shown(version)}, and this sru_lightning knows "
            f"version {EXPORT_FORMAT_VERSION} only"
        )
    owned = manifest.get("owned_files", _MISSING)
    if not (
        isinstance(owned, list)
        and all(isinstance(file, str) for file in owned)
        and MANIFEST_NAME in owned
        and set(owned) <= EXPORT_FILE_NAMES
    ):
        raise refuse(
            f"its {MANIFEST_NAME} does not list the files the export owns (`owned_files` must name "
            f"{MANIFEST_NAME} and others of {', '.join(sorted(EXPORT_FILE_NAMES))}, got {_shown(owned)})"
        )
    with os.scandir(out) as entries:
        for entry in sorted(entries, key=lambda entry: entry.name):
            if entry.is_dir(follow_symlinks=False):
                raise refuse(f"it holds the folder {entry.name + '/'!r}, which is not part of the export")
            if entry.name not in owned:
                raise refuse(
                    f"it holds {entry.name!r}, which its {MANIFEST_NAME} does not list as part of the "
                    f"export ({', '.join(owned)})"
                )
    return list(owned)


def _remove_owned(folder: Path, owned: Iterable[str], out: Path) -> None:
    """Delete the replaced export `folder`: its owned files, then the folder only if that empties it."""
    for name in owned:
        try:
            (folder / name).unlink()
        except OSError:  # gone, or a folder that appeared under that name: rmdir below reports it
            pass
    try:
        folder.rmdir()
    except OSError:
        raise ExportError(
            f"the new export is in {str(out)!r}, but files appeared in the folder it replaced during the export; "
            f"they were kept in {str(folder)!r}: look at them and delete that folder yourself"
        ) from None


def write_json(path: Path, content: Mapping[str, Any]) -> None:
    path.write_text(json.dumps(content, indent=2) + "\n", encoding="utf-8")


def _load_manifest(path: Path) -> dict[str, Any]:
    """The JSON object in `path`; anything else (unreadable, not JSON, not an object) raises ExportError."""
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except OSError as error:
        raise ExportError(f"cannot read {str(path)!r}: {error.strerror or error}") from None
    except ValueError as error:  # includes bytes that are not UTF-8
        raise ExportError(f"{str(path)!r} is not JSON ({error})") from None
    if not isinstance(manifest, dict):
        raise ExportError(
            f"{str(path)!r} is not an export manifest: expected a JSON object, got "
            f"{_JSON_KINDS.get(type(manifest), type(manifest).__name__)}"
        )
    return manifest


def _is_tensor_spec(entry: Any) -> bool:
    import torch

    return (
        isinstance(entry, dict)
        and isinstance(entry.get("name"), str)
        and isinstance(entry.get("shape"), list)
        and all(size in (BATCH, LENGTH) or (type(size) is int and size >= 0) for size in entry["shape"])
        and isinstance(getattr(torch, str(entry.get("dtype")), None), torch.dtype)
        and type(entry.get("initial")) in (int, float, bool, type(None))
    )


#: The fields the runtime reads besides `format` and `files`: (name, what it must be, test).
_FIELDS = (
    ("model_kind", "a string", lambda value: isinstance(value, str)),
    ("sizes.vocab_size", "a positive integer", lambda value: type(value) is int and value > 0),
    ("needs_sru_lightning_kernels", "true or false", lambda value: isinstance(value, bool)),
)
#: The graph formats' fields besides those (format=hf has no graph: its config.json says the rest).
_GRAPH_FIELDS = (
    (
        "inputs",
        "a list of {name, shape, dtype, initial} objects",
        lambda value: isinstance(value, list) and len(value) > 0 and all(map(_is_tensor_spec, value)),
    ),
)


def _field(manifest: Mapping[str, Any], name: str) -> Any:
    value: Any = manifest
    for key in name.split("."):
        value = value.get(key, _MISSING) if isinstance(value, dict) else _MISSING
    return value


def read_manifest(folder: str | os.PathLike) -> dict[str, Any]:
    """The manifest of an export folder, checked to be one this version of the package reads and
    to hold every field the runtime uses, so that a damaged or foreign manifest.json fails here
    in one line instead of deep in the runtime.

    A manifest without `format_name` is read when its version is known: exports made before the
    field existed still run (they are not replaced by overwrite=true, which needs `owned_files`).
    """
    import torch

    folder = Path(folder).expanduser()
    path = folder / MANIFEST_NAME
    if not folder.is_dir():
        raise ExportError(
            f"the export folder {str(folder)!r} does not exist (make one with `python -m sru_lightning export`)"
        )
    if not path.is_file():
        raise ExportError(
            f"{str(folder)!r} is not an export folder: it has no {MANIFEST_NAME} "
            "(make one with `python -m sru_lightning export`)"
        )
    manifest = _load_manifest(path)
    name, version = manifest.get("format_name", _MISSING), manifest.get("export_format_version", _MISSING)
    if name not in (FORMAT_NAME, _MISSING) or (name is _MISSING and version is _MISSING):
        raise ExportError(
            f"{str(folder)!r} is not an export folder: its {MANIFEST_NAME} was not written by "
            f"`python -m sru_lightning export` (`format_name` is {_shown(name)}, "
            f"expected {FORMAT_NAME!r})"
        )
    if version != EXPORT_FORMAT_VERSION:
        raise ExportError(
            f"{str(folder)!r} is an export of format version {_shown(version)} (package "
            f"{manifest.get('package_version', '?')}); this sru_lightning reads version {EXPORT_FORMAT_VERSION}: "
            "export the checkpoint again"
        )
    fmt = manifest.get("format")
    if fmt not in FORMATS:
        raise ExportError(f"{str(path)!r}: `format` must be one of {', '.join(FORMATS)}, got {_shown(fmt)}")
    files = manifest.get("files")
    model_name, vocabulary_name = _field(manifest, "files.model"), _field(manifest, "files.vocabulary")
    if fmt == "hf":
        if not (
            isinstance(files, dict)
            and model_name == MODEL_FILES[fmt]
            and _field(manifest, "files.config") == PRETRAINED_FILES["config"]
            and set(files) <= {"model", *PRETRAINED_FILES}
        ):
            raise ExportError(
                f'{str(path)!r}: `files` must be {{"model": {MODEL_FILES[fmt]!r}, "config": '
                f'{PRETRAINED_FILES["config"]!r}}} for format=hf, with "tokenizer": {PRETRAINED_FILES["tokenizer"]!r} '
                f"when it has one, got {_shown(files)}"
            )
    elif (
        not isinstance(files, dict)
        or model_name != MODEL_FILES[fmt]
        or vocabulary_name not in (_MISSING, VOCABULARY_NAME)
    ):
        raise ExportError(
            f'{str(path)!r}: `files` must be {{"model": {MODEL_FILES[fmt]!r}}} for format={fmt}, '
            f'with "vocabulary": {VOCABULARY_NAME!r} when it has one, got {_shown(files)}'
        )
    for field, expected, valid in _FIELDS + (() if fmt == "hf" else _GRAPH_FIELDS):
        value = _field(manifest, field)
        if not valid(value):
            raise ExportError(
                f"{str(path)!r}: `{field}` must be {expected}, got {_shown(value)}; "
                "the file is damaged: export the checkpoint again"
            )
    if fmt in ("pt2", "aoti") and manifest.get("torch_version") != torch.__version__:
        raise ExportError(
            f"{str(folder)!r} was exported with torch {manifest.get('torch_version')!r} and a {fmt} program "
            f"runs only on that version; this is torch {torch.__version__}: export it again here, or use format=onnx"
        )
    if not (folder / model_name).is_file():
        raise ExportError(f"{str(folder)!r} lacks its model file {model_name!r}")
    return manifest


def read_vocabulary(folder: str | os.PathLike):
    """The token codec in the folder's vocabulary.json, checked field by field: a damaged or
    foreign file fails here in one line instead of when a prompt is encoded or a token written."""
    path = Path(folder).expanduser() / VOCABULARY_NAME
    try:
        state = json.loads(path.read_text(encoding="utf-8"))
    except OSError as error:
        raise ExportError(f"cannot read the vocabulary {str(path)!r}: {error.strerror or error}") from None
    except ValueError as error:
        raise ExportError(f"the vocabulary {str(path)!r} is not JSON ({error}); export the checkpoint again") from None
    return codec_from_state(state, path)


def tokens_module():
    """:mod:`sru_lightning.data.tokens` (TokenCodec, TOKEN_LEVELS); reading an export folder needs
    the codec alone, and importing it imports no Lightning data module."""
    return importlib.import_module("sru_lightning.data.tokens")


def codec_from_state(state: Any, path: Path):
    """The token codec of `state` (read from the file `path`), checked field by field: a damaged or
    foreign file fails here in one line instead of when a prompt is encoded or a token written."""
    tokens = tokens_module()
    TOKEN_LEVELS = tokens.TOKEN_LEVELS
    problem = None
    if not isinstance(state, dict):
        problem = (
            f"expected a JSON object with `level` and `itos`, got {_JSON_KINDS.get(type(state), type(state).__name__)}"
        )
    elif state.get("level") not in TOKEN_LEVELS:
        problem = f"`level` must be one of {', '.join(TOKEN_LEVELS)}, got {_shown(state.get('level', _MISSING))}"
    elif state["level"] in ("byte", "bpe") and state.get("itos") is not None:
        problem = f"`itos` must be null at {state['level']} level, got {_shown(state['itos'])}"
    elif state["level"] == "bpe" and not (isinstance(state.get("tokenizer"), str) and state["tokenizer"]):
        shown = _shown(state.get("tokenizer", _MISSING))
        problem = f"`tokenizer` must be the tokenizer's JSON text at bpe level, got {shown}"
    elif state["level"] != "bpe" and "tokenizer" in state:
        problem = f"`tokenizer` belongs to bpe level only, got one at {state['level']} level"
    elif state["level"] not in ("byte", "bpe") and not (
        isinstance(state.get("itos"), list) and state["itos"] and all(isinstance(token, str) for token in state["itos"])
    ):
        problem = f"`itos` must be a non-empty list of strings (the tokens), got {_shown(state.get('itos', _MISSING))}"
    elif not isinstance(state.get("unknown"), (str, type(None))) or not isinstance(state.get("end_of_line", ""), str):
        problem = (
            f"`unknown` and `end_of_line` must be strings, got {_shown(state.get('unknown'))} and "
            f"{_shown(state.get('end_of_line'))}"
        )
    what = "the vocabulary" if path.name == VOCABULARY_NAME else "the tokenizer"
    if problem is not None:
        raise ExportError(f"{what} {str(path)!r} is damaged: {problem}; export the checkpoint again")
    try:
        return tokens.TokenCodec.from_state_dict(state)
    except ImportError as error:  # a bpe vocabulary without the `tokenizers` package
        raise ExportError(str(error)) from None
    except ValueError as error:  # a bpe `tokenizer` that is not a byte-level tokenizer's JSON
        raise ExportError(
            f"{what} {str(path)!r} is damaged: {str(error).splitlines()[0]}; export the checkpoint again"
        ) from None
