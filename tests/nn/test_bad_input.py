"""Bad input fails early with an error that names the argument, the expectation and the value.

Layer-level checks (SRU / SRUCell) are covered case by case in tests/nn/test_sru_errors.py;
this file covers the recurrence entry points every layer, custom module and APEX patch goes
through (``sru_lightning.ops.functional``), the policy setters, and checks that a mistake in
a full model surfaces with the layer's message rather than from deep inside a kernel.
"""

from __future__ import annotations

import re

import pytest
import torch
from torch import nn

from sru_lightning.nn import SRU, SRUCell, SRUpp, set_recurrence_policy
from sru_lightning.ops import functional

L, B, D = 4, 2, 3
ENTRY_POINTS = [functional.sru_recurrence, functional.sru_recurrence_inference]
ENTRY_IDS = ["sru_recurrence", "sru_recurrence_inference"]


def valid_arguments(bidirectional=False, k=3):
    dirs = 2 if bidirectional else 1
    return dict(
        U=torch.randn(L, B, dirs * D * k),
        x=torch.randn(L, B, dirs * D),
        weight_c=torch.randn(2 * dirs * D),
        bias=torch.zeros(2 * dirs * D),
        c0=torch.zeros(B, dirs * D),
        mask_c=torch.ones(B, dirs * D),
        mask_pad=torch.zeros(L, B, dtype=torch.bool),
        bidirectional=bidirectional,
    )


def call(entry, arguments):
    arguments = dict(arguments)
    positional = [arguments.pop(name) for name in ("U", "x", "weight_c", "bias", "c0")]
    return entry(*positional, **arguments)


@pytest.mark.parametrize("entry", ENTRY_POINTS, ids=ENTRY_IDS)
def test_valid_arguments_run(entry):
    h, c_last = call(entry, valid_arguments())
    assert h.shape == (L, B, D) and c_last.shape == (B, D)


@pytest.mark.parametrize("entry", ENTRY_POINTS, ids=ENTRY_IDS)
@pytest.mark.parametrize(
    "name, value, pattern",
    [
        # wrong rank
        (
            "U",
            torch.randn(1, L, B, 3 * D),
            r"`U` must have shape \(L, B, dirs\*D\*k\) or \(B, dirs\*D\*k\), got \(1, 4, 2, 9\)",
        ),
        ("U", torch.randn(3 * D), r"`U` must have shape .* got \(9,\)"),
        # sizes that do not divide into dirs * D * k
        (
            "U",
            torch.randn(L, B, 3 * D + 1),
            r"`U` last dimension must be dirs\*D\*k = 9 \(k=3\) or 12 \(k=4\) .* got \(4, 2, 10\)",
        ),
        ("bias", torch.zeros(2 * D + 1), r"`bias` must have shape \(2\*dirs\*D,\) with dirs=1, got \(7,\)"),
        ("weight_c", torch.randn(2 * D + 2), r"`weight_c` must have shape \(6,\) or \(4, 2, 6\), got \(8,\)"),
        # mismatched sizes
        ("x", torch.randn(L, B, D + 1), r"`x` must have shape \(4, 2, 3\), got \(4, 2, 4\)"),
        ("c0", torch.zeros(D), r"`c0` must have shape \(2, 3\) \(batch, dirs\*D\), got \(3,\)"),
        ("c0", torch.zeros(B + 1, D), r"`c0` must have shape \(2, 3\) .* got \(3, 3\)"),
        ("mask_c", torch.ones(B, 2 * D), r"`mask_c` must have shape \(2, 3\) .* got \(2, 6\)"),
        (
            "mask_pad",
            torch.zeros(B, L, dtype=torch.bool),
            r"`mask_pad` must have shape \(4, 2\) \(L, B\), got \(2, 4\)",
        ),
        # integer input
        ("U", torch.ones(L, B, 3 * D, dtype=torch.int64), r"`U` must be a floating tensor, got dtype torch.int64"),
        # not a tensor
        ("bias", [0.0] * (2 * D), r"`bias` must be a torch.Tensor, got list"),
    ],
)
def test_entry_points_name_the_bad_argument(entry, name, value, pattern):
    arguments = valid_arguments()
    arguments[name] = value
    with pytest.raises((ValueError, TypeError), match=pattern):
        call(entry, arguments)


def test_bidirectional_bias_must_divide_into_two_directions():
    arguments = valid_arguments(bidirectional=True)
    arguments["bias"] = torch.zeros(10)  # 2 gates * 2 directions does not divide 10
    with pytest.raises(ValueError, match=r"`bias` must have shape \(2\*dirs\*D,\) with dirs=2, got \(10,\)"):
        call(functional.sru_recurrence, arguments)


@pytest.mark.parametrize("entry", ENTRY_POINTS, ids=ENTRY_IDS)
@pytest.mark.parametrize("name", ["x", "weight_c", "bias", "c0", "mask_c", "mask_pad"])
def test_tensors_on_another_device_than_U_are_named(entry, name):
    # The meta device stands in for a second device on a CPU-only machine. A tensor on the
    # wrong device must be refused before any kernel reads its memory: on a GPU the same
    # mistake (a CPU `c0` with a CUDA `U`) would be an illegal memory access.
    arguments = valid_arguments()
    arguments[name] = arguments[name].to("meta")
    with pytest.raises(ValueError, match=rf"`{name}` must be on .*device cpu.*got .*meta"):
        call(entry, arguments)


@pytest.mark.parametrize("entry", ENTRY_POINTS, ids=ENTRY_IDS)
def test_U_on_another_device_than_the_rest_is_named(entry):
    arguments = valid_arguments()
    arguments["U"] = arguments["U"].to("meta")
    with pytest.raises(ValueError, match=r"`(x|weight_c|bias|c0|mask_c|mask_pad)` must be on .*meta.*got .*cpu"):
        call(entry, arguments)


@pytest.mark.parametrize("entry", ENTRY_POINTS, ids=ENTRY_IDS)
@pytest.mark.parametrize("policy, error", [("fp16", ValueError), ("HALF", ValueError), (None, TypeError)])
def test_unknown_policy_is_named(entry, policy, error):
    arguments = valid_arguments()
    arguments["policy"] = policy
    with pytest.raises(error, match=r"`policy` must be .*\('auto', 'fp32', 'half'\)"):
        call(entry, arguments)


def test_unknown_policy_in_every_setter_is_named():
    pattern = r"`recurrence_policy` must be one of \('auto', 'fp32', 'half'\), got 'bf16'"
    with pytest.raises(ValueError, match="SRU: " + pattern):
        SRU(D, D, recurrence_policy="bf16")
    with pytest.raises(ValueError, match="SRUCell: " + pattern):
        SRUCell(D, D, recurrence_policy="bf16")
    model = nn.Sequential(SRU(D, D))
    with pytest.raises(ValueError, match="set_recurrence_policy: " + pattern):
        set_recurrence_policy(model, "bf16")
    assert all(cell.recurrence_policy == "auto" for cell in model[0].rnn_lst), "nothing may change on error"


def test_unknown_policy_in_the_precision_callback_is_named():
    from sru_lightning.callbacks import SRUPrecisionCallback

    with pytest.raises(ValueError, match=r"`policy` must be one of \('auto', 'fp32', 'half'\), got 'float16'"):
        SRUPrecisionCallback(policy="float16")


class Tagger(nn.Module):
    """An SRU inside a user model: the layer's own message must reach the user."""

    def __init__(self):
        super().__init__()
        self.embedding = nn.Embedding(10, 5)
        self.rnn = SRU(6, 4, num_layers=2)  # wrong: the embedding is 5 wide

    def forward(self, tokens):
        return self.rnn(self.embedding(tokens))


def test_a_mistake_inside_a_model_surfaces_with_the_layer_message():
    with pytest.raises(
        ValueError, match=re.escape("SRU: `input` last dimension must be input_size=6, got shape (4, 2, 5)")
    ):
        Tagger()(torch.zeros(L, B, dtype=torch.long))


def test_token_ids_fed_to_the_layer_are_refused_as_integer_input():
    with pytest.raises(TypeError, match=r"SRU: `input` must be a floating-point tensor .* got dtype torch.int64"):
        SRU(5, 4)(torch.zeros(L, B, 5, dtype=torch.long))


def test_c0_from_a_different_stack_shape_is_named():
    model = SRU(5, 4, num_layers=3, bidirectional=True)
    with pytest.raises(
        ValueError,
        match=r"SRU: `c0` must have shape \(3, 2, 8\) \(num_layers, batch, dirs\*hidden_size\), got \(2, 2, 8\)",
    ):
        model(torch.randn(L, B, 5), torch.zeros(2, B, 8))


TORCHSCRIPT_LAYERS = {"SRU": lambda: SRU(8, 8), "SRUCell": lambda: SRUCell(8, 8), "SRUpp": lambda: SRUpp(8, 8, 8)}


class Wrapper(nn.Module):
    """A user's model with one of the layers inside: TorchScript reaches it through the model."""

    def __init__(self, layer):
        super().__init__()
        self.linear = nn.Linear(8, 8)
        self.layer = layer

    def forward(self, x):
        return self.layer(self.linear(x))[0]


@pytest.mark.filterwarnings("ignore:`torch.jit.*` is deprecated")
@pytest.mark.parametrize("name", list(TORCHSCRIPT_LAYERS))
@pytest.mark.parametrize("how", ["torch.jit.script", "torch.jit.trace"])
@pytest.mark.parametrize("inside", [False, True], ids=["layer", "inside_a_model"])
def test_torchscript_is_refused_with_what_to_use_instead(name, how, inside):
    layer = TORCHSCRIPT_LAYERS[name]()
    module = Wrapper(layer) if inside else layer
    expected = (
        f"{name}: TorchScript ({how}) is not supported for sru_lightning layers (SRU, SRUCell, SRUpp); "
        "use torch.compile, torch.export.export, or `python -m sru_lightning export`"
    )
    with pytest.raises(RuntimeError, match=re.escape(expected)):
        if how == "torch.jit.script":
            torch.jit.script(module)
        else:
            torch.jit.trace(module, torch.randn(L, B, 8))
    # The refusal leaves nothing behind: the layer still runs eagerly.
    assert module(torch.randn(L, B, 8))[0].shape[-1] == 8
