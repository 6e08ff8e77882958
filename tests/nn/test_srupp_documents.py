"""SRU++ over packed documents (`reset`): a row of documents laid end to end computes, in every
layer's recurrence and attention, what each document computes alone (fp64, 1e-12 relative,
outputs and gradients), with and without memory; attention never crosses a document start."""

from __future__ import annotations

import pytest
import torch

from sru_lightning.nn import SRUpp
from sru_lightning.ops.testing import relative_error

EXACT = 1e-12
D_IN, H, P = 6, 8, 4
# Row b's documents as lengths; every row fills L steps. Row 0 starts a document at step 0,
# row 1 continues the document in progress (its c0 and memory), row 2 holds one document.
L = 11
ROWS = [[4, 1, 6], [3, 5, 3], [11]]
STARTS_AT_ZERO = [True, False, False]


def model_under_test(num_layers: int = 2) -> SRUpp:
    torch.manual_seed(0)
    model = SRUpp(D_IN, H, P, num_layers=num_layers, num_heads=2, layer_norm=True).double().eval()
    with torch.no_grad():
        for layer in model.rnn_lst:
            if layer.has_attention:
                layer.transform_module.alpha.fill_(0.7)  # it starts at 0: make the attention count
    return model


def causal(length: int, memory_length: int = 0) -> torch.Tensor:
    mask = torch.full((length, memory_length + length), float("-inf"), dtype=torch.float64)
    return torch.triu(mask, diagonal=memory_length + 1)


def packed_flags() -> torch.Tensor:
    reset = torch.zeros(L, len(ROWS), dtype=torch.bool)
    for b, lengths in enumerate(ROWS):
        assert sum(lengths) == L
        starts = torch.cumsum(torch.tensor([0, *lengths[:-1]]), 0)
        reset[starts, b] = True
        reset[0, b] = STARTS_AT_ZERO[b]
    return reset


def spans(b: int) -> list[tuple[int, int]]:
    ends = torch.cumsum(torch.tensor(ROWS[b]), 0).tolist()
    return list(zip([0, *ends[:-1]], ends))


def run_packed(model, x, c0, weights, memory=None, memory_reset=None):
    x = x.clone().requires_grad_(True)
    memory_length = 0 if memory is None else memory[0].shape[0]
    output, c, _ = model(
        x, c0, attn_mask=causal(L, memory_length), memory=memory, reset=packed_flags(), memory_reset=memory_reset
    )
    grads = torch.autograd.grad((output * weights).sum() + c.pow(2).sum(), [x, *model.parameters()])
    return output.detach(), c.detach(), grads[0], grads[1:]


def run_one_by_one(model, x, c0, weights, memory=None, memory_starts=None):
    """Each document alone: zero state and no memory, except the document a row starts the call
    in, which continues c0 and the memory's last document (from `memory_starts[b]` on)."""
    x = x.clone().requires_grad_(True)
    outputs = torch.zeros(L, len(ROWS), H, dtype=torch.float64)
    last_c = torch.zeros_like(c0)
    total = 0.0
    for b in range(len(ROWS)):
        for index, (start, end) in enumerate(spans(b)):
            continues = index == 0 and not STARTS_AT_ZERO[b]
            doc_c0 = c0[:, b : b + 1] if continues else None
            doc_memory = None
            if continues and memory is not None:
                doc_memory = [entry[memory_starts[b] :, b : b + 1] for entry in memory]
            memory_length = 0 if doc_memory is None else doc_memory[0].shape[0]
            output, c, _ = model(
                x[start:end, b : b + 1], doc_c0, attn_mask=causal(end - start, memory_length), memory=doc_memory
            )
            outputs[start:end, b : b + 1] = output.detach()
            total = total + (output * weights[start:end, b : b + 1]).sum()
            if end == L:
                last_c[:, b : b + 1] = c.detach()
                total = total + c.pow(2).sum()
    grads = torch.autograd.grad(total, [x, *model.parameters()])
    return outputs, last_c, grads[0], grads[1:]


def check_equal(packed, alone):
    for name, actual, expected in zip(("output", "c", "input gradient"), packed[:3], alone[:3]):
        assert relative_error(actual, expected, floor=1e-12) < EXACT, name
    for index, (actual, expected) in enumerate(zip(packed[3], alone[3])):
        assert relative_error(actual, expected, floor=1e-12) < EXACT, f"parameter gradient {index}"


def inputs(seed: int = 1):
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(L, len(ROWS), D_IN, generator=generator, dtype=torch.float64)
    c0 = torch.randn(2, len(ROWS), H, generator=generator, dtype=torch.float64)
    weights = torch.randn(L, len(ROWS), H, generator=generator, dtype=torch.float64)
    return x, c0, weights


def test_packed_rows_equal_documents_run_separately():
    model = model_under_test()
    x, c0, weights = inputs()
    check_equal(run_packed(model, x, c0, weights), run_one_by_one(model, x, c0, weights))


@pytest.mark.parametrize("with_memory_starts", [False, True], ids=["memory-one-document", "memory-with-starts"])
def test_packed_rows_with_memory_equal_documents_run_separately(with_memory_starts):
    model = model_under_test()
    x, c0, weights = inputs(2)
    memory_length = 5
    generator = torch.Generator().manual_seed(3)
    memory = [
        torch.randn(memory_length, len(ROWS), width, generator=generator, dtype=torch.float64) for width in (D_IN, H)
    ]
    memory_reset, memory_starts = None, [0, 0, 0]
    if with_memory_starts:
        # Row 1's memory ends with a document started at memory step 3; row 2's at step 1.
        memory_reset = torch.zeros(memory_length, len(ROWS), dtype=torch.bool)
        memory_reset[3, 1] = memory_reset[1, 2] = memory_reset[0, 0] = True
        memory_starts = [0, 3, 1]
    packed = run_packed(model, x, c0, weights, memory, memory_reset)
    check_equal(packed, run_one_by_one(model, x, c0, weights, memory, memory_starts))


def test_without_reset_attention_crosses_documents():
    """The comparison can fail: the same packed rows without `reset` differ from the documents."""
    model = model_under_test()
    x, c0, weights = inputs()
    output, _, _ = model(x, c0, attn_mask=causal(L))
    alone = run_one_by_one(model, x, c0, weights)[0]
    assert relative_error(output.detach(), alone, floor=1e-12) > 1e-3


def test_attention_alone_blocks_other_documents():
    """Only the attention's mask (no recurrence): a query's output does not move when another
    document's inputs change."""
    model = model_under_test(num_layers=1)
    attention = model.rnn_lst[0].transform_module
    x, _, _ = inputs()
    reset = packed_flags()
    changed = x.clone()
    changed[:4, 0] += 1.0  # row 0's first document
    before = attention(x, attn_mask=causal(L), reset=reset)
    after = attention(changed, attn_mask=causal(L), reset=reset)
    assert torch.equal(before[4:, 0], after[4:, 0]) and not torch.equal(before[:4, 0], after[:4, 0])
    assert torch.equal(before[:, 1:], after[:, 1:])


def test_reset_is_checked_and_refused_with_packed_sequences():
    model = model_under_test()
    x, _, _ = inputs()
    with pytest.raises(ValueError, match="reset"):
        model(x, reset=torch.zeros(L + 1, len(ROWS), dtype=torch.bool))
    with pytest.raises(ValueError, match="memory_reset"):
        model(x, memory_reset=torch.zeros(2, len(ROWS), dtype=torch.bool))
    packed = torch.nn.utils.rnn.pack_padded_sequence(x, [L] * len(ROWS))
    with pytest.raises(ValueError, match="PackedSequence"):
        model(packed, reset=torch.zeros(L, len(ROWS), dtype=torch.bool))
