"""`generate model=<export dir> backend=onnxruntime|pt2`: the export folder and its vocabulary in
the place of the checkpoint's model, for generate's own decoding loop. A format=hf folder holds
the network's weights: it runs in PyTorch, as the checkpoint's network does."""

from __future__ import annotations


def load_for_generation(folder: str, backend: str, threads: int | None = None):
    """(model with ``step`` and ``device``, codec, one line saying what was loaded).

    Raises :class:`~sru_lightning.export.ExportError` for a folder this package cannot run."""
    from .graph_module import ExportError
    from .package import read_manifest, read_vocabulary
    from .runtime import load_exported

    manifest = read_manifest(folder)
    if manifest["format"] == "hf":
        return _load_pretrained(folder, backend, manifest)
    model = load_exported(folder, backend or None, threads)
    if "vocabulary" not in model.manifest["files"]:
        raise ExportError(
            f"{folder!r} holds no vocabulary.json (it was exported without one); export the "
            "checkpoint with `python -m sru_lightning export`, which saves it"
        )
    codec = read_vocabulary(model.folder)
    if codec.vocab_size != model.vocab_size:
        raise ExportError(
            f"the vocabulary of {folder!r} has {codec.vocab_size} tokens but the model {model.vocab_size}"
        )
    source = model.manifest.get("source", {})
    description = (
        f"{model.folder} ({model.kind}, format={model.manifest['format']}, backend={model.backend}, "
        f"step {source.get('global_step', '?')}, {codec.level} level)"
    )
    return model, codec, description


def _load_pretrained(folder: str, backend: str, manifest):
    """A format=hf folder: the network (its ``step``) and codec of :func:`from_pretrained`."""
    from .graph_module import ExportError
    from .pretrained import from_pretrained

    if backend:
        raise ExportError(
            f"`backend` ({backend!r}) applies to format=onnx, pt2 or aoti, but {folder!r} holds format=hf, "
            "which runs the network in PyTorch: leave `backend` empty"
        )
    net, codec = from_pretrained(folder)
    if codec is None:
        raise ExportError(
            f"{folder!r} holds no tokenizer.json (it was saved without one); export the checkpoint with "
            "`python -m sru_lightning export format=hf`, which saves it"
        )
    source = manifest.get("source", {})
    description = f"{folder} ({net.rnn_type}, format=hf, step {source.get('global_step', '?')}, {codec.level} level)"
    return net, codec, description
