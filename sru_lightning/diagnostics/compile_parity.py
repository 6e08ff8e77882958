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
    CompileCase("batch_first + bidirectional + mask_pad + layer_norm", 16, 8, bidirectional=True, layer_norm=True,
                batch_first=True, mask_pad=True),
    CompileCase("batch_first, projected input (k = 4)", 6, 8, num_layers=1, batch_first=True),
)


def compare_compiled_with_eager(case: CompileCase, device: str = "cpu", dtype: torch.dtype = torch.float32,
                                backend: str = "inductor", length: int = 7, batch: int = 3) -> dict[str, float]:
    """Largest difference between compiled and eager relative to eager's largest magnitude,
    per output and gradient."""
    from sru_lightning.nn import SRU

    torch.manual_seed(0)
    eager = SRU(case.input_size, case.hidden_size, num_layers=case.num_layers, bidirectional=case.bidirectional,
                layer_norm=case.layer_norm, batch_first=case.batch_first).to(device=device, dtype=dtype)
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
