"""NaN and Inf stay where they are written.

* Padding: NaN or Inf written into the padded steps of the input (and of an SRU++ memory)
  changes nothing: the outputs of the valid steps, ``c``, the input's gradient and every
  parameter's gradient equal those of the zero-padded run, bit for bit (SRU, SRUCell, SRUpp).
* Packed documents: NaN or Inf at a step of document A never reaches document B of the same
  row: B's outputs, its last ``c`` and the input gradient of a loss on B equal B run alone
  (SRU, SRUpp with and without memory, causal or not, bidirectional).
"""

from __future__ import annotations

import pytest
import torch

from sru_lightning.nn import SRU, SRUCell, SRUpp
from sru_lightning.ops.testing import relative_error

L, B, D_IN, H, P = 10, 3, 6, 4, 2
LENGTHS = [10, 7, 4]
NON_FINITE = pytest.mark.parametrize("bad", [float("nan"), float("inf")], ids=["nan", "inf"])
DTYPES = pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["fp64", "fp32"])


def padding(left: bool = False) -> torch.Tensor:
    """(L, B) True on padding: row b holds LENGTHS[b] steps (at its end when `left`)."""
    mask = torch.zeros(L, B, dtype=torch.bool)
    for b, length in enumerate(LENGTHS):
        if left:
            mask[: L - length, b] = True
        else:
            mask[length:, b] = True
    return mask


def causal(length: int, memory_length: int, dtype: torch.dtype) -> torch.Tensor:
    return torch.triu(torch.full((length, memory_length + length), float("-inf"), dtype=dtype), memory_length + 1)


def filled(x: torch.Tensor, where: torch.Tensor, value: float) -> torch.Tensor:
    """`x` (S, B, ...) with the steps marked in `where` (S, B) set to `value`."""
    return x.masked_fill(where.unsqueeze(-1), value)


def gradients(model, x: torch.Tensor, call, weight_seed: int = 5):
    """(valid outputs, c, input gradient, parameter gradients) of a weighted loss on the
    outputs that `call(x)` reports as valid (and on c)."""
    x = x.detach().clone().requires_grad_(True)
    output, c, valid = call(x)
    generator = torch.Generator().manual_seed(weight_seed)
    weights = torch.randn(output.shape, generator=generator, dtype=torch.float64).to(output.dtype)
    c_weights = torch.randn(c.shape, generator=generator, dtype=torch.float64).to(c.dtype)
    selected = torch.where(valid.unsqueeze(-1), output, torch.zeros_like(output))
    loss = (selected * weights).sum() + (c * c_weights).sum()
    parameters = [p for p in model.parameters() if p.requires_grad]
    grads = torch.autograd.grad(loss, [x, *parameters])
    return selected.detach(), c.detach(), grads[0], grads[1:]


def assert_identical(with_bad, zero_padded, names) -> None:
    for label, actual, expected in zip(("output", "c", "input gradient"), with_bad[:3], zero_padded[:3]):
        assert torch.isfinite(actual).all(), f"{label} is not finite"
        assert torch.equal(actual, expected), f"{label} differs from the zero-padded run"
    for name, actual, expected in zip(names, with_bad[3], zero_padded[3]):
        assert torch.isfinite(actual).all(), f"gradient of {name} is not finite"
        assert torch.equal(actual, expected), f"gradient of {name} differs from the zero-padded run"


def parameter_names(model) -> list[str]:
    return [name for name, p in model.named_parameters() if p.requires_grad]


# ---------------------------------------------------------------------- padding
SRU_OPTIONS = {
    "1-layer": dict(num_layers=1),
    "2-layers": dict(num_layers=2),
    "bidirectional": dict(num_layers=2, bidirectional=True),
    "batch_first": dict(num_layers=2, batch_first=True),
    "projection": dict(num_layers=2, projection_size=P),
    "layer_norm": dict(num_layers=2, layer_norm=True),
    "layer_norm-after": dict(num_layers=2, layer_norm=True, normalize_after=True),
    "input-to-hidden": dict(num_layers=2, proj_input_to_hidden_first=True),
    "all": dict(num_layers=2, bidirectional=True, batch_first=True, projection_size=P, layer_norm=True),
}


@DTYPES
@NON_FINITE
@pytest.mark.parametrize("options", list(SRU_OPTIONS.values()), ids=list(SRU_OPTIONS))
def test_sru_non_finite_padding_changes_nothing(options, bad, dtype):
    torch.manual_seed(0)
    model = SRU(D_IN, H, **options).to(dtype)
    mask = padding()
    batch_first = options.get("batch_first", False)
    layout = (lambda t: t.transpose(0, 1)) if batch_first else (lambda t: t)
    x = filled(torch.randn(L, B, D_IN, dtype=dtype), mask, 0.0)
    c0 = torch.randn(model.num_layers, B, model.output_size, dtype=dtype)

    def call(x):
        output, c = model(x, c0, mask_pad=layout(mask))
        return output, c, layout(~mask)

    zero_padded = gradients(model, layout(x), call)
    with_bad = gradients(model, layout(filled(x, mask, bad)), call)
    assert_identical(with_bad, zero_padded, parameter_names(model))


SRU_CELL_OPTIONS = {
    "plain": dict(),
    "bidirectional": dict(bidirectional=True),
    "batch_first": dict(batch_first=True),
    "projection": dict(n_proj=P),
    "layer_norm": dict(layer_norm=True),
    "all": dict(bidirectional=True, batch_first=True, n_proj=P, layer_norm=True),
}


@DTYPES
@NON_FINITE
@pytest.mark.parametrize("options", list(SRU_CELL_OPTIONS.values()), ids=list(SRU_CELL_OPTIONS))
def test_sru_cell_non_finite_padding_changes_nothing(options, bad, dtype):
    torch.manual_seed(0)
    cell = SRUCell(D_IN, H, **options).to(dtype)
    mask = padding()
    layout = (lambda t: t.transpose(0, 1)) if cell.batch_first else (lambda t: t)
    x = filled(torch.randn(L, B, D_IN, dtype=dtype), mask, 0.0)
    c0 = torch.randn(B, cell.output_size, dtype=dtype)

    def call(x):
        output, c = cell(x, c0, mask_pad=layout(mask))
        return output, c, layout(~mask)

    zero_padded = gradients(cell, layout(x), call)
    with_bad = gradients(cell, layout(filled(x, mask, bad)), call)
    assert_identical(with_bad, zero_padded, parameter_names(cell))


@NON_FINITE
def test_sru_cell_one_padded_step_changes_nothing(bad):
    """A 2-D input is one step; `mask_pad` (B,) marks the rows whose step is padding."""
    torch.manual_seed(0)
    cell = SRUCell(D_IN, H, n_proj=P, layer_norm=True).double()
    mask = torch.tensor([False, True, False])
    x = torch.randn(B, D_IN, dtype=torch.float64).masked_fill(mask.unsqueeze(-1), 0.0)
    c0 = torch.randn(B, H, dtype=torch.float64)

    def call(x):
        output, c = cell(x, c0, mask_pad=mask)
        return output, c, ~mask

    zero_padded = gradients(cell, x, call)
    with_bad = gradients(cell, x.masked_fill(mask.unsqueeze(-1), bad), call)
    assert_identical(with_bad, zero_padded, parameter_names(cell))


def srupp(dtype: torch.dtype, **options) -> SRUpp:
    torch.manual_seed(0)
    options.setdefault("num_layers", 2)
    model = SRUpp(D_IN, H, P, **options).to(dtype)
    with torch.no_grad():
        for layer in model.rnn_lst:
            if layer.has_attention:
                layer.transform_module.alpha.fill_(0.7)  # it starts at 0: make the attention count
    return model


SRUPP_OPTIONS = {
    "1-layer": dict(num_layers=1),
    "2-layers": dict(),
    "2-heads": dict(num_heads=2),
    "causal": dict(causal=True),
    "left-padded-causal": dict(causal=True, left=True),
    "bidirectional": dict(bidirectional=True),
    "batch_first": dict(batch_first=True, causal=True),
    "layer_norm": dict(layer_norm=True, attn_layer_norm=False),
    "layer_norm-after": dict(layer_norm=True, normalize_after=True),
    "input-to-hidden": dict(proj_input_to_hidden_first=True),
    "attention-every-2": dict(num_layers=3, attention_every_n_layers=2),
    "memory": dict(memory=True, causal=True),
    "memory-bidirectional": dict(memory=True, bidirectional=True),
}


@DTYPES
@NON_FINITE
@pytest.mark.parametrize("options", list(SRUPP_OPTIONS.values()), ids=list(SRUPP_OPTIONS))
def test_srupp_non_finite_padding_changes_nothing(options, bad, dtype):
    """Padded steps of the input, and of the memory with `memory=True`, hold `bad`."""
    options = dict(options)
    use_causal, left, use_memory = (
        options.pop("causal", False),
        options.pop("left", False),
        options.pop("memory", False),
    )
    model = srupp(dtype, **options)
    mask = padding(left)
    memory_length = 3 if use_memory else 0
    memory = memory_mask = None
    generator = torch.Generator().manual_seed(3)
    if use_memory:
        memory_mask = torch.zeros(memory_length, B, dtype=torch.bool)
        memory_mask[:2, 1] = memory_mask[:, 2] = True
        memory = [
            filled(torch.randn(memory_length, B, width, generator=generator, dtype=torch.float64), memory_mask, 0.0)
            for width in model.layer_input_sizes()
        ]
    attn_mask = causal(L, memory_length, dtype) if use_causal else None
    layout = (lambda t: t.transpose(0, 1)) if model.batch_first else (lambda t: t)
    x = filled(torch.randn(L, B, D_IN, dtype=dtype), mask, 0.0)
    c0 = torch.randn(model.num_layers, B, model.output_size, dtype=dtype)

    def run(memory_value):
        def call(x):
            layer_memory = None
            if memory is not None:
                layer_memory = [layout(filled(entry, memory_mask, memory_value).to(dtype)) for entry in memory]
            memory_pad = None if memory_mask is None else layout(memory_mask)
            output, c, _ = model(
                x, c0, mask_pad=layout(mask), attn_mask=attn_mask, memory=layer_memory, memory_mask_pad=memory_pad
            )
            return output, c, layout(~mask)

        return call

    zero_padded = gradients(model, layout(x), run(0.0))
    with_bad = gradients(model, layout(filled(x, mask, bad)), run(bad))
    assert_identical(with_bad, zero_padded, parameter_names(model))


# ---------------------------------------------------------------------- packed documents
DOC_LENGTH, SPLIT = 10, 5  # one row: document A is [0, SPLIT), document B is [SPLIT, DOC_LENGTH)


def document_model(kind: str, dtype: torch.dtype):
    """(model, whether it is an SRUpp, whether its attention is causal) for a document test."""
    if kind.startswith("sru-"):
        torch.manual_seed(0)
        return SRU(D_IN, H, num_layers=2, bidirectional=kind == "sru-bidirectional").to(dtype), False, False
    heads = 2 if kind == "srupp-2-heads" else 1
    model = srupp(dtype, bidirectional=kind == "srupp-bidirectional", num_heads=heads, layer_norm=True)
    return model, True, kind in ("srupp-causal", "srupp-2-heads")


def run_rows(
    model, is_srupp, use_causal, x, reset=None, c0=None, memory=None, memory_reset=None, loss_steps=None, offset=0
):
    """Outputs, c and the input gradient of a weighted loss on the outputs at `loss_steps` (all
    when None). `x`'s first step is step `offset` of the packed row: its weights are that step's."""
    x = x.detach().clone().requires_grad_(True)
    if is_srupp:
        memory_length = 0 if memory is None else memory[0].shape[0]
        attn_mask = causal(x.shape[0], memory_length, x.dtype) if use_causal else None
        output, c, _ = model(x, c0, attn_mask=attn_mask, memory=memory, reset=reset, memory_reset=memory_reset)
    else:
        output, c = model(x, c0, reset=reset)
    length, rows, width = output.shape
    table = torch.randn(DOC_LENGTH, 2, width, generator=torch.Generator().manual_seed(7), dtype=torch.float64)
    weights = table[offset : offset + length, :rows].to(output.dtype)
    steps = slice(None) if loss_steps is None else loss_steps
    (grad,) = torch.autograd.grad((output[steps] * weights[steps]).sum(), [x])
    return output.detach(), c.detach(), grad


def assert_close_to(actual: torch.Tensor, expected: torch.Tensor, label: str) -> None:
    assert torch.isfinite(actual).all(), f"{label} is not finite"
    tolerance = 1e-12 if actual.dtype == torch.float64 else 1e-5
    assert relative_error(actual, expected, floor=1.0) < tolerance, label


DOCUMENT_KINDS = [
    "sru-1-direction",
    "sru-bidirectional",
    "srupp",
    "srupp-causal",
    "srupp-2-heads",
    "srupp-bidirectional",
]


@DTYPES
@NON_FINITE
@pytest.mark.parametrize("kind", DOCUMENT_KINDS)
def test_non_finite_document_never_reaches_the_next(kind, bad, dtype):
    """Row 0 packs A = [0, 5) with `bad` at step 2 and B = [5, 10); row 1 (one finite document)
    is a bystander. B equals B alone, and row 1 equals row 1 alone."""
    model, is_srupp, use_causal = document_model(kind, dtype)
    x = torch.randn(DOC_LENGTH, 2, D_IN, generator=torch.Generator().manual_seed(1), dtype=torch.float64).to(dtype)
    x[2, 0] = bad
    reset = torch.zeros(DOC_LENGTH, 2, dtype=torch.bool)
    reset[0, :] = reset[SPLIT, 0] = True
    packed = run_rows(model, is_srupp, use_causal, x, reset, loss_steps=slice(SPLIT, None))
    alone = run_rows(model, is_srupp, use_causal, x[SPLIT:, :1], offset=SPLIT)
    assert_close_to(packed[0][SPLIT:, :1], alone[0], "B's outputs")
    assert_close_to(packed[2][SPLIT:, :1], alone[2], "the input gradient of a loss on B")
    if not model.bidirectional:  # otherwise c's backward half is A's first step
        assert_close_to(packed[1][:, :1], alone[1][:, :1], "B's last c")
    assert not torch.isfinite(packed[0][SPLIT - 1, 0]).all(), "A's last step must see its NaN or Inf"
    if is_srupp and not use_causal:
        assert not torch.isfinite(packed[0][0, 0]).all(), "A's first step attends to step 2: it must see it"
    elif not model.bidirectional:
        assert torch.isfinite(packed[0][:2, 0]).all(), "A's steps before step 2 must not see it"
    bystander = run_rows(model, is_srupp, use_causal, x[:, 1:], loss_steps=slice(SPLIT, None))
    assert_close_to(packed[0][:, 1:], bystander[0], "the other row's outputs")


MEMORY_CASES = {
    # bad value at (memory step or None, call step or None); memory's own last start; reset steps of the call
    "bad-in-memory": dict(memory_bad=1, call_bad=None, memory_start=None),
    "bad-in-call": dict(memory_bad=None, call_bad=1, memory_start=None),
    "bad-in-memory-before-its-last-start": dict(memory_bad=0, call_bad=None, memory_start=2),
}


@NON_FINITE
@pytest.mark.parametrize("use_causal", [True, False], ids=["causal", "not-causal"])
@pytest.mark.parametrize("case", list(MEMORY_CASES.values()), ids=list(MEMORY_CASES))
def test_non_finite_document_never_reaches_the_next_with_memory(case, use_causal, bad):
    """The row continues document A from the memory for 4 steps, then starts B. A NaN or Inf in
    A (in the memory or in the call) never reaches B; one in a document that ended inside the
    memory (before `memory_reset`'s last start) reaches neither A nor B."""
    dtype, memory_length, split = torch.float64, 4, 4
    model = srupp(dtype, layer_norm=True)
    generator = torch.Generator().manual_seed(2)
    x = torch.randn(DOC_LENGTH, 1, D_IN, generator=generator, dtype=dtype)
    memory = [
        torch.randn(memory_length, 1, width, generator=generator, dtype=dtype) for width in model.layer_input_sizes()
    ]
    c0 = torch.randn(2, 1, H, generator=generator, dtype=dtype)
    if case["memory_bad"] is not None:
        memory = [entry.index_fill(0, torch.tensor([case["memory_bad"]]), bad) for entry in memory]
    if case["call_bad"] is not None:
        x[case["call_bad"]] = bad
    reset = torch.zeros(DOC_LENGTH, 1, dtype=torch.bool)
    reset[split] = True
    memory_reset = None
    if case["memory_start"] is not None:
        memory_reset = torch.zeros(memory_length, 1, dtype=torch.bool)
        memory_reset[case["memory_start"]] = True

    packed = run_rows(model, True, use_causal, x, reset, c0, memory, memory_reset, loss_steps=slice(split, None))
    alone = run_rows(model, True, use_causal, x[split:], offset=split)
    assert_close_to(packed[0][split:], alone[0], "B's outputs")
    assert_close_to(packed[2][split:], alone[2], "the input gradient of a loss on B")
    assert_close_to(packed[1], alone[1], "B's last c")
    if case["memory_bad"] is not None and case["memory_start"] is None:
        assert not torch.isfinite(packed[0][:split]).all(-1).any(), "every step of A attends to the memory's NaN"
    if case["memory_start"] is not None:
        a_memory = [entry[case["memory_start"] :] for entry in memory]
        a_alone = run_rows(model, True, use_causal, x[:split], None, c0, a_memory, loss_steps=slice(None))
        a_packed = run_rows(model, True, use_causal, x, reset, c0, memory, memory_reset, loss_steps=slice(None, split))
        assert_close_to(a_packed[0][:split], a_alone[0], "A's outputs")
        assert_close_to(a_packed[2][:split], a_alone[2], "the input gradient of a loss on A")
