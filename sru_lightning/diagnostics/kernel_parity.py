"""Do a device's recurrence kernels compute what the CPU kernels and the reference compute?

The GPU check (:mod:`sru_lightning.diagnostics.gpu_check`) runs this with the CUDA kernels; on CPU the
same code compares the CPU kernel with itself and with the float64 reference, which is how
its own tests run it. Every variant of the call (k = 3/4, bidirectional, masks, per-step
weight_c, scale_x, one step, ...) in each storage dtype, forward, backward and inference.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

import torch

from sru_lightning.ops.testing import recurrence_inputs, relative_error

STORAGE_DTYPES = {"fp32": torch.float32, "fp64": torch.float64, "fp16": torch.float16, "bf16": torch.bfloat16}
# Largest allowed error, relative to the largest magnitude of the float64 reference.
TOLERANCE = {"fp64": 1e-10, "fp32": 2e-5, "fp16": 5e-3, "bf16": 3e-2}


@dataclass
class KernelComparison:
    dtype_name: str
    variants: int
    worst_versus_cpu: float = 0.0
    worst_versus_reference: float = 0.0
    failures: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return not self.failures

    def describe(self) -> str:
        return (
            f"{self.variants} variants x fwd/bwd/inference; max rel err vs CPU {self.worst_versus_cpu:.1e}, "
            f"vs fp64 reference {self.worst_versus_reference:.1e} (tol {TOLERANCE[self.dtype_name]:.0e})"
        )


@dataclass
class Variant:
    """One way of calling the recurrence; the kernels must agree on every one."""

    name: str
    k: int = 3
    bidirectional: bool = False
    has_skip_term: bool = True
    c0: bool = True
    mask_c: bool = False
    mask_pad: bool = False
    documents: bool = False  # document starts inside the rows (reset)
    document_states: bool = False  # documents start from c_starts; every step's state is an output
    per_step_weight_c: bool = False
    scale_x: str | None = None  # None, "float" or "tensor"
    single_step: bool = False
    shape: tuple = (17, 5, 37)  # L, B, D: odd sizes reach the kernels' edge handling


VARIANTS = (
    Variant("basic"),
    Variant("k4 (skip from U)", k=4),
    Variant("no skip term", has_skip_term=False),
    Variant("no c0", c0=False),
    Variant("bidirectional", bidirectional=True),
    Variant("bidirectional k4 + mask_pad", k=4, bidirectional=True, mask_pad=True),
    Variant("mask_pad", mask_pad=True),
    Variant("mask_c (dropout)", mask_c=True),
    Variant("per-step weight_c", per_step_weight_c=True),
    Variant("scale_x float", scale_x="float"),
    Variant("scale_x tensor", scale_x="tensor"),
    Variant("single step", single_step=True),
    # 600 columns: two full blocks of 256 threads and a partial third (a GPU block size).
    Variant("documents", documents=True),
    Variant("bidirectional documents + mask_pad", bidirectional=True, documents=True, mask_pad=True),
    Variant(
        "documents from given states, per-step states out",
        bidirectional=True,
        documents=True,
        document_states=True,
        mask_pad=True,
    ),
    Variant("several blocks, last partial", bidirectional=True, mask_pad=True, shape=(9, 3, 100)),
    Variant("large", shape=(64, 32, 256)),
)


def make_inputs(variant: Variant, dtype: torch.dtype, seed: int = 0) -> dict:
    """CPU inputs for one variant, rounded to ``dtype`` (the storage dtype under test)."""
    length, batch, hidden = variant.shape
    inputs = recurrence_inputs(
        length,
        batch,
        hidden,
        bidirectional=variant.bidirectional,
        k=variant.k,
        single_step=variant.single_step,
        with_x=variant.k == 3 and variant.has_skip_term,
        per_step_weight_c=variant.per_step_weight_c,
        with_c0=variant.c0,
        weight_c_scale=0.5,
        bias_scale=0.1,
        mask_c_drop=0.2 if variant.mask_c else None,
        mask_pad="random" if variant.mask_pad else None,
        draw_dtype=torch.float32,
        dtype=dtype,
        seed=seed,
    )
    inputs["scale_x"] = {None: None, "float": 0.7, "tensor": torch.tensor([0.7], dtype=dtype)}[variant.scale_x]
    inputs["reset"] = None
    if variant.documents:
        generator = torch.Generator().manual_seed(seed + 1)
        lead = (batch,) if variant.single_step else (length, batch)
        inputs["reset"] = torch.rand(lead, generator=generator) < 0.2
    inputs["c_starts"] = None
    if variant.document_states:
        generator = torch.Generator().manual_seed(seed + 2)
        width = inputs["bias"].shape[0] // 2
        inputs["c_starts"] = torch.randn(length, batch, width, generator=generator).to(dtype)
    return inputs


def run_recurrence(inputs: dict, variant: Variant, device: str, grad_seed: int = 1, reference: bool = False) -> dict:
    """Forward, backward and inference outputs of one call, as float64 CPU tensors."""
    from sru_lightning.ops import functional, sru_recurrence_reference

    moved = {name: (value.to(device) if isinstance(value, torch.Tensor) else value) for name, value in inputs.items()}
    if reference:
        moved = {
            name: (value.double() if isinstance(value, torch.Tensor) and value.is_floating_point() else value)
            for name, value in moved.items()
        }
    differentiable = [name for name in ("U", "x", "weight_c", "bias", "c0", "c_starts") if moved[name] is not None]
    for name in differentiable:
        moved[name] = moved[name].detach().requires_grad_(True)
    options = dict(
        scale_x=moved["scale_x"],
        mask_c=moved["mask_c"],
        mask_pad=moved["mask_pad"],
        reset=moved["reset"],
        c_starts=moved["c_starts"],
        bidirectional=variant.bidirectional,
        has_skip_term=variant.has_skip_term,
    )
    positional = [moved[name] for name in ("U", "x", "weight_c", "bias", "c0")]
    states = dict(return_states=True) if variant.document_states else {}
    if reference:
        results = sru_recurrence_reference(*positional, compute_dtype=torch.float64, **options, **states)
    else:
        results = functional.sru_recurrence(*positional, **options, **states)
    h, c_last = results[:2]
    generator = torch.Generator().manual_seed(grad_seed)
    grads = [torch.randn(t.shape, generator=generator).to(device=h.device, dtype=h.dtype) for t in results]
    torch.autograd.backward(list(results), grads)
    outputs = {"h": h, "c_last": c_last}
    if variant.document_states:
        outputs["c_all"] = results[2]
    outputs.update({f"grad_{name}": moved[name].grad for name in differentiable})
    if not reference:
        with torch.no_grad():
            h_inference, c_inference = functional.sru_recurrence_inference(
                *[None if t is None else t.detach() for t in positional], **options
            )
        outputs.update(h_inference=h_inference, c_last_inference=c_inference)
    return {name: value.detach().double().cpu() for name, value in outputs.items() if value is not None}


def compare_outputs(actual: dict, expected: dict) -> dict[str, float]:
    """Relative error per output present in ``expected`` (inference outputs against the forward)."""
    errors = {}
    for name, value in actual.items():
        reference_name = name.replace("_inference", "")
        if reference_name in expected:
            errors[name] = relative_error(value, expected[reference_name])
    return errors


def compare_kernels(
    dtype_name: str, variants=VARIANTS, device: str = "cuda", kernels_under_test=contextlib.nullcontext
) -> KernelComparison:
    """``device`` kernel vs the CPU kernel and vs the float64 reference, every variant, one dtype.

    ``kernels_under_test()`` is entered around the calls on ``device`` only: a non-default
    CUDA stream, or the CPU emulation of the CUDA kernels (with ``device="cpu"``).
    """
    from sru_lightning.ops import trace_storage_dtypes

    dtype = STORAGE_DTYPES[dtype_name]
    device_type = torch.device(device).type
    result = KernelComparison(dtype_name, len(variants))
    with trace_storage_dtypes() as calls:
        for index, variant in enumerate(variants):
            inputs = make_inputs(variant, dtype, seed=index)
            with kernels_under_test():
                on_device = run_recurrence(inputs, variant, device)
            versus_cpu = compare_outputs(on_device, run_recurrence(inputs, variant, "cpu"))
            versus_reference = compare_outputs(on_device, run_recurrence(inputs, variant, "cpu", reference=True))
            result.worst_versus_cpu = max(result.worst_versus_cpu, *versus_cpu.values())
            result.worst_versus_reference = max(result.worst_versus_reference, *versus_reference.values())
            for against, errors in (("CPU", versus_cpu), ("reference", versus_reference)):
                bad = {name: error for name, error in errors.items() if not error <= TOLERANCE[dtype_name]}
                if bad:
                    result.failures.append(
                        f"{variant.name} vs {against}: " + ", ".join(f"{n} {e:.1e}" for n, e in bad.items())
                    )
    backends = {call.backend for call in calls if call.device_type == device_type}
    stored = {call.storage_dtype for call in calls if call.device_type == device_type}
    if backends != {"cpp"}:
        result.failures.append(f"{device} calls ran on backend(s) {sorted(backends)}, expected the C++ kernels")
    if stored != {dtype}:
        result.failures.append(f"{device} calls stored {sorted(map(str, stored))}, expected {dtype}")
    return result


def nonfinite_mismatches(device: str, dtype_names) -> list[str]:
    """Outputs whose non-finite pattern differs between ``device`` and the CPU for a NaN in U,
    or a note when the NaN escapes its batch element / shows up before its step."""
    variant, problems = Variant("nan", bidirectional=True), []
    for dtype_name in dtype_names:
        inputs = make_inputs(variant, STORAGE_DTYPES[dtype_name])
        inputs["U"][3, 1, 5] = float("nan")  # step 3, batch element 1, forward direction
        on_device, on_cpu = run_recurrence(inputs, variant, device), run_recurrence(inputs, variant, "cpu")
        for name, value in on_device.items():
            if not torch.equal(torch.isfinite(value), torch.isfinite(on_cpu[name])):
                problems.append(f"{dtype_name} {name}")
        others = torch.cat([on_device["h"][:, :1], on_device["h"][:, 2:]], dim=1)
        if not torch.isfinite(others).all() or torch.isfinite(on_device["h"][3:, 1]).all():
            problems.append(f"{dtype_name}: NaN not confined to batch element 1 from step 3 on")
    return problems


def error_for_c0_on_the_cpu(device: str) -> Exception | None:
    """The error the recurrence raises for a CPU ``c0`` next to inputs on ``device`` (None: no error)."""
    from sru_lightning.ops import functional

    inputs = make_inputs(Variant("basic"), torch.float32)
    moved = {name: value.to(device) for name, value in inputs.items() if isinstance(value, torch.Tensor)}
    try:
        functional.sru_recurrence(moved["U"], moved["x"], moved["weight_c"], moved["bias"], inputs["c0"])
    except Exception as error:
        return error
    return None
