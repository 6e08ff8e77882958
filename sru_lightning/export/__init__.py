"""Deployment: a trained language model as ONNX (the recurrence as a standard Scan, no
sru_lightning needed to run it), a torch.export program or an AOTInductor package, with the
state carried in and out of one graph that serves whole sequences and single decoding steps;
or the network's weights in the Hugging Face layout (format=hf, :mod:`.pretrained`).

Importing this package is cheap; the exporters import torch.onnx / onnxscript / Inductor only
when used.
"""

from .graph_module import ExportableLanguageModel, ExportError, TensorSpec
from .package import FORMATS, read_manifest, read_vocabulary
from .pretrained import from_pretrained, save_pretrained
from .runtime import BACKENDS, ExportedLanguageModel, load_exported, load_pt2


def export_language_model(model, out, fmt, codec=None, *, overwrite=False, source=None):
    """See :func:`sru_lightning.export.exporter.export_language_model`."""
    from .exporter import export_language_model as export

    return export(model, out, fmt, codec, overwrite=overwrite, source=source)


__all__ = [
    "BACKENDS",
    "FORMATS",
    "ExportError",
    "ExportableLanguageModel",
    "ExportedLanguageModel",
    "TensorSpec",
    "export_language_model",
    "from_pretrained",
    "load_exported",
    "load_pt2",
    "read_manifest",
    "read_vocabulary",
    "save_pretrained",
]
