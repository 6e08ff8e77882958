"""The recurrence as a standard ONNX Scan: every inference option of the SRU layers matches eager
at lengths and batch sizes other than the traced ones, onnx.checker passes, onnxruntime runs the
file with nothing but numpy, and training-only inputs are refused."""

from __future__ import annotations

import inspect
import json
import subprocess
import sys

import numpy as np
import pytest
import torch
from torch import nn

onnx = pytest.importorskip("onnx", reason="needs the `export` extra: pip install 'sru_lightning[export]'")
onnxruntime = pytest.importorskip("onnxruntime", reason="needs the `export` extra: pip install 'sru_lightning[export]'")

from sru_lightning.export import ExportableLanguageModel, ExportError  # noqa: E402
from sru_lightning.export.onnx_recurrence import OPSET, translation_table  # noqa: E402
from sru_lightning.nn import SRU, SRUCell  # noqa: E402
from sru_lightning.ops.testing import relative_error  # noqa: E402

TRACED = (2, 5)  # (B, L) of the example inputs
CHECKED = [(1, 1), (3, 7), (1, 23), (4, 2)]  # L = 1, a prime L, L >= 4x traced; B = 1 and B > 1


class StackWithPadding(nn.Module):
    def __init__(self, rnn: SRU, padded: bool) -> None:
        super().__init__()
        self.rnn, self.padded = rnn, padded

    def forward(self, x, c0, lengths):
        mask_pad = None
        if self.padded:  # True after each sequence's length
            mask_pad = torch.arange(x.shape[0]).unsqueeze(1) >= lengths.unsqueeze(0)
        return self.rnn(x, c0, mask_pad=mask_pad)


def onnx_session(module: nn.Module, example: tuple, dynamic_shapes: tuple, path) -> onnxruntime.InferenceSession:
    with torch.no_grad():
        program = torch.onnx.export(
            module,
            example,
            dynamic_shapes=dynamic_shapes,
            dynamo=True,
            verbose=False,
            custom_translation_table=translation_table(),
            opset_version=OPSET,
        )
    program.save(str(path))
    onnx.checker.check_model(str(path), full_check=True)
    nodes = onnx.load(str(path)).graph.node
    assert "Scan" in {node.op_type for node in nodes} and {node.domain for node in nodes} <= {""}
    return onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])


@pytest.mark.parametrize(
    "options,input_size,padded",
    [
        (dict(bidirectional=True, layer_norm=True), 8, True),  # k=4 (input 8 -> output 32), layer norm before
        (dict(rescale=True, highway_bias=-2.0), 16, True),  # k=3 with scale_x
        (dict(has_skip_term=False, bidirectional=True, layer_norm=True, normalize_after=True), 16, False),
        (dict(projection_size=4, highway_bias=1.0, rescale=True, bidirectional=True), 12, True),
    ],
    ids=[
        "bidirectional-k4-layernorm-maskpad",
        "k3-rescale-highway-maskpad",
        "noskip-bidirectional-normafter",
        "projection-bidirectional-maskpad",
    ],
)
def test_every_inference_option_matches_eager_at_untraced_shapes(options, input_size, padded, tmp_path):
    module = StackWithPadding(SRU(input_size, 16, num_layers=2, **options), padded).eval()
    width = module.rnn.output_size
    batch, length = torch.export.Dim("batch", min=1, max=4096), torch.export.Dim("length", min=1, max=1 << 16)
    example = (
        torch.randn(TRACED[1], TRACED[0], input_size),
        torch.randn(2, TRACED[0], width),
        torch.tensor([TRACED[1], 2]),
    )
    session = onnx_session(module, example, ({0: length, 1: batch}, {1: batch}, {0: batch}), tmp_path / "sru.onnx")
    for b, steps in CHECKED:
        x, c0 = torch.randn(steps, b, input_size), torch.randn(2, b, width)
        lengths = torch.randint(1, steps + 1, (b,))
        with torch.no_grad():
            expected = module(x, c0, lengths)
        got = session.run(None, {"x": x.numpy(), "c0": c0.numpy(), "lengths": lengths.numpy()})
        for name, e, g in zip(("h", "c_last"), expected, got):
            assert g.shape == tuple(e.shape)
            assert relative_error(torch.from_numpy(g), e, floor=1e-12) < 1e-5, f"{name} at B={b} L={steps}"


class StackWithDocuments(nn.Module):
    def __init__(self, rnn: SRU) -> None:
        super().__init__()
        self.rnn = rnn

    def forward(self, x, c0, reset):
        return self.rnn(x, c0, reset=reset)


@pytest.mark.parametrize("bidirectional", [False, True], ids=["unidirectional", "bidirectional"])
def test_documents_packed_in_a_row_match_eager_in_onnxruntime(bidirectional, tmp_path):
    module = StackWithDocuments(SRU(8, 16, num_layers=2, bidirectional=bidirectional)).eval()
    width = module.rnn.output_size
    batch, length = torch.export.Dim("batch", min=1, max=4096), torch.export.Dim("length", min=1, max=1 << 16)
    example = (
        torch.randn(TRACED[1], TRACED[0], 8),
        torch.randn(2, TRACED[0], width),
        torch.rand(TRACED[1], TRACED[0]) < 0.3,
    )
    session = onnx_session(
        module, example, ({0: length, 1: batch}, {1: batch}, {0: length, 1: batch}), tmp_path / "d.onnx"
    )
    generator = torch.Generator().manual_seed(0)
    for b, steps in CHECKED:
        x, c0 = torch.randn(steps, b, 8, generator=generator), torch.randn(2, b, width, generator=generator)
        reset = torch.rand(steps, b, generator=generator) < 0.3
        reset[0, 0] = True
        with torch.no_grad():
            expected = module(x, c0, reset)
        got = session.run(None, {"x": x.numpy(), "c0": c0.numpy(), "reset": reset.numpy()})
        for name, e, g in zip(("h", "c_last"), expected, got):
            assert relative_error(torch.from_numpy(g), e, floor=1e-12) < 1e-5, f"{name} at B={b} L={steps}"


class CellWithDocumentStates(nn.Module):
    def __init__(self, cell: SRUCell) -> None:
        super().__init__()
        self.cell = cell

    def forward(self, x, reset, c_starts):
        return self.cell(x, reset=reset, c_starts=c_starts)


def test_documents_starting_from_given_states_match_eager_in_onnxruntime(tmp_path):
    module = CellWithDocumentStates(SRUCell(8, 6, bidirectional=True)).eval()
    width = module.cell.output_size
    batch, length = torch.export.Dim("batch", min=1, max=4096), torch.export.Dim("length", min=1, max=1 << 16)
    example = (
        torch.randn(TRACED[1], TRACED[0], 8),
        torch.rand(TRACED[1], TRACED[0]) < 0.3,
        torch.randn(TRACED[1], TRACED[0], width),
    )
    session = onnx_session(
        module,
        example,
        ({0: length, 1: batch}, {0: length, 1: batch}, {0: length, 1: batch}),
        tmp_path / "starts.onnx",
    )
    generator = torch.Generator().manual_seed(1)
    for b, steps in CHECKED:
        x, c_starts = torch.randn(steps, b, 8, generator=generator), torch.randn(steps, b, width, generator=generator)
        reset = torch.rand(steps, b, generator=generator) < 0.3
        with torch.no_grad():
            expected = module(x, reset, c_starts)
            from_zero = module(x, reset, torch.zeros_like(c_starts))
        got = session.run(None, {"x": x.numpy(), "reset": reset.numpy(), "c_starts": c_starts.numpy()})
        for name, e, g in zip(("h", "c_last"), expected, got):
            assert relative_error(torch.from_numpy(g), e, floor=1e-12) < 1e-5, f"{name} at B={b} L={steps}"
        if reset[: steps - 1].any():  # a document inside the row starts from its given state
            assert relative_error(torch.from_numpy(got[0]), from_zero[0]) > 1e-3


def test_the_translation_takes_the_op_arguments_by_their_names():
    # The exporter matches the translation's parameters to the op's schema by name.
    from sru_lightning.export.onnx_recurrence import recurrence_forward
    from sru_lightning.ops.signature import FORWARD_ARGUMENTS

    parameters = list(inspect.signature(recurrence_forward).parameters)
    assert parameters == [argument.name for argument in FORWARD_ARGUMENTS]


def test_training_only_inputs_are_refused_with_a_clear_error():
    from helpers.language_models import language_model

    model = language_model(vocab_size=11, embedding_dim=8, hidden_size=8, num_layers=1)
    with pytest.raises(ExportError, match=r"training mode .*call model\.eval\(\)"):
        ExportableLanguageModel(model.train())
    model.net.rnn.rnn_lst[0] = SRUCell(8, 8, custom_m=nn.Linear(8, 24))
    with pytest.raises(ExportError, match=r"layer 'net\.rnn\.rnn_lst\.0' has custom_m \(per-step weight_c"):
        ExportableLanguageModel(model.eval())


ONNXRUNTIME_ONLY = r"""
import json, sys
import numpy as np
import onnxruntime
folder, expected_path = sys.argv[1], sys.argv[2]
manifest = json.load(open(folder + "/manifest.json"))
session = onnxruntime.InferenceSession(folder + "/model.onnx", providers=["CPUExecutionProvider"])
expected = np.load(expected_path)
tokens = expected["tokens"]
state = [np.full([tokens.shape[0] if d == "batch" else d for d in spec["shape"]], spec["initial"], dtype=spec["dtype"])
         for spec in manifest["inputs"][1:]]
outputs = session.run(None, {"tokens": tokens, **{spec["name"]: s for spec, s in zip(manifest["inputs"][1:], state)}})
error = float(np.abs(outputs[0] - expected["logits"]).max() / np.abs(expected["logits"]).max())
foreign = sorted(name for name in sys.modules if name.split(".")[0] in ("torch", "sru_lightning", "onnx"))
print(json.dumps({"error": error, "foreign": foreign}))
"""


@pytest.mark.slow  # starts a process
def test_onnxruntime_runs_an_exported_language_model_with_only_numpy(tmp_path):
    from helpers.language_models import language_model

    from sru_lightning.export import export_language_model

    model = language_model(
        vocab_size=13,
        embedding_dim=8,
        hidden_size=16,
        num_layers=2,
        sru_options={"highway_bias": -2.0, "rescale": True},
    ).eval()
    folder = export_language_model(model, tmp_path / "lm", "onnx")
    tokens = torch.randint(0, 13, (3, 29))
    with torch.no_grad():
        logits, _ = model(tokens)
    np.savez(tmp_path / "expected.npz", tokens=tokens.numpy(), logits=logits.numpy())
    result = subprocess.run(
        [sys.executable, "-I", "-c", ONNXRUNTIME_ONLY, str(folder), str(tmp_path / "expected.npz")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    report = json.loads(result.stdout)
    assert report["foreign"] == [] and report["error"] < 1e-5
