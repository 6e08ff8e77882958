"""Document boundaries inside a row (`reset`): every runtime computes each document of a packed
row as if it were alone, in both directions, with exact gradients (fp64, 1e-12 relative against
a loop over the documents one by one), and a bad `reset` is refused naming it."""

from __future__ import annotations

import pytest
import torch

from sru_lightning.nn import SRU, SRUCell
from sru_lightning.ops.functional import sru_recurrence
from sru_lightning.ops.reference import sru_recurrence_reference
from sru_lightning.ops.testing import recurrence_inputs, relative_error

EXACT = 1e-12


def document_starts(length: int, batch: int, seed: int) -> torch.Tensor:
    """(L, B) flags: random document starts, a row that starts a document at step 0, one at the
    last step, and one row of a single document."""
    generator = torch.Generator().manual_seed(seed)
    reset = torch.rand(length, batch, generator=generator) < 0.25
    reset[:, -1] = False  # one document only
    reset[0, 0] = True  # a document starting at the first step (c0 unused for that row)
    reset[length - 1, min(1, batch - 1)] = True  # a one-step document at the end
    return reset


def documents(reset: torch.Tensor, b: int) -> list[tuple[int, int]]:
    length = reset.shape[0]
    starts = [0] + [t for t in range(1, length) if reset[t, b]]
    return list(zip(starts, starts[1:] + [length]))


def one_by_one(inputs: dict, reset: torch.Tensor, bidirectional: bool, has_skip_term: bool, mask_pad=None):
    """(h, c_last) of a packed batch computed document by document with the reference, each
    document from a zero state except where it continues the row's c0: the forward half of c0
    enters the first document (unless a document starts at step 0), the backward half the last."""
    U, x, c0 = inputs["U"], inputs["x"], inputs["c0"]
    length, batch = U.shape[:2]
    width = inputs["bias"].shape[0] // 2
    half = width // 2 if bidirectional else width
    rows, last_states = [], []
    for b in range(batch):
        pieces, forward_last, backward_last = [], None, None
        spans = documents(reset, b)
        for index, (start, end) in enumerate(spans):
            c_start = torch.zeros(1, width, dtype=U.dtype)
            if start == 0 and not reset[0, b]:
                c_start = c_start + torch.cat([c0[b : b + 1, :half], torch.zeros(1, width - half, dtype=U.dtype)], 1)
            if bidirectional and index == len(spans) - 1:
                c_start = c_start + torch.cat([torch.zeros(1, half, dtype=U.dtype), c0[b : b + 1, half:]], 1)
            h, c_last = sru_recurrence_reference(
                U[start:end, b : b + 1],
                None if x is None else x[start:end, b : b + 1],
                inputs["weight_c"],
                inputs["bias"],
                c_start,
                mask_pad=None if mask_pad is None else mask_pad[start:end, b : b + 1],
                bidirectional=bidirectional,
                has_skip_term=has_skip_term,
            )
            pieces.append(h)
            if index == len(spans) - 1:
                forward_last = c_last[:, :half]
            if index == 0:
                backward_last = c_last[:, half:]
        rows.append(torch.cat(pieces, 0))
        last_states.append(torch.cat([forward_last, backward_last], 1) if bidirectional else forward_last)
    return torch.cat(rows, 1), torch.cat(last_states, 0)


def gradients(h, c_last, leaves, seed: int):
    generator = torch.Generator().manual_seed(seed)
    weights_h = torch.randn(h.shape, generator=generator, dtype=h.dtype)
    weights_c = torch.randn(c_last.shape, generator=generator, dtype=h.dtype)
    loss = (h * weights_h).sum() + (c_last * weights_c).sum()
    return torch.autograd.grad(loss, leaves)


RUNTIMES = {"kernel": sru_recurrence, "reference": sru_recurrence_reference}


@pytest.mark.parametrize("runtime", sorted(RUNTIMES))
@pytest.mark.parametrize("bidirectional", [False, True], ids=["unidirectional", "bidirectional"])
@pytest.mark.parametrize("k, has_skip_term", [(3, True), (4, True), (3, False)], ids=["x-skip", "k4", "no-skip"])
@pytest.mark.parametrize("padded", [False, True], ids=["full", "padded-tail"])
def test_packed_documents_equal_each_document_alone_with_exact_gradients(
    runtime, bidirectional, k, has_skip_term, padded
):
    length, batch, hidden = 13, 4, 5
    inputs = recurrence_inputs(length, batch, hidden, bidirectional=bidirectional, k=k, seed=3)
    if not (has_skip_term and k == 3):
        inputs["x"] = None
    reset = document_starts(length, batch, seed=4)
    mask_pad = None
    if padded:
        mask_pad = torch.zeros(length, batch, dtype=torch.bool)
        mask_pad[length - 3 :, 2] = True  # the row's last document ends in padding
    names = [name for name in ("U", "x", "weight_c", "bias", "c0") if inputs[name] is not None]
    leaves = [inputs[name].requires_grad_() for name in names]

    h, c_last = RUNTIMES[runtime](
        inputs["U"],
        inputs["x"],
        inputs["weight_c"],
        inputs["bias"],
        inputs["c0"],
        mask_pad=mask_pad,
        reset=reset,
        bidirectional=bidirectional,
        has_skip_term=has_skip_term,
    )
    h_alone, c_alone = one_by_one(inputs, reset, bidirectional, has_skip_term, mask_pad)
    assert relative_error(h.detach(), h_alone.detach()) <= EXACT
    assert relative_error(c_last.detach(), c_alone.detach()) <= EXACT
    for name, got, expected in zip(
        names, gradients(h, c_last, leaves, seed=5), gradients(h_alone, c_alone, leaves, seed=5)
    ):
        assert relative_error(got, expected) <= EXACT, name


def starts_and_ends_one_by_one(inputs, c_starts, reset, bidirectional, has_skip_term, mask_pad):
    """Each document of a packed batch run alone with the reference from its own initial state
    (read from `c_starts` where the packed call reads it: the forward half at the document's
    first step, the backward half at its last; the row's c0 where no flag restarts it), giving
    h and each document's final state in each direction (the forward half at its last step,
    the backward half at its first)."""
    U, x, c0 = inputs["U"], inputs["x"], inputs["c0"]
    length, batch = U.shape[:2]
    width = inputs["bias"].shape[0] // 2
    half = width // 2 if bidirectional else width
    rows, finals = [], []
    for b in range(batch):
        pieces = []
        for start, end in documents(reset, b):
            forward_start = c_starts[start, b, :half] if reset[start, b] else c0[b, :half]
            start_state = [forward_start]
            if bidirectional:
                start_state.append(c_starts[end - 1, b, half:] if end < length else c0[b, half:])
            h, c_last = sru_recurrence_reference(
                U[start:end, b : b + 1],
                None if x is None else x[start:end, b : b + 1],
                inputs["weight_c"],
                inputs["bias"],
                torch.cat(start_state).unsqueeze(0),
                mask_pad=None if mask_pad is None else mask_pad[start:end, b : b + 1],
                bidirectional=bidirectional,
                has_skip_term=has_skip_term,
            )
            pieces.append(h)
            finals.append(c_last[0])
        rows.append(torch.cat(pieces, 0))
    return torch.cat(rows, 1), torch.stack(finals)


def final_states_from_steps(c_all, reset, bidirectional):
    """Each document's final state gathered from the packed call's per-step states: the forward
    half at the document's last step, the backward half at its first."""
    width = c_all.shape[-1]
    half = width // 2 if bidirectional else width
    finals = []
    for b in range(c_all.shape[1]):
        for start, end in documents(reset, b):
            state = [c_all[end - 1, b, :half]]
            if bidirectional:
                state.append(c_all[start, b, half:])
            finals.append(torch.cat(state))
    return torch.stack(finals)


@pytest.mark.parametrize("runtime", sorted(RUNTIMES))
@pytest.mark.parametrize("bidirectional", [False, True], ids=["unidirectional", "bidirectional"])
@pytest.mark.parametrize("padded", [False, True], ids=["full", "padded-tail"])
def test_documents_start_from_their_own_states_and_give_their_final_states_with_exact_gradients(
    runtime, bidirectional, padded
):
    length, batch, hidden = 13, 4, 5
    inputs = recurrence_inputs(length, batch, hidden, bidirectional=bidirectional, seed=21)
    reset = document_starts(length, batch, seed=22)
    width = inputs["bias"].shape[0] // 2
    c_starts = torch.randn(length, batch, width, dtype=torch.float64, generator=torch.Generator().manual_seed(23))
    mask_pad = None
    if padded:
        mask_pad = torch.zeros(length, batch, dtype=torch.bool)
        mask_pad[length - 3 :, 2] = True
        reset[length - 2, 2] = True  # a document that starts inside the padding
    names = ("U", "x", "weight_c", "bias", "c0")
    leaves = [inputs[name].requires_grad_() for name in names] + [c_starts.requires_grad_()]

    h, _, c_all = RUNTIMES[runtime](
        *(inputs[name] for name in names),
        mask_pad=mask_pad,
        reset=reset,
        c_starts=c_starts,
        bidirectional=bidirectional,
        return_states=True,
    )
    finals = final_states_from_steps(c_all, reset, bidirectional)
    h_alone, finals_alone = starts_and_ends_one_by_one(inputs, c_starts, reset, bidirectional, True, mask_pad)
    assert relative_error(h.detach(), h_alone.detach()) <= EXACT
    assert relative_error(finals.detach(), finals_alone.detach()) <= EXACT
    got = gradients(h, finals, leaves, seed=24)
    expected = gradients(h_alone, finals_alone, leaves, seed=24)
    for name, got_grad, expected_grad in zip([*names, "c_starts"], got, expected):
        assert relative_error(got_grad, expected_grad) <= EXACT, name
    # c_starts is read only where a document starts: nowhere else does it get a gradient
    (_, _, _, _, _, grad_starts) = got
    read = reset.clone()
    if bidirectional:
        read = torch.stack([reset, torch.cat([reset[1:], torch.zeros_like(reset[:1])])], -1)
        read = read.repeat_interleave(hidden, -1)
    else:
        read = read.unsqueeze(-1).expand(-1, -1, width)
    assert torch.all(grad_starts[~read] == 0) and torch.count_nonzero(grad_starts[read]) > 0


def test_gradcheck_of_document_start_states_and_per_step_states():
    inputs = recurrence_inputs(5, 2, 3, bidirectional=True, seed=25)
    reset = torch.tensor([[True, True], [False, False], [True, False], [False, True], [True, False]])
    c_starts = torch.randn(5, 2, 6, dtype=torch.float64)
    tensors = [inputs[name].requires_grad_() for name in ("U", "x", "weight_c", "bias", "c0")]

    def run(U, x, weight_c, bias, c0, c_starts):
        h, c_last, c_all = sru_recurrence(
            U, x, weight_c, bias, c0, reset=reset, c_starts=c_starts, bidirectional=True, return_states=True
        )
        return h, c_last, c_all

    assert torch.autograd.gradcheck(run, [*tensors, c_starts.requires_grad_()])
    assert torch.autograd.gradgradcheck(
        run, [*tensors, c_starts], fast_mode=True
    )  # random projections of the Jacobians


@pytest.mark.parametrize(
    "c_starts, reset, match",
    [
        (torch.zeros(6, 3, 4), None, r"`c_starts` gives the state each document starts from, so it needs `reset`"),
        (torch.zeros(6, 3, 5), torch.zeros(6, 3, dtype=torch.bool), r"`c_starts` must have shape \(6, 3, 4\)"),
    ],
)
def test_bad_document_start_states_are_refused_naming_them(c_starts, reset, match):
    inputs = recurrence_inputs(6, 3, 4, seed=9, dtype=torch.float32)
    with pytest.raises(ValueError, match=match):
        sru_recurrence(inputs["U"], inputs["x"], inputs["weight_c"], inputs["bias"], reset=reset, c_starts=c_starts)


def test_a_document_starting_at_step_zero_gives_c0_no_gradient_and_no_flags_change_nothing():
    inputs = recurrence_inputs(6, 3, 4, seed=1)
    c0 = inputs["c0"].requires_grad_()
    reset = torch.zeros(6, 3, dtype=torch.bool)
    reset[0, 1] = True
    h, c_last = sru_recurrence(inputs["U"], inputs["x"], inputs["weight_c"], inputs["bias"], c0, reset=reset)
    (grad_c0,) = torch.autograd.grad(h.sum() + c_last.sum(), [c0])
    assert torch.all(grad_c0[1] == 0) and torch.all(grad_c0[0] != 0)
    plain = sru_recurrence(inputs["U"], inputs["x"], inputs["weight_c"], inputs["bias"], c0)
    no_starts = sru_recurrence(
        inputs["U"], inputs["x"], inputs["weight_c"], inputs["bias"], c0, reset=torch.zeros(6, 3, dtype=torch.bool)
    )
    assert all(torch.equal(a, b) for a, b in zip(plain, no_starts))


def test_gradcheck_through_the_kernel_with_documents():
    inputs = recurrence_inputs(5, 2, 3, bidirectional=True, seed=2)
    reset = torch.tensor([[False, True], [False, False], [True, False], [False, True], [True, False]])
    tensors = [inputs[name].requires_grad_() for name in ("U", "x", "weight_c", "bias", "c0")]

    def run(U, x, weight_c, bias, c0):
        return sru_recurrence(U, x, weight_c, bias, c0, reset=reset, bidirectional=True)

    assert torch.autograd.gradcheck(run, tensors)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_storage_with_documents_stays_within_its_rounding_of_float32(dtype):
    inputs = recurrence_inputs(12, 3, 8, seed=6, dtype=torch.float32)
    reset = document_starts(12, 3, seed=7)
    args = (inputs["U"], inputs["x"], inputs["weight_c"], inputs["bias"], inputs["c0"])
    h32, _ = sru_recurrence(*args, reset=reset)
    h_half, _ = sru_recurrence(*(t.to(dtype) for t in args), reset=reset)
    # a few roundings to the storage dtype per step, not an accumulated drift across documents
    assert relative_error(h_half.float(), h32) <= 8 * torch.finfo(dtype).eps


def test_one_step_takes_a_flag_per_batch_entry():
    inputs = recurrence_inputs(1, 3, 4, seed=8, single_step=True)
    reset = torch.tensor([True, False, True])
    h, _ = sru_recurrence(inputs["U"], inputs["x"], inputs["weight_c"], inputs["bias"], inputs["c0"], reset=reset)
    h_zero, _ = sru_recurrence(inputs["U"], inputs["x"], inputs["weight_c"], inputs["bias"], None)
    h_c0, _ = sru_recurrence(inputs["U"], inputs["x"], inputs["weight_c"], inputs["bias"], inputs["c0"])
    assert torch.equal(h[0], h_zero[0]) and torch.equal(h[2], h_zero[2]) and torch.equal(h[1], h_c0[1])


@pytest.mark.parametrize(
    "reset, error, match",
    [
        (torch.zeros(6, 3), TypeError, r"`reset` must be a bool tensor .*got torch.float32"),
        (torch.zeros(6, 2, dtype=torch.bool), ValueError, r"`reset` must have shape \(6, 3\) \(L, B\), got \(6, 2\)"),
        ([True] * 3, TypeError, r"`reset` must be a torch.Tensor, got list"),
    ],
)
def test_a_bad_reset_is_refused_naming_it(reset, error, match):
    inputs = recurrence_inputs(6, 3, 4, seed=9)
    with pytest.raises(error, match=match):
        sru_recurrence(inputs["U"], inputs["x"], inputs["weight_c"], inputs["bias"], reset=reset)


def test_the_kernel_refuses_a_bad_reset_naming_it():
    inputs = recurrence_inputs(6, 3, 4, seed=9)
    values = dict(
        U=inputs["U"],
        x=inputs["x"],
        weight_c=inputs["weight_c"],
        bias=inputs["bias"],
        c0=None,
        scale_x=None,
        scale_x_value=1.0,
        mask_c=None,
        mask_pad=None,
        reset=torch.zeros(5, 3, dtype=torch.bool),
        c_starts=None,
        bidirectional=False,
        has_skip_term=True,
        store_c=True,
    )
    with pytest.raises(ValueError, match=r"`reset` must have shape \(6, 3\), got \[5, 3\]"):
        torch.ops.sru_lightning.recurrence_forward(**values)


@pytest.mark.parametrize("batch_first", [False, True])
@pytest.mark.parametrize("bidirectional", [False, True])
def test_an_sru_stack_runs_each_document_alone(batch_first, bidirectional):
    torch.manual_seed(0)
    layer = SRU(6, 5, num_layers=2, bidirectional=bidirectional, batch_first=batch_first).double()
    x = torch.randn(9, 3, 6, dtype=torch.float64)
    reset = document_starts(9, 3, seed=11)
    reset[0, :] = True  # each row starts a document, so every document runs from a zero state
    packed_input = x.transpose(0, 1) if batch_first else x
    output, _ = layer(packed_input, reset=reset.t() if batch_first else reset)
    output = output.transpose(0, 1) if batch_first else output
    for b in range(3):
        for start, end in documents(reset, b):
            alone = x[start:end, b : b + 1]
            expected, _ = layer(alone.transpose(0, 1) if batch_first else alone)
            expected = expected.transpose(0, 1) if batch_first else expected
            assert relative_error(output[start:end, b : b + 1].detach(), expected.detach()) <= EXACT


def test_compiled_layer_with_documents_equals_eager():
    torch.manual_seed(0)
    layer = SRU(4, 4, num_layers=2)
    x = torch.randn(7, 2, 4)
    reset = document_starts(7, 2, seed=12)
    eager, c_eager = layer(x, reset=reset)
    compiled, c_compiled = torch.compile(layer, fullgraph=True, backend="aot_eager")(x, reset=reset)
    assert torch.equal(eager, compiled) and torch.equal(c_eager, c_compiled)


@pytest.mark.parametrize("batch_first", [False, True])
def test_a_layer_takes_document_start_states_and_returns_every_steps_state(batch_first):
    torch.manual_seed(0)
    cell = SRUCell(6, 5, bidirectional=True, batch_first=batch_first).double()
    length, batch, width = 9, 3, cell.output_size
    x = torch.randn(length, batch, 6, dtype=torch.float64)
    reset = document_starts(length, batch, seed=31)
    c_starts = torch.randn(length, batch, width, dtype=torch.float64, requires_grad=True)

    def laid(t):
        return t.transpose(0, 1) if batch_first else t

    h, c_last, c_all = cell(laid(x), reset=laid(reset), c_starts=laid(c_starts), return_states=True)
    h, c_all = laid(h), laid(c_all)
    # the layer is its projection followed by the op: the same call through the functional entry
    U = x @ cell.weight
    h_op, c_op, c_all_op = sru_recurrence(
        U, x, cell.weight_c, cell.bias, reset=reset, c_starts=c_starts, bidirectional=True, return_states=True
    )
    assert torch.equal(h, h_op) and torch.equal(c_last, c_op) and torch.equal(c_all, c_all_op)
    finals = final_states_from_steps(c_all, reset, bidirectional=True)
    (grad_starts,) = torch.autograd.grad(finals.square().sum(), [c_starts])
    (grad_starts_op,) = torch.autograd.grad(final_states_from_steps(c_all_op, reset, True).square().sum(), [c_starts])
    assert torch.equal(grad_starts, grad_starts_op) and torch.count_nonzero(grad_starts) > 0


def test_compiled_layer_with_document_start_states_equals_eager():
    torch.manual_seed(0)
    cell = SRUCell(4, 4)
    x = torch.randn(7, 2, 4)
    reset = document_starts(7, 2, seed=32)
    c_starts = torch.randn(7, 2, 4, requires_grad=True)

    def run(layer):
        h, c_last, c_all = layer(x, reset=reset, c_starts=c_starts, return_states=True)
        loss = h.sum() + c_all.square().sum()
        return (h, c_last, c_all, *torch.autograd.grad(loss, [c_starts, cell.weight]))

    eager = run(cell)
    compiled = run(torch.compile(cell, fullgraph=True, backend="aot_eager"))
    assert all(torch.equal(a, b) for a, b in zip(eager, compiled))


@pytest.mark.slow  # compiles C++ (AOTInductor)
def test_torch_export_and_aotinductor_keep_the_documents_apart(tmp_path):
    class Documents(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.rnn = SRU(4, 6, num_layers=2, bidirectional=True)

        def forward(self, x, reset):
            return self.rnn(x, reset=reset)

    torch.manual_seed(0)
    module = Documents().eval()
    x = torch.randn(9, 3, 4)
    reset = document_starts(9, 3, seed=13)
    length, batch = torch.export.Dim("length", min=2, max=512), torch.export.Dim("batch", min=1, max=64)
    with torch.no_grad():
        expected = module(x, reset)
        program = torch.export.export(module, (x, reset), dynamic_shapes=({0: length, 1: batch}, {0: length, 1: batch}))
        exported = program.module()(x, reset)
        path = torch._inductor.aoti_compile_and_package(program, package_path=str(tmp_path / "documents.pt2"))
        compiled = torch._inductor.aoti_load_package(path)(x, reset)
    for got in (exported, compiled):
        assert relative_error(got[0], expected[0]) <= 1e-6 and relative_error(got[1], expected[1]) <= 1e-6


def test_the_documented_example_runs_as_written():
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "docs" / "kernels.md").read_text()
    section = text.split("### Documents packed in a row", 1)[1].split("\n## ", 1)[0]
    blocks = [block.split("```", 1)[0] for block in section.split("```python\n")[1:]]
    assert len(blocks) == 2, "the section's two examples: packed rows, and documents' own states"
    namespace: dict = {}
    for code in blocks:
        exec(compile(code, "docs/kernels.md", "exec"), namespace)  # their own asserts check the claims
    assert namespace["output"].shape == (2, 10, 16) and namespace["c_all"].shape == (10, 2, 16)
