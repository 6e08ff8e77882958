"""Does ``torch.compile(fullgraph=True)`` of an SRU compute what eager mode computes?

Outputs and every gradient (input and parameters), for the layouts that reach the custom op
with unusual strides or extra arguments: batch_first (transposed U and x), bidirectional,
mask_pad and layer norm. The tests run it on the CPU; ``gpu-check`` runs it on CUDA.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class CompileCase:
    name: str
    input_size: int
    hidden_size: int
    num_layers: int = 2
    bidirectional: bool = False
    layer_norm: bool = False
    batch_first: bool = False
    mask_pad: bool = False


CASES = (
    # input_size == dirs * hidden_size: the skip term comes from x (k = 3), the layout of the
    # batch_first bug in backward strides
    CompileCase(
        "batch_first + bidirectional + mask_pad + layer_norm",
        16,
        8,
        bidirectional=True,
        layer_norm=True,
        batch_first=True,
        mask_pad=True,
    ),
    CompileCase("batch_first, projected input (k = 4)", 6, 8, num_layers=1, batch_first=True),
)


def compare_compiled_with_eager(
    case: CompileCase,
    device: str = "cpu",
    dtype: torch.dtype = torch.float32,
    backend: str = "inductor",
    length: int = 7,
    batch: int = 3,
) -> dict[str, float]:
    """Largest difference between compiled and eager relative to eager's largest magnitude,
    per output and gradient."""
    from sru_lightning.nn import SRU

    torch.manual_seed(0)
    eager = SRU(
        case.input_size,
        case.hidden_size,
        num_layers=case.num_layers,
        bidirectional=case.bidirectional,
        layer_norm=case.layer_norm,
        batch_first=case.batch_first,
    ).to(device=device, dtype=dtype)
    compiled_module = copy.deepcopy(eager)
    compiled = torch.compile(compiled_module, fullgraph=True, backend=backend)
    shape = (batch, length) if case.batch_first else (length, batch)
    inputs = torch.randn(*shape, case.input_size, device=device, dtype=dtype)
    mask = None
    if case.mask_pad:
        lengths = torch.tensor([length, length - 3, 1][:batch] + [length] * max(0, batch - 3))
        mask = torch.arange(length)[None, :] >= lengths[:, None]  # (B, L), True on padding
        mask = (mask if case.batch_first else mask.t()).to(device)
    differences = {}
    results = []
    for module, run in ((eager, eager), (compiled_module, compiled)):
        x = inputs.detach().clone().requires_grad_()
        output, c_last = run(x, mask_pad=mask) if mask is not None else run(x)
        weights = torch.linspace(-1, 1, output.numel(), device=device, dtype=dtype).view_as(output)
        ((output * weights).sum() + c_last.square().sum()).backward()
        grads = {"grad input": x.grad}
        grads.update({f"grad {name}": p.grad for name, p in module.named_parameters() if p.grad is not None})
        results.append(({"output": output.detach(), "c_last": c_last.detach()}, grads))
    (eager_outputs, eager_grads), (compiled_outputs, compiled_grads) = results
    if set(eager_grads) != set(compiled_grads):
        missing = sorted(set(eager_grads) ^ set(compiled_grads))
        raise AssertionError(f"compiled and eager differ in which gradients exist: {missing}")
    for name, value in {**eager_outputs, **eager_grads}.items():
        other = {**compiled_outputs, **compiled_grads}[name]
        if value.numel() == 0:
            differences[name] = 0.0
            continue
        scale = max(value.float().abs().max().item(), 1e-6)
        differences[name] = (value.float() - other.float()).abs().max().item() / scale
    return differences


def compare_compiled_op_with_batch_first_inputs(device: str = "cpu", backend: str = "inductor") -> dict[str, float]:
    """The op itself under ``torch.compile`` with U and x handed over transposed (what
    batch_first does): the backward's real output strides must be the fake kernel's, which
    inductor asserts. Relative differences of the two input gradients."""
    from sru_lightning.ops import functional
    from sru_lightning.ops.testing import make_case

    (U, x, weight_c, bias, c0), kwargs = make_case(length=5, batch=3, hidden=4, dtype=torch.float32)
    weight_c, bias, c0 = weight_c.to(device), bias.to(device), c0.to(device)
    kwargs = {name: value.to(device) if isinstance(value, torch.Tensor) else value for name, value in kwargs.items()}
    U_batch_first = U.transpose(0, 1).contiguous().to(device).requires_grad_()
    x_batch_first = x.transpose(0, 1).contiguous().to(device).requires_grad_()
    weights = torch.linspace(-1, 1, 3 * 5 * 4, device=device).view(3, 5, 4)

    def loss(U_batch_first, x_batch_first):
        h, _ = functional.sru_recurrence(
            U_batch_first.transpose(0, 1), x_batch_first.transpose(0, 1), weight_c, bias, c0, **kwargs
        )
        return (h.transpose(0, 1) * weights).sum()

    import torch._inductor.config as inductor_config

    # A cached compiled graph would skip the stride check this is about.
    with inductor_config.patch(force_disable_caches=True):
        compiled = torch.autograd.grad(
            torch.compile(loss, fullgraph=True, backend=backend)(U_batch_first, x_batch_first),
            [U_batch_first, x_batch_first],
        )
    eager = torch.autograd.grad(loss(U_batch_first, x_batch_first), [U_batch_first, x_batch_first])
    return {
        name: ((got - expected).abs().max() / expected.abs().max().clamp_min(1e-6)).item()
        for name, got, expected in zip(("grad U", "grad x"), compiled, eager)
    }
