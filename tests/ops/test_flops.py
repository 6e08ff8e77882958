"""FlopCounterMode (and Lightning's measure_flops and ModelSummary, built on it) count what the
SRU and SRU++ layers and the language model compute: checked against counts written here from
the layer sizes, independently of sru_lightning/ops/flops.py."""

from __future__ import annotations

import itertools
import json
import sys
from dataclasses import dataclass

import pytest
import torch
from helpers import preloaded
from lightning.fabric.utilities.throughput import measure_flops
from lightning.pytorch.utilities.model_summary import ModelSummary
from torch.utils.flop_counter import FlopCounterMode

from sru_lightning.models import SRULanguageModel
from sru_lightning.nn import SRU, LanguageNet, SRUpp
from sru_lightning.ops import (
    functional,
    op,  # noqa: F401  (loads the ops, so their formulas are registered)
)
from sru_lightning.ops.testing import make_case, run_with_grads

# The recurrence per column (time step, batch entry, direction, hidden unit), one FLOP for each
# +, -, *, exp and division of csrc/sru_step.h, a sigmoid being exp + add + divide:
#   forward  zf, zr = u + w*c_prev + b         2 * 3
#            f, r = sigmoid(zf), sigmoid(zr)   2 * 3
#            c = u0 + (c_prev - u0)*f          3
#            h = skip + ((c - skip)*r)*mask    4      -> 19
#   backward the forward's logits, gates and c (15), gate = r*mask (1), the reset logit's
#            gradient (6), grad_c_total (2), the forget logit's gradient (4), grad_u0 (1),
#            grad_skip (2), grad_c_prev (5), grad_wf and grad_wr (2), four running sums (4) -> 42
# A skip term read from x costs scale_x * x (forward) and that again plus grad_x = grad_skip *
# scale_x (backward). The backward then adds the per-batch partial sums of the bias and
# weight_c gradients over the batch.
RECURRENCE_FORWARD = 6 + 6 + 3 + 4
RECURRENCE_BACKWARD = 15 + 1 + 6 + 2 + 4 + 1 + 2 + 5 + 2 + 4


@dataclass
class Count:
    """FLOPs in all, and those of the recurrence ops alone: next to the projections'
    matmuls the recurrence is a few percent of the total, so a 1% match of the total alone
    would not notice a wrong recurrence count."""

    total: int = 0
    recurrence: int = 0

    def __add__(self, other: Count) -> Count:
        return Count(self.total + other.total, self.recurrence + other.recurrence)


RECURRENCE_OPS = ("sru_lightning.recurrence_forward", "sru_lightning.recurrence_backward")


def of(counts: dict) -> Count:
    """A Count from FlopCounterMode's counts of one module (op packet, or its name, -> FLOPs)."""
    return Count(sum(counts.values()), sum(flops for name, flops in counts.items() if str(name) in RECURRENCE_OPS))


def assert_matches(measured: Count, expected: Count) -> None:
    assert measured.total == pytest.approx(expected.total, rel=0.01)
    assert measured.recurrence == pytest.approx(expected.recurrence, rel=0.01)


def matmul(m: int, k: int, n: int) -> int:
    """(m, k) @ (k, n): one multiply and one add per term."""
    return 2 * m * k * n


def linear(rows: int, fan_in: int, fan_out: int, *, backward: bool) -> Count:
    """rows x fan_in through a (fan_in, fan_out) matrix; backward: the input's and the weight's
    gradients (every input here requires a gradient)."""
    return Count(matmul(rows, fan_in, fan_out) * (3 if backward else 1))


def recurrence(steps: int, batch: int, width: int, *, skip_from_x: bool, backward: bool) -> Count:
    """``steps`` computed (time step, batch entry) pairs of ``width`` = dirs * hidden columns."""
    flops = (RECURRENCE_FORWARD + skip_from_x) * steps * width
    if backward:
        bias_and_weight_c_sums = 2 * (2 * width) * (batch - 1)
        flops += (RECURRENCE_BACKWARD + 2 * skip_from_x) * steps * width + bias_and_weight_c_sums
    return Count(flops, flops)


def attention(length: int, batch: int, heads: int, head_dim: int, *, backward: bool) -> Count:
    """Scaled dot-product self-attention: scores q k^T and their product with v per head; the
    backward (torch's count of the flash kernels) recomputes the scores, then the gradients of
    the probabilities, v, q and k."""
    scores, weighted = matmul(length, head_dim, length), matmul(length, length, head_dim)
    per_head = scores + weighted
    if backward:
        per_head += scores + scores + 3 * weighted
    return Count(batch * heads * per_head)


def counted(forward, *, backward: bool) -> Count:
    """FlopCounterMode's count for ``forward()`` (and the backward of its output's sum)."""
    with FlopCounterMode(display=False) as counter:
        output = forward()
        if backward:
            output.sum().backward()
    assert counter.get_total_flops() == sum(counter.get_flop_counts()["Global"].values())
    return of(counter.get_flop_counts()["Global"])


# ---------------------------------------------------------------------------------- the op
OP_CASES = list(itertools.product([3, 4], [True, False], [False, True], [False, True], [False, True]))


@pytest.mark.parametrize(
    ("k", "has_skip_term", "bidirectional", "per_step_weight_c", "masks"),
    OP_CASES,
    ids=[
        f"k{k}-{'skip' if skip else 'noskip'}-{'bi' if bi else 'uni'}-{'stepw' if step else 'sharedw'}"
        f"-{'masks' if masks else 'nomask'}"
        for k, skip, bi, step, masks in OP_CASES
    ],
)
def test_op_count_follows_the_kernels_arguments(k, has_skip_term, bidirectional, per_step_weight_c, masks):
    """Exact, per op. Few steps of a wide batch (L = 2, B = 9) make the backward's reduction over
    the batch a few percent of its count; mask_pad removes whole (step, batch entry) pairs."""
    length, batch, hidden = 2, 9, 4
    tensors, kwargs = make_case(
        length,
        batch,
        hidden,
        bidirectional=bidirectional,
        k=k,
        has_skip_term=has_skip_term,
        per_step_weight_c=per_step_weight_c,
        with_mask_c=masks,
        with_mask_pad=masks,
    )
    with FlopCounterMode(display=False) as counter:
        run_with_grads(functional.sru_recurrence, tensors, kwargs)
    counts = {str(name): flops for name, flops in counter.get_flop_counts()["Global"].items()}

    width = hidden * (2 if bidirectional else 1)
    steps = length * batch - (int(kwargs["mask_pad"].sum()) if masks else 0)
    skip_from_x = has_skip_term and k == 3
    reduced = 1 if per_step_weight_c else 2  # the bias gradient, and a shared weight_c's
    assert counts == {
        "sru_lightning.recurrence_forward": (RECURRENCE_FORWARD + skip_from_x) * steps * width,
        "sru_lightning.recurrence_backward": (RECURRENCE_BACKWARD + 2 * skip_from_x) * steps * width
        + reduced * 2 * width * (batch - 1),
    }


# ---------------------------------------------------------------------------------- SRU
@dataclass
class SRUSizes:
    input_size: int
    hidden_size: int
    num_layers: int = 2
    bidirectional: bool = False
    has_skip_term: bool = True
    projection_size: int = 0
    dropout: float = 0.0

    def expected(self, length: int, batch: int, steps: int, *, backward: bool) -> Count:
        width = self.hidden_size * (2 if self.bidirectional else 1)
        rows, total = length * batch, Count()
        for index in range(self.num_layers):
            fan_in = self.input_size if index == 0 else width
            # U holds a fourth (skip) column per unit when the input cannot be added to h.
            k = 4 if self.has_skip_term and fan_in != width else 3
            if 0 < self.projection_size < min(fan_in, width):
                total += linear(rows, fan_in, self.projection_size, backward=backward)
                total += linear(rows, self.projection_size, width * k, backward=backward)
            else:
                total += linear(rows, fan_in, width * k, backward=backward)
            skip_from_x = self.has_skip_term and k == 3
            total += recurrence(steps, batch, width, skip_from_x=skip_from_x, backward=backward)
        return total


SRU_CASES = {
    "two_layers": SRUSizes(32, 32),
    "bidirectional_skip_column_then_x": SRUSizes(24, 16, bidirectional=True),
    "factorised_projection_no_skip": SRUSizes(32, 32, num_layers=1, projection_size=8, has_skip_term=False),
    "dropout_mask": SRUSizes(16, 16, dropout=0.25),
}


@pytest.mark.parametrize("backward", [False, True], ids=["forward", "forward_backward"])
@pytest.mark.parametrize("case", list(SRU_CASES))
def test_sru_count_is_the_projections_plus_the_recurrence(case, backward):
    sizes = SRU_CASES[case]
    torch.manual_seed(0)
    layer = SRU(
        sizes.input_size,
        sizes.hidden_size,
        num_layers=sizes.num_layers,
        bidirectional=sizes.bidirectional,
        has_skip_term=sizes.has_skip_term,
        projection_size=sizes.projection_size,
        dropout=sizes.dropout,
    ).train()
    length, batch = 16, 4
    x = torch.randn(length, batch, sizes.input_size, requires_grad=True)
    measured = counted(lambda: layer(x)[0], backward=backward)
    assert_matches(measured, sizes.expected(length, batch, length * batch, backward=backward))


@pytest.mark.parametrize("backward", [False, True], ids=["forward", "forward_backward"])
def test_padded_steps_run_no_recurrence(backward):
    sizes = SRUSizes(16, 8, num_layers=1, bidirectional=True)
    layer = SRU(16, 8, num_layers=1, bidirectional=True)
    length, lengths = 12, torch.tensor([12, 9, 4, 1])
    x = torch.randn(length, len(lengths), 16, requires_grad=True)
    mask_pad = torch.arange(length).unsqueeze(1) >= lengths.unsqueeze(0)  # True on padding
    measured = counted(lambda: layer(x, mask_pad=mask_pad)[0], backward=backward)
    assert_matches(measured, sizes.expected(length, len(lengths), int(lengths.sum()), backward=backward))
    every_step = sizes.expected(length, len(lengths), length * len(lengths), backward=backward)
    assert measured.recurrence < 0.7 * every_step.recurrence


def test_a_mask_pad_without_values_counts_every_step():
    """Under fake tensors (torch.compile's FLOP estimates) the padding cannot be read."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    length, batch, hidden = 6, 3, 4
    with FakeTensorMode():
        U = torch.empty(length, batch, 3 * hidden)
        x = torch.empty(length, batch, hidden)
        weight_c, bias = torch.empty(2 * hidden), torch.empty(2 * hidden)
        mask_pad = torch.zeros(length, batch, dtype=torch.bool)
        with FlopCounterMode(display=False) as counter:
            torch.ops.sru_lightning.recurrence_forward(
                U, x, weight_c, bias, None, None, 1.0, None, mask_pad, None, None, False, True, True
            )
    every_step = recurrence(length * batch, batch, hidden, skip_from_x=True, backward=False)
    assert counter.get_total_flops() == every_step.total


# ---------------------------------------------------------------------------------- SRU++
@dataclass
class SRUppSizes:
    input_size: int
    hidden_size: int
    proj_size: int
    num_layers: int = 2
    num_heads: int = 1
    attention_every_n_layers: int = 1
    bidirectional: bool = False

    def build(self) -> SRUpp:
        return SRUpp(
            self.input_size,
            self.hidden_size,
            self.proj_size,
            num_layers=self.num_layers,
            num_heads=self.num_heads,
            attention_every_n_layers=self.attention_every_n_layers,
            bidirectional=self.bidirectional,
        )

    def expected(self, length: int, batch: int, *, backward: bool) -> Count:
        width = self.hidden_size * (2 if self.bidirectional else 1)
        rows, proj, total = length * batch, self.proj_size, Count()
        for index in range(self.num_layers):
            fan_in = self.input_size if index == 0 else width
            k = 3 if fan_in == width else 4
            total += linear(rows, fan_in, proj, backward=backward)
            if (index + 1) % self.attention_every_n_layers == 0:
                # Keys and values from one (proj, 2 proj) matrix, attention, then (proj, width k).
                total += linear(rows, proj, 2 * proj, backward=backward)
                total += attention(length, batch, self.num_heads, proj // self.num_heads, backward=backward)
            total += linear(rows, proj, width * k, backward=backward)
            total += recurrence(rows, batch, width, skip_from_x=k == 3, backward=backward)
        return total


SRUPP_CASES = {
    "attention_in_every_layer": SRUppSizes(16, 16, 8, num_heads=2),
    "projected_linear_then_attention_bidirectional": SRUppSizes(
        12, 16, 8, attention_every_n_layers=2, bidirectional=True
    ),
}


def causal_mask(length: int) -> torch.Tensor:
    return torch.triu(torch.full((length, length), float("-inf")), diagonal=1)


@pytest.mark.parametrize("backward", [False, True], ids=["forward", "forward_backward"])
@pytest.mark.parametrize("case", list(SRUPP_CASES))
def test_srupp_count_adds_the_attention(case, backward):
    sizes = SRUPP_CASES[case]
    torch.manual_seed(0)
    layers = sizes.build()
    length, batch = 10, 3
    x = torch.randn(length, batch, sizes.input_size, requires_grad=True)
    measured = counted(lambda: layers(x, attn_mask=causal_mask(length))[0], backward=backward)
    assert_matches(measured, sizes.expected(length, batch, backward=backward))


# ---------------------------------------------------------------------------------- the language model
VOCAB, EMBEDDING, HIDDEN, LAYERS, PROJ = 20, 16, 16, 2, 8
LM_CASES = {
    "sru": ({}, SRUSizes(EMBEDDING, HIDDEN, num_layers=LAYERS)),
    "srupp": ({"proj_size": PROJ, "num_heads": 2}, SRUppSizes(EMBEDDING, HIDDEN, PROJ, num_layers=LAYERS, num_heads=2)),
}


def language_model(rnn: str) -> SRULanguageModel:
    torch.manual_seed(0)
    return SRULanguageModel(
        LanguageNet(
            VOCAB,
            rnn=rnn,
            embedding_dim=EMBEDDING,
            hidden_size=HIDDEN,
            num_layers=LAYERS,
            dropout=0.0,
            sru_options=LM_CASES[rnn][0],
        )
    )


def expected_language_model(rnn: str, batch: int, length: int, *, backward: bool) -> Count:
    """The embedding is a lookup (no FLOPs); the recurrent stack; the output layer (its bias
    add and the bias gradient's sum over rows are not matmuls and count zero)."""
    sizes = LM_CASES[rnn][1]
    if rnn == "sru":
        stack = sizes.expected(length, batch, length * batch, backward=backward)
    else:
        stack = sizes.expected(length, batch, backward=backward)
    return stack + linear(length * batch, HIDDEN, VOCAB, backward=backward)


@pytest.mark.parametrize("backward", [False, True], ids=["forward", "forward_backward"])
@pytest.mark.parametrize("rnn", list(LM_CASES))
def test_language_model_count_and_measure_flops_agree(rnn, backward):
    model = language_model(rnn)
    batch, length = 3, 12
    tokens = torch.randint(0, VOCAB, (batch, length))
    expected = expected_language_model(rnn, batch, length, backward=backward)

    counted_here = counted(lambda: model(tokens)[0], backward=backward)
    assert_matches(counted_here, expected)
    by_lightning = measure_flops(model, lambda: model(tokens)[0], (lambda logits: logits.sum()) if backward else None)
    assert by_lightning == counted_here.total > 0


def test_model_summary_reports_the_recurrent_layers_flops():
    model = language_model("sru")
    batch, length = 2, 8
    model.example_input_array = torch.randint(0, VOCAB, (batch, length))
    summary = ModelSummary(model, max_depth=2)
    stack = LM_CASES["sru"][1].expected(length, batch, length * batch, backward=False)
    assert_matches(of(summary.flop_counts["net.rnn"]), stack)
    assert summary.total_flops == pytest.approx(
        expected_language_model("sru", batch, length, backward=False).total, rel=0.01
    )


_FRESH_PROCESS = """
import json, torch
from lightning.fabric.utilities.throughput import measure_flops
from lightning.pytorch.utilities.model_summary import ModelSummary
from sru_lightning.models import SRULanguageModel
from sru_lightning.nn import LanguageNet
torch.manual_seed(0)
net = LanguageNet({vocab}, embedding_dim={embedding}, hidden_size={hidden}, num_layers={layers}, dropout=0.0)
model = SRULanguageModel(net)
tokens = torch.randint(0, {vocab}, ({batch}, {length}))
model.example_input_array = tokens
# The recurrence op is not loaded yet: it loads during the first forward, inside the counter.
summary = ModelSummary(model, max_depth=2)
print(json.dumps({{
    "summary_total": summary.total_flops,
    "summary_rnn": {{str(op): flops for op, flops in summary.flop_counts["net.rnn"].items()}},
    "measured": measure_flops(model, lambda: model(tokens)[0], lambda logits: logits.sum()),
}}))
"""


@pytest.mark.slow  # starts a process
def test_counters_built_before_the_extension_loads_count_the_recurrence():
    """Lightning builds its FlopCounterMode before the first forward, which is when the op (and
    with it the formula) is loaded: the counter in use learns the formula then."""
    batch, length = 2, 8
    script = _FRESH_PROCESS.format(
        vocab=VOCAB, embedding=EMBEDDING, hidden=HIDDEN, layers=LAYERS, batch=batch, length=length
    )
    result = preloaded.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    counts = json.loads(result.stdout.strip().splitlines()[-1])
    stack = LM_CASES["sru"][1].expected(length, batch, length * batch, backward=False)
    assert_matches(of(counts["summary_rnn"]), stack)
    forward = expected_language_model("sru", batch, length, backward=False)
    assert counts["summary_total"] == pytest.approx(forward.total, rel=0.01)
    forward_backward = expected_language_model("sru", batch, length, backward=True)
    assert counts["measured"] == pytest.approx(forward_backward.total, rel=0.01)
