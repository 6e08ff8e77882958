"""The checks of the CUDA kernels themselves, each one :class:`~.checks.Check` line of
`gpu-check` (:mod:`.gpu_check`): the kernels against the CPU kernels and the float64 reference
(:mod:`.kernel_parity`) in every storage dtype, on a non-default stream and on a second GPU,
torch.compile against eager, bad inputs (a tensor on the wrong device, NaN), and the kernels under
compute-sanitizer's memcheck (in a worker process that `gpu-check` starts).
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import sys

import torch

from sru_lightning.diagnostics.checks import FAIL, PASS, SKIP, Check
from sru_lightning.diagnostics.kernel_parity import (
    STORAGE_DTYPES,
    VARIANTS,
    compare_kernels,
    error_for_c0_on_the_cpu,
    nonfinite_mismatches,
)


def check_kernels(
    dtype_name: str, variants=VARIANTS, device: str = "cuda", kernels_under_test=contextlib.nullcontext, label: str = ""
) -> Check:
    comparison = compare_kernels(dtype_name, variants, device, kernels_under_test)
    detail = comparison.describe()
    name = f"kernels {dtype_name}{label}"
    if not comparison.passed:
        return Check(name, FAIL, detail + "; " + "; ".join(comparison.failures[:4]))
    return Check(name, PASS, detail)


SMALL_VARIANTS = tuple(variant for variant in VARIANTS if variant.name != "large")


@contextlib.contextmanager
def side_stream():
    """Run the block on a new CUDA stream (the binding must launch on the current stream)."""
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        yield
    stream.synchronize()


def extra_devices(device_count: int) -> list[str]:
    """The GPUs besides the first one that the device checks cover (one is enough to
    exercise the device guard: tensors on a GPU other than the current one)."""
    return ["cuda:1"] if device_count > 1 else []


def check_devices(device_count: int) -> list[Check]:
    """The kernels on a non-default stream, and on a second GPU while the first stays current."""
    checks = [check_kernels("fp32", SMALL_VARIANTS, "cuda", side_stream, label=" on a non-default stream")]
    second = extra_devices(device_count)
    if not second:
        checks.append(Check("kernels fp32 on a second GPU", SKIP, f"{device_count} GPU visible"))
    for device in second:
        checks.append(check_kernels("fp32", SMALL_VARIANTS, device, label=f" on {device}"))
    return checks


def check_compile(device: str = "cuda") -> list[Check]:
    """torch.compile(fullgraph=True) of SRU against eager, outputs and every gradient."""
    from sru_lightning.diagnostics import compile_parity

    checks = []
    for case in compile_parity.CASES:
        differences = compile_parity.compare_compiled_with_eager(case, device=device)
        worst = max(differences, key=differences.get)
        status = PASS if differences[worst] <= 1e-4 else FAIL
        checks.append(
            Check(
                f"torch.compile {case.name}",
                status,
                f"{len(differences)} outputs and gradients, largest relative difference {differences[worst]:.1e} "
                f"({worst}), tol 1e-04",
            )
        )
    differences = compile_parity.compare_compiled_op_with_batch_first_inputs(device)
    worst = max(differences.values())
    checks.append(
        Check(
            "torch.compile op with batch_first inputs",
            PASS if worst <= 1e-5 else FAIL,
            f"inductor backward strides and gradients, largest relative difference {worst:.1e}",
        )
    )
    return checks


SANITIZER_WORKER = "--sanitizer-worker"


def sanitizer_command(executable: str | None) -> list[str] | None:
    """compute-sanitizer's memcheck around a small kernel comparison; None when not installed."""
    if executable is None:
        return None
    return [
        executable,
        "--tool",
        "memcheck",
        "--error-exitcode",
        "99",
        sys.executable,
        "-m",
        "sru_lightning.diagnostics.gpu_check",
        SANITIZER_WORKER,
    ]


def judge_sanitizer(returncode: int, output: str) -> Check:
    name = "compute-sanitizer memcheck"
    summary = next((line.strip() for line in reversed(output.splitlines()) if "ERROR SUMMARY" in line), None)
    if returncode == 0 and summary is not None and " 0 errors" in summary:
        return Check(name, PASS, f"{summary} (kernels fp32/fp16, small variants)")
    tail = " | ".join(line.strip() for line in output.splitlines()[-6:] if line.strip())
    return Check(name, FAIL, f"exit status {returncode}: {summary or tail}"[:400])


def check_sanitizer(timeout_s: float) -> Check:
    command = sanitizer_command(shutil.which("compute-sanitizer"))
    if command is None:
        return Check("compute-sanitizer memcheck", SKIP, "compute-sanitizer is not on PATH")
    try:
        completed = subprocess.run(command, capture_output=True, text=True, timeout=max(timeout_s, 1.0))
    except subprocess.TimeoutExpired:
        return Check("compute-sanitizer memcheck", FAIL, f"did not finish within {timeout_s:.0f} s")
    return judge_sanitizer(completed.returncode, completed.stdout + completed.stderr)


def sanitizer_worker() -> int:
    """What runs under compute-sanitizer: the kernel comparison, small and quick."""
    variants = tuple(
        v
        for v in SMALL_VARIANTS
        if v.name
        in (
            "basic",
            "bidirectional k4 + mask_pad",
            "bidirectional documents + mask_pad",
            "per-step weight_c",
            "several blocks, last partial",
        )
    )
    failed = False
    for dtype_name in ("fp32", "fp16"):
        check = check_kernels(dtype_name, variants)
        print(f"{check.name}: {check.status} {check.detail}", flush=True)
        failed |= check.status != PASS
    return 1 if failed else 0


def check_nonfinite(device: str = "cuda") -> Check:
    """NaN in U reaches the same outputs and gradients on ``device`` as on the CPU, in every dtype."""
    dtypes = [name for name in STORAGE_DTYPES if name != "bf16" or device != "cuda" or torch.cuda.is_bf16_supported()]
    problems = nonfinite_mismatches(device, dtypes)
    name = "NaN input: same non-finite pattern as CPU"
    if problems:
        return Check(name, FAIL, "differs in " + ", ".join(problems[:6]))
    return Check(name, PASS, f"{'/'.join(dtypes)}, forward, backward and inference (bidirectional)")


def check_device_mismatch(device: str = "cuda") -> Check:
    """A `c0` left on the CPU next to a CUDA `U` must be refused by name, not read as device memory."""
    name = "bad input: c0 on the CPU, U on the GPU"
    error = error_for_c0_on_the_cpu(device)
    if error is None:
        return Check(name, FAIL, "no error: the kernel ran on tensors from two devices")
    if not isinstance(error, ValueError):
        return Check(name, FAIL, f"{type(error).__name__} instead of a ValueError naming `c0`: {str(error)[:160]}")
    if "`c0`" not in str(error):
        return Check(name, FAIL, f"ValueError without naming `c0`: {str(error)[:160]}")
    return Check(name, PASS, f"ValueError: {str(error).splitlines()[0][:120]}")
