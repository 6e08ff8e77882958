"""Export a trained language model: a torch.export program, an AOTInductor package, or ONNX.

All three start from the same graph (:class:`~sru_lightning.export.graph_module.ExportableLanguageModel`,
batch and length dynamic). The recurrence stays one op (``torch.ops.sru_lightning.recurrence_forward``)
in the PyTorch formats, and becomes a standard ONNX Scan in ONNX
(:mod:`sru_lightning.export.onnx_recurrence`). ``nn.LSTM`` becomes ONNX's own LSTM op, and in the
PyTorch formats a loop over time (torch's while_loop decomposition), so that its length stays
dynamic as well.
"""

from __future__ import annotations

import contextlib
import logging
import time
import warnings
from pathlib import Path
from typing import Any

import torch

import sru_lightning

from .graph_module import BATCH, LENGTH, ExportableLanguageModel, ExportError
from .package import (
    EXPORT_FORMAT_VERSION,
    FORMAT_NAME,
    MANIFEST_NAME,
    MODEL_FILES,
    VOCABULARY_NAME,
    check_format,
    owned_files,
    write_atomically,
    write_json,
)

ONNX_OPSET = 20


def require_kernels(purpose: str) -> None:
    """The compiled recurrence op must exist: without it the layers run the pure-PyTorch
    reference, whose Python loop over time cannot be exported with a dynamic length."""
    from sru_lightning.ops.build import ExtensionBuildError, load_extension

    try:
        load_extension()
        from sru_lightning.ops import op as _registered  # noqa: F401  (fake kernels and autograd)
    except ExtensionBuildError as error:
        reason = str(error).splitlines()[0]
        raise ExportError(
            f"{purpose} needs sru_lightning's compiled recurrence kernels, which are not available ({reason}); "
            "install a C++ compiler (set CXX) and run `python -m sru_lightning build`, unset "
            "SRU_LIGHTNING_EXTENSION=0, or use format=onnx, which runs without them"
        ) from None


@contextlib.contextmanager
def _rnn_loop_as_while_loop():
    """nn.LSTM as a loop over time in the exported program (dynamic length) instead of unrolled."""
    try:
        from torch.export._patches import register_lstm_while_loop_decomposition
    except ImportError:  # older torch: export then fixes the length, which the parity checks catch
        yield
        return
    lstm = torch.ops.aten.lstm.input
    # The patch swaps the op's Python kernel but not the kernel the op cached on its last call
    # (an earlier ONNX export in this process leaves one): clear it on the way in and out.
    lstm._dispatch_cache.clear()
    try:
        with register_lstm_while_loop_decomposition():
            yield
    finally:
        lstm._dispatch_cache.clear()


def graph_module(model) -> ExportableLanguageModel:
    """The model as an export graph, float32 (a copy when the weights are another dtype)."""
    if any(p.dtype != torch.float32 for p in model.parameters()):
        import copy

        model = copy.deepcopy(model).float()
    wrapped = ExportableLanguageModel(model)
    if wrapped.rnn_type in ("sru", "srupp"):
        require_kernels(f"exporting model={wrapped.rnn_type}")
    return wrapped.eval()


def exported_program(wrapped: ExportableLanguageModel) -> torch.export.ExportedProgram:
    with _rnn_loop_as_while_loop(), torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return torch.export.export(wrapped, wrapped.example_inputs(), dynamic_shapes=wrapped.dynamic_shapes())


def save_pt2(wrapped: ExportableLanguageModel, path: Path) -> None:
    torch.export.save(exported_program(wrapped), str(path))


def save_aoti(wrapped: ExportableLanguageModel, path: Path) -> None:
    program = exported_program(wrapped)
    with _rnn_loop_as_while_loop(), torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        # Weights frozen into the package as constants: a sequence (L=128, B=32) then took 1.00x
        # the eager time instead of 1.08x. Without prepacking them for oneDNN's linear kernel,
        # which is slow for the single row of a decoding step (0.58x eager per step with it,
        # 0.42x without; 0.99x for the sequence with it); measured in one process, 1 thread.
        configs = {"freezing": True, "cpp.weight_prepack": False}
        torch._inductor.aoti_compile_and_package(program, package_path=str(path), inductor_configs=configs)


@contextlib.contextmanager
def _quiet_logger(name: str):
    """The exporter logs a warning for every optional op library it does not find (torchvision)."""
    logger = logging.getLogger(name)
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


def save_onnx(wrapped: ExportableLanguageModel, path: Path) -> None:
    import onnx
    import onnx_ir as ir

    from .onnx_recurrence import translation_table

    with (
        torch.no_grad(),
        warnings.catch_warnings(),
        contextlib.redirect_stdout(None),
        _quiet_logger("torch.onnx._internal.exporter._registration"),
    ):
        warnings.simplefilter("ignore")
        program = torch.onnx.export(
            wrapped,
            wrapped.example_inputs(),
            dynamic_shapes=wrapped.dynamic_shapes(),
            dynamo=True,
            custom_translation_table=translation_table(),
            opset_version=ONNX_OPSET,
            optimize=False,
            verbose=False,
        )
        # The exporter can leave the traced length in the shapes it records for intermediate
        # values (nn.LSTM's outputs), which the optimiser would then fold into constants: keep
        # only the declared shapes of the graph's inputs and outputs and let it infer the rest.
        graph = program.model.graph
        outputs = {id(value) for value in graph.outputs}
        for node in graph.all_nodes():
            for value in node.outputs:
                if id(value) not in outputs:
                    value.shape = None
        for values, specs in ((graph.inputs, wrapped.input_specs()), (graph.outputs, wrapped.output_specs())):
            for value, spec in zip(values, specs):
                value.name = spec.name
                value.shape = ir.Shape([ir.SymbolicDim(size) if isinstance(size, str) else size for size in spec.shape])
        program.optimize()
        program.save(str(path))
    onnx.checker.check_model(str(path), full_check=True)


_SAVERS = {"onnx": save_onnx, "pt2": save_pt2, "aoti": save_aoti}


def manifest(
    wrapped: ExportableLanguageModel, fmt: str, source: dict[str, Any] | None = None, with_vocabulary: bool = True
) -> dict[str, Any]:
    """What an export folder holds: enough to feed the graph without reading the model file, and
    the name of every file the export owns, which overwrite=true checks before deleting any."""
    config = wrapped.net.config
    options = dict(config.get("sru_options") or {})
    sizes = {
        "vocab_size": config["vocab_size"],
        "embedding_dim": config["embedding_dim"],
        "hidden_size": config["hidden_size"],
        "num_layers": config["num_layers"],
        "memory_length": wrapped.memory_length,
        "bidirectional": bool(options.get("bidirectional", False)),
        "parameters": sum(p.numel() for p in wrapped.parameters()),
    }
    files = {"model": MODEL_FILES[fmt], **({"vocabulary": VOCABULARY_NAME} if with_vocabulary else {})}
    return {
        "format_name": FORMAT_NAME,
        "export_format_version": EXPORT_FORMAT_VERSION,
        "format": fmt,
        "model_kind": wrapped.rnn_type,
        "sizes": sizes,
        "dtype": "float32",
        "dynamic_dimensions": [BATCH, LENGTH],
        "inputs": [spec.as_dict() for spec in wrapped.input_specs()],
        "outputs": [spec.as_dict() for spec in wrapped.output_specs()],
        "opset": ONNX_OPSET if fmt == "onnx" else None,
        "needs_sru_lightning_kernels": fmt != "onnx" and wrapped.rnn_type != "lstm",
        "files": files,
        "owned_files": owned_files(files),
        "torch_version": torch.__version__,
        "package_version": sru_lightning.__version__,
        "producer": "sru_lightning export",
        "source": source or {},
    }


def export_language_model(
    model, out, fmt: str, codec=None, *, overwrite: bool = False, source: dict[str, Any] | None = None
) -> Path:
    """Export `model` (an :class:`~sru_lightning.models.SRULanguageModel` in eval mode) to the folder
    `out` in format "onnx", "pt2", "aoti" or "hf" (its network's weights in the Hugging Face layout,
    :mod:`sru_lightning.export.pretrained`), with the vocabulary `codec` (a TokenCodec) when given.

    Returns the folder. It appears only when complete; an existing folder is refused unless
    `overwrite`, and then unless it is an earlier export holding nothing but its own files.
    Raises :class:`ExportError` for a model or setting that cannot be exported.
    """
    check_format(fmt)
    if fmt == "hf":
        from .pretrained import save_pretrained

        return save_pretrained(getattr(model, "net", model), out, codec, overwrite=overwrite, source=source)
    wrapped = graph_module(model)

    def fill(folder: Path) -> None:
        started = time.perf_counter()
        _SAVERS[fmt](wrapped, folder / MODEL_FILES[fmt])
        description = manifest(wrapped, fmt, source, with_vocabulary=codec is not None)
        description["export_seconds"] = round(time.perf_counter() - started, 1)
        if codec is not None:
            write_json(folder / VOCABULARY_NAME, codec.state_dict())
        write_json(folder / MANIFEST_NAME, description)  # last: its presence marks a complete folder

    return write_atomically(Path(out), fill, overwrite=overwrite)
