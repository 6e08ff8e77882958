"""Run an export folder: one call per sequence or decoding step, the state carried in and out.

``load_exported(folder, backend)`` returns an :class:`ExportedLanguageModel` whose ``step`` has the
signature of :meth:`SRULanguageModel.step`, so ``generate`` drives it like the checkpoint's model:

* backend "onnxruntime" (format=onnx): needs only ``onnxruntime`` and ``numpy``;
* backend "pt2" (format=pt2 or aoti): needs torch and, for SRU and SRU++ models, this package's
  compiled recurrence op, which :func:`load_pt2` registers before loading.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from .graph_module import ExportError, TensorSpec
from .package import MANIFEST_NAME, read_manifest

BACKENDS = ("onnxruntime", "pt2")
BACKEND_FORMATS = {"onnxruntime": ("onnx",), "pt2": ("pt2", "aoti")}


def load_pt2(path: str | os.PathLike, fmt: str = "pt2", needs_kernels: bool = True):
    """Load an exported ``.pt2``: a torch.export program (``fmt="pt2"``, returns its module) or an
    AOTInductor package (``fmt="aoti"``, returns the runner). Both are called as
    ``model(tokens, *state)``.

    This is the one line a serving script needs (``sru_lightning.export.load_pt2("model.pt2")``):
    it registers the recurrence op first, or says what to install when it cannot.
    A file that torch cannot load (truncated, or not a .pt2 of that kind) raises ExportError in one line.
    """
    if needs_kernels:
        from .exporter import require_kernels

        require_kernels(f"loading {str(path)!r}")
    from .exporter import _quiet_logger

    try:
        # torch logs the traceback (torch.export) or a guess (AOTInductor: "outdated pt2 file") of a
        # file it cannot read before raising its own error, which the ExportError below says in one line.
        with _quiet_logger("torch.export"), _quiet_logger("torch._inductor.package"):
            if fmt == "aoti":
                return torch._inductor.aoti_load_package(str(path))
            return torch.export.load(str(path)).module()
    except Exception as error:  # torch raises many kinds (BadZipFile, RuntimeError, KeyError, ...) for a bad file
        kind = "an AOTInductor package" if fmt == "aoti" else "a torch.export program"
        raise _unloadable(path, kind, error) from None


def _unloadable(path: str | os.PathLike, kind: str, error: BaseException) -> ExportError:
    """The error for a model file its loader rejects: which file, what it should be, the loader's first line."""
    reason = (str(error).strip().splitlines() or [""])[0][:200]
    return ExportError(
        f"cannot load {str(path)!r}: it is not {kind} that this runtime reads (it may be truncated "
        f"or another file): {type(error).__name__}: {reason}; export the checkpoint again"
    )


class ExportedLanguageModel:
    """An export folder behind the language model's ``step(tokens, state) -> (logits, state)``."""

    #: tokens (B, L) and logits (B, L, vocab), as the language model's
    batch_first = True

    def __init__(self, folder: str | os.PathLike, backend: str | None = None, threads: int | None = None) -> None:
        self.folder = Path(folder).expanduser()
        self.manifest = read_manifest(self.folder)
        fmt = self.manifest["format"]
        if backend is None:
            backend = next(name for name, formats in BACKEND_FORMATS.items() if fmt in formats)
        if backend not in BACKENDS:
            raise ExportError(f"`backend` must be one of {', '.join(BACKENDS)}, got {backend!r}")
        if fmt not in BACKEND_FORMATS[backend]:
            wanted = " or ".join(f"format={f}" for f in BACKEND_FORMATS[backend])
            raise ExportError(
                f"backend={backend} runs exports of {wanted}, but {str(self.folder)!r} holds format={fmt}"
            )
        self.backend = backend
        self.kind = self.manifest["model_kind"]
        self.vocab_size = self.manifest["sizes"]["vocab_size"]
        self.state_specs = [
            TensorSpec(d["name"], tuple(d["shape"]), d["dtype"], d["initial"]) for d in self.manifest["inputs"][1:]
        ]
        self.device = torch.device("cpu")
        model_path = self.folder / self.manifest["files"]["model"]
        if backend == "onnxruntime":
            self._run = _onnxruntime_runner(model_path, threads, [spec["name"] for spec in self.manifest["inputs"]])
        else:
            program = load_pt2(model_path, fmt, self.manifest["needs_sru_lightning_kernels"])

            def run(tokens, state):
                # An AOTInductor package reads its inputs as contiguous whatever their strides: a
                # time slice of a longer token tensor (tokens[:, 3:5]) gave another sequence's logits.
                with torch.inference_mode():
                    return program(tokens.contiguous(), *(tensor.contiguous() for tensor in state))

            self._run = run

    @property
    def bidirectional(self) -> bool:
        """Whether the exported layers read both ways (streaming refuses those)."""
        return bool(self.manifest["sizes"].get("bidirectional", False))

    def initial_state(self, batch: int) -> list[torch.Tensor]:
        return [spec.initial_tensor(batch) for spec in self.state_specs]

    def __call__(self, tokens: torch.Tensor, state: Any = None) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """tokens (B, L) -> logits (B, L, vocab) and the new state (a list of tensors)."""
        if state is None:
            state = self.initial_state(tokens.shape[0])
        logits, *new_state = self._run(tokens.to(torch.int64), state)
        return logits, list(new_state)

    def step(self, tokens: torch.Tensor, state: Any = None) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """As :meth:`sru_lightning.nn.LanguageNet.step`: tokens (B,) or (B, L) -> the next token's logits (B, vocab)."""
        from sru_lightning.nn.streaming import stream_step

        if tokens.dim() == 1:
            tokens = tokens.unsqueeze(1)
        logits, state = stream_step(self, tokens, state)
        return logits[:, -1], state


def _onnxruntime_runner(path: Path, threads: int | None, input_names: list[str]):
    """A runner of the ONNX file `path`, checked to take the inputs `input_names` the manifest lists:
    another ONNX model in its place would otherwise fail only at the first call."""
    try:
        import numpy as np
        import onnxruntime
    except ImportError as error:
        raise ExportError(
            f"backend=onnxruntime needs the package {error.name!r}: pip install 'sru_lightning[export]'"
        ) from None
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = threads or torch.get_num_threads()
    options.inter_op_num_threads = 1
    try:
        session = onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    except Exception as error:  # onnxruntime's errors (InvalidProtobuf, Fail, ...) derive from Exception only
        raise _unloadable(path, "an ONNX model", error) from None
    names = [value.name for value in session.get_inputs()]
    if names != input_names:
        raise ExportError(
            f"{str(path)!r} is not the model of this export: its inputs are {names}, but "
            f"{str(path.parent / MANIFEST_NAME)!r} lists {input_names}; export the checkpoint again"
        )

    def run(tokens, state):
        feed = {name: np.ascontiguousarray(t.numpy()) for name, t in zip(names, (tokens, *state))}
        return [torch.from_numpy(array) for array in session.run(None, feed)]

    return run


def load_exported(folder: str | os.PathLike, backend: str | None = None, threads: int | None = None):
    """The export folder as a model with ``step(tokens, state)``; backend None picks the one
    that runs the folder's format."""
    return ExportedLanguageModel(folder, backend, threads)
