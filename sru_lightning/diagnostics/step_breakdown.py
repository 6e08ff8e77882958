"""An SRU stack's training step broken into its phases (`bench op`'s step table).

Each phase runs alone on inputs of the stack's shapes, the way the layers run it: the input
projection U = x @ W, the recurrence forward, the recurrence backward, and the projection's two
gradients (the input's, dU @ W^T, and the weight's, x^T @ dU), summed over the layers. The
whole step runs interleaved with them round by round; what it takes beyond the sum of its phases
is autograd's bookkeeping and any pass between phases (the layers add the skip term's gradient
inside the input gradient's product, :func:`sru_lightning.ops.projection.input_projection_with_skip`).
The GEMM floor is the projection's three products.
"""

from __future__ import annotations

import time
import warnings
from dataclasses import dataclass

import torch

from sru_lightning.diagnostics.tables import statistic_of

PHASES = (
    "projection forward",
    "recurrence forward",
    "recurrence backward",
    "input gradient (dU @ W^T)",
    "weight gradient (x^T @ dU)",
)


@dataclass
class StepBreakdown:
    phase_ms: dict[str, float]  # per phase, summed over the layers
    step_ms: float  # the whole forward+backward of the stack

    @property
    def phases_ms(self) -> float:
        return sum(self.phase_ms.values())

    @property
    def floor_ms(self) -> float:
        """The projection's products alone: forward, input gradient, weight gradient."""
        return sum(ms for phase, ms in self.phase_ms.items() if not phase.startswith("recurrence"))


def _layer_phases(layer, x: torch.Tensor, grad_h: torch.Tensor):
    """The phases of one layer as callables, each running its phase once on inputs prepared
    here (a first run of the layer's forward and backward)."""
    from sru_lightning.ops import functional
    from sru_lightning.ops.projection import input_projection

    x = x.detach().requires_grad_(True)
    weight = layer.weight

    def recurrence():
        U_leaf = U.detach().requires_grad_(True)
        skip = x.detach().requires_grad_(True)
        h, _ = functional.sru_recurrence(
            U_leaf,
            skip,
            layer.weight_c,
            layer.bias,
            None,
            scale_x=layer.scale_x if layer.rescale else None,
            bidirectional=layer.bidirectional,
            has_skip_term=layer.has_skip_term,
            policy=layer.recurrence_policy,
        )
        return U_leaf, h

    U = input_projection(x, weight)
    U_leaf, h = recurrence()
    grad_U = torch.autograd.grad(h, U_leaf, grad_h)[0]
    # One product each: a projection whose weight (input) needs no gradient computes none.
    U_of_input = input_projection(x, weight.detach())
    U_of_weight = input_projection(x.detach(), weight)
    state = {}

    def recurrence_forward():
        state["h"] = recurrence()[1]

    def recurrence_backward():
        state.pop("h").backward(grad_h)

    return {
        "projection forward": lambda: input_projection(x, weight),
        "recurrence forward": recurrence_forward,
        "recurrence backward": recurrence_backward,
        "input gradient (dU @ W^T)": lambda: torch.autograd.grad(U_of_input, x, grad_U, retain_graph=True),
        "weight gradient (x^T @ dU)": lambda: torch.autograd.grad(U_of_weight, weight, grad_U, retain_graph=True),
    }


def measure_step_breakdown(stack, x: torch.Tensor, whole_step, repeats: int, warmup: int, statistic: str = "min"):
    """Time the phases of `stack` (an SRU) on inputs shaped like `x` and `whole_step` (its training
    step), interleaved; returns a :class:`StepBreakdown`."""
    generator = torch.Generator().manual_seed(2)
    shape = x.shape
    layers = [
        _layer_phases(
            layer,
            torch.randn(shape, generator=generator).to(x.dtype),
            torch.randn(shape, generator=generator).to(x.dtype),
        )
        for layer in stack.rnn_lst
    ]
    samples: dict[str, list[float]] = {phase: [] for phase in (*PHASES, "step")}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for round_index in range(warmup + repeats):
            start = time.perf_counter()
            whole_step()
            took = {"step": time.perf_counter() - start}
            for phase in PHASES:
                start = time.perf_counter()
                for phases in layers:
                    phases[phase]()
                took[phase] = time.perf_counter() - start
            if round_index >= warmup:
                for phase, seconds in took.items():
                    samples[phase].append(seconds * 1e3)
    pick = statistic_of(statistic)
    return StepBreakdown({phase: pick(samples[phase]) for phase in PHASES}, pick(samples["step"]))


def breakdown_lines(breakdown: StepBreakdown, title: str) -> list[str]:
    """The step table: each phase's time and its share of the step and of the GEMM floor."""
    from sru_lightning.diagnostics.tables import fixed_width_lines

    step, floor = breakdown.step_ms, breakdown.floor_ms
    rows = [(phase, ms) for phase, ms in breakdown.phase_ms.items()]
    rows += [
        ("sum of the phases", breakdown.phases_ms),
        ("rest of the step", step - breakdown.phases_ms),
        ("whole step", step),
        ("GEMM floor (the products)", floor),
    ]
    columns = (("phase", "<30"), ("ms", ">9"), ("x step", ">9"), ("x GEMM", ">9"))
    cells = [(name, f"{ms:.2f}", f"{ms / step:.3f}", f"{ms / floor:.3f}") for name, ms in rows]
    return [title, *fixed_width_lines(columns, cells)]
