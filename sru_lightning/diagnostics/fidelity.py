"""Numerical fidelity of the recurrence in each storage dtype: ``python -m sru_lightning fidelity``.

For each storage dtype (float32, float16, bfloat16) the recurrence runs through the public
entry point (``sru_lightning.ops.functional.sru_recurrence``: tensors stored in that dtype,
arithmetic accumulated in float32) and, for the half dtypes, once more with every operation
done in half (``sru_recurrence_reference(..., compute_dtype=half)``, which is how a kernel
that computes in its storage type behaves). Both are compared with a float64 run on the
SAME inputs (the half-rounded values, upcast), so the table measures the arithmetic and not
the rounding of the inputs.

Error measure, per tensor: :func:`sru_lightning.ops.testing.relative_error`, ``max |value -
reference| / max |reference|`` (a NaN where the reference is finite counts as an infinite
error); the gradient column is the largest of those over the gradients of U, x, weight_c,
bias and c0.
"""

from __future__ import annotations

import dataclasses
import sys

import torch

from sru_lightning.app.key_value import command_usage, read_settings, setting, wants_help
from sru_lightning.app.usage import UsageError, command_prog, print_error
from sru_lightning.ops import functional, sru_recurrence_reference, trace_storage_dtypes
from sru_lightning.ops.testing import recurrence_inputs, relative_error
from sru_lightning.precision import dtype_name

__all__ = ["FidelityRow", "fidelity_table", "format_table", "main"]

STORAGE_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_GRAD_NAMES = ("U", "x", "weight_c", "bias", "c0")


@dataclasses.dataclass(frozen=True)
class FidelityRow:
    """Errors vs float64 for one storage dtype; the ``all_half_*`` fields are None for float32."""

    storage_dtype: torch.dtype
    backend: str
    h_error: float
    grad_error: float
    all_half_h_error: float | None
    all_half_grad_error: float | None

    @property
    def h_ratio(self) -> float | None:
        return None if self.all_half_h_error is None else self.h_error / self.all_half_h_error

    @property
    def grad_ratio(self) -> float | None:
        return None if self.all_half_grad_error is None else self.grad_error / self.all_half_grad_error


def _make_inputs(length, batch, hidden, bidirectional, seed, device):
    """Float64 inputs of a k = 3 layer with a forget bias that gives the state a long memory."""
    inputs = recurrence_inputs(
        length,
        batch,
        hidden,
        bidirectional=bidirectional,
        weight_c_scale=0.5,
        forget_bias=2.0,  # forget gates near 0.88: c carries information over ~10 steps
        c0_scale=0.5,
        with_grad_h=True,
        seed=seed,
    )
    return {name: inputs[name].to(device) for name in (*_GRAD_NAMES, "grad_h")}


def _run(fn, inputs, dtype, bidirectional):
    """h and the input gradients of ``fn`` on ``inputs`` rounded to ``dtype``."""
    leaves = {name: inputs[name].to(dtype).requires_grad_(True) for name in _GRAD_NAMES}
    h, _ = fn(
        leaves["U"],
        leaves["x"],
        leaves["weight_c"],
        leaves["bias"],
        leaves["c0"],
        scale_x=None,
        bidirectional=bidirectional,
        has_skip_term=True,
    )
    h.backward(inputs["grad_h"].to(h.dtype))
    return h.detach(), {name: leaf.grad for name, leaf in leaves.items()}


def _errors(result, reference):
    h, grads = result
    h_ref, grads_ref = reference
    return relative_error(h, h_ref), max(relative_error(grads[n], grads_ref[n]) for n in _GRAD_NAMES)


def _rounded(inputs, dtype):
    """The inputs as ``dtype`` would hold them, back in float64 (same values, exact)."""
    return {name: value.to(dtype).double() for name, value in inputs.items()}


def fidelity_table(
    length: int = 256,
    batch: int = 4,
    hidden: int = 32,
    *,
    bidirectional: bool = False,
    seed: int = 0,
    device: str = "cpu",
) -> list[FidelityRow]:
    """Measure the errors of every storage dtype against float64 (see the module docstring)."""
    for name, value in (("length", length), ("batch", batch), ("hidden", hidden)):
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ValueError(f"fidelity_table: `{name}` must be a positive int, got {value!r}")
    inputs = _make_inputs(length, batch, hidden, bidirectional, seed, device)

    def stored(*args, **kwargs):
        return functional.sru_recurrence(*args, policy="half", **kwargs)

    def reference64(*args, **kwargs):
        return sru_recurrence_reference(*args, compute_dtype=torch.float64, **kwargs)

    rows = []
    for dtype in STORAGE_DTYPES:
        exact = _run(reference64, _rounded(inputs, dtype), torch.float64, bidirectional)
        with trace_storage_dtypes() as calls:
            in_storage = _run(stored, inputs, dtype, bidirectional)
        ran_in = {call.storage_dtype for call in calls}
        if ran_in != {dtype}:
            raise RuntimeError(
                f"fidelity_table: the recurrence was expected to store tensors in {dtype}, "
                f"but the kernel ran in {sorted(map(str, ran_in))}"
            )
        backend = "/".join(sorted({call.backend for call in calls}))
        h_error, grad_error = _errors(in_storage, exact)
        all_half_h = all_half_grad = None
        if dtype in (torch.float16, torch.bfloat16):

            def all_half(*args, _dtype=dtype, **kwargs):
                return sru_recurrence_reference(*args, compute_dtype=_dtype, **kwargs)

            all_half_h, all_half_grad = _errors(_run(all_half, inputs, dtype, bidirectional), exact)
        rows.append(FidelityRow(dtype, backend, h_error, grad_error, all_half_h, all_half_grad))
    return rows


def format_table(rows: list[FidelityRow]) -> str:
    """Plain-text table of :func:`fidelity_table` rows."""

    def number(value):
        return "-" if value is None else f"{value:.2e}"

    def ratio(value):
        return "-" if value is None else f"{value:.2f}"

    header = ("storage", "backend", "h err", "grad err", "all-half h", "all-half grad", "h ratio", "grad ratio")
    lines = [
        [
            dtype_name(r.storage_dtype),
            r.backend,
            number(r.h_error),
            number(r.grad_error),
            number(r.all_half_h_error),
            number(r.all_half_grad_error),
            ratio(r.h_ratio),
            ratio(r.grad_ratio),
        ]
        for r in rows
    ]
    widths = [max(len(header[i]), *(len(line[i]) for line in lines)) for i in range(len(header))]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    out = [fmt.format(*header), fmt.format(*("-" * w for w in widths))]
    out += [fmt.format(*line) for line in lines]
    return "\n".join(out)


@dataclasses.dataclass
class FidelitySettings:
    """The command's settings (`key=value` on the command line)."""

    length: int = setting(256, "sequence length", at_least=1)
    batch: int = setting(4, "batch size", at_least=1)
    hidden: int = setting(32, "hidden size per direction", at_least=1)
    bidirectional: bool = setting(False, "a bidirectional layer")
    seed: int = setting(0, "random seed of the inputs")
    device: str = setting("cpu", "cpu, cuda or cuda:N")


PROG = command_prog("fidelity")
PURPOSE = (
    "Max relative error (max|err| / max|float64|) of h and of the input gradients for each storage dtype with "
    "float32 accumulation, next to the same recurrence computed entirely in half precision. Ratio = storage "
    "error / all-half error."
)


def parse_settings(argv) -> FidelitySettings:
    """`key=value` arguments (or the old `flag` spellings) -> checked settings; raises UsageError."""
    settings, _ = read_settings(argv, FidelitySettings, UsageError, old_flags=True)
    try:
        device = torch.device(settings.device)
    except (RuntimeError, ValueError):
        device = None
    if device is None or device.type not in ("cpu", "cuda"):
        raise UsageError(f"`device` must be cpu, cuda or cuda:N, got {settings.device!r}")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise UsageError(f"`device` is {settings.device!r}, but torch sees no CUDA device here; use device=cpu")
    return settings


def main(argv: list[str] | None = None) -> int:
    argv = [] if argv is None else list(argv)
    if wants_help(argv):
        print(command_usage(PROG, PURPOSE, FidelitySettings, examples=[f"{PROG} length=64 bidirectional=true"]))
        return 0
    try:
        args = parse_settings(argv)
        rows = fidelity_table(
            args.length,
            args.batch,
            args.hidden,
            bidirectional=args.bidirectional,
            seed=args.seed,
            device=args.device,
        )
    except UsageError as error:
        print_error(str(error), PROG)
        return 2
    print(
        f"SRU recurrence fidelity vs float64: L={args.length} B={args.batch} D={args.hidden} "
        f"{'bidirectional' if args.bidirectional else 'unidirectional'}, device {args.device}"
    )
    print(format_table(rows))
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
