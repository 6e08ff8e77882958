"""`python -m sru_lightning gpu-check`: the end-to-end checks that need a CUDA GPU.

One command, one summary. It builds the extension with its CUDA kernels, compares the CUDA
kernels with the CPU kernels and the float64 reference in every storage dtype and every
variant of the recurrence (forward, backward, inference), trains the language model under
16-mixed, bf16-mixed and 16-true (and DeepSpeed ZeRO-2 fp16/bf16 when deepspeed imports),
compares peak GPU memory of 16-mixed with 32-true, reports the recurrence kernels' achieved
memory bandwidth, and times SRU against cuDNN nn.LSTM and the `sru` package at a few sizes.
It also runs the kernel comparison on a non-default stream and on a second GPU when there is
one, compares torch.compile with eager on CUDA, and runs the kernels under compute-sanitizer
when it is installed. Fits run one at a time, so the times they report are their own.
Every part is guarded: a failure is reported and the next part runs.
Exit status: 0 all passed, 1 a check failed, 2 no CUDA device.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import time
import traceback

import torch

from sru_lightning.app.key_value import command_usage, read_settings, setting, wants_help
from sru_lightning.app.usage import UsageError, command_prog, print_error
from sru_lightning.diagnostics import gpu_fits, gpu_speed
from sru_lightning.diagnostics.checks import FAIL, PASS, SKIP, Check
from sru_lightning.diagnostics.gpu_kernel_checks import (
    SANITIZER_WORKER,
    check_compile,
    check_device_mismatch,
    check_devices,
    check_kernels,
    check_nonfinite,
    check_sanitizer,
    sanitizer_worker,
)
from sru_lightning.diagnostics.kernel_parity import STORAGE_DTYPES

PARTS = ("build", "kernels", "devices", "compile", "sanitizer", "fits", "deepspeed", "memory", "bandwidth", "bench")


# -- speed ---------------------------------------------------------------------------------------
def check_bandwidth(dtype_name: str, sizes=gpu_speed.BANDWIDTH_SIZES) -> Check:
    """The recurrence kernels alone: bytes they must move over their time (informational)."""
    results = {size: gpu_speed.measure_bandwidth(STORAGE_DTYPES[dtype_name], *size) for size in sizes}
    return Check(f"bandwidth {dtype_name} recurrence kernels", PASS, gpu_speed.describe_bandwidth(results))


def check_benchmark(dtype_name: str, sizes=gpu_speed.BENCH_SIZES, layers: int = 2) -> Check:
    """SRU vs cuDNN LSTM (and the sru package), fwd+bwd and inference, at each size; FAIL
    when SRU's fwd+bwd is slower than the LSTM's at the first (largest) size."""
    lines, notes, first_ratio = [], [], None
    for size in sizes:
        train_ms, inference_ms, size_notes = gpu_speed.time_models(STORAGE_DTYPES[dtype_name], *size, layers=layers)
        lines.append(gpu_speed.describe_models(size, train_ms, inference_ms))
        notes += [note for note in size_notes if note not in notes]
        if first_ratio is None:
            first_ratio = train_ms["SRU"] / train_ms["cuDNN LSTM"]
    faster = first_ratio <= 1.0
    detail = f"fwd+bwd/inference x{layers} layers; " + "; ".join(lines + notes)
    return Check(
        f"bench {dtype_name} SRU vs cuDNN LSTM",
        PASS if faster else FAIL,
        detail + ("" if faster else "; SRU fwd+bwd slower than cuDNN LSTM at the first size"),
    )


# -- orchestration -------------------------------------------------------------------------------
def guarded(name: str, part, checks: list[Check]) -> None:
    """Run one part; an exception becomes a FAIL line instead of ending the check."""
    try:
        result = part()
    except Exception as error:
        last = traceback.extract_tb(error.__traceback__)[-1]
        checks.append(
            Check(
                name,
                FAIL,
                f"{type(error).__name__}: {str(error)[:300]} ({os.path.basename(last.filename)}:{last.lineno})",
            )
        )
        return
    checks.extend(result if isinstance(result, list) else [result])


def format_summary(checks: list[Check], header: str, seconds: float) -> str:
    width = max([len(check.name) for check in checks] + [5]) + 2
    lines = [header, f"{'check':<{width}}result  details"]
    lines += [f"{check.name:<{width}}{check.status:<8}{check.detail}" for check in checks]
    counts = {status: sum(check.status == status for check in checks) for status in (PASS, FAIL, SKIP)}
    lines.append(f"{counts[PASS]} passed, {counts[FAIL]} failed, {counts[SKIP]} skipped in {seconds:.0f} s")
    return "\n".join(lines)


def exit_status(checks: list[Check]) -> int:
    return 1 if any(check.status == FAIL for check in checks) or not checks else 0


def no_cuda_message() -> str | None:
    if torch.cuda.is_available():
        return None
    build = f"CUDA {torch.version.cuda}" if torch.version.cuda else "a CPU-only build"
    return (
        f"gpu-check: no CUDA device: torch.cuda.is_available() is False (torch {torch.__version__}, "
        f"{build}). Run it on a machine with an NVIDIA GPU and a CUDA build of PyTorch; nothing was checked."
    )


class Budget:
    """The seconds left of the whole check's time budget."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.started = time.monotonic()

    def remaining(self) -> float:
        return self.seconds - (time.monotonic() - self.started)


def run_checks(parts, budget_s: float) -> list[Check]:
    """Run the chosen parts in order; each appends its lines. Without a working CUDA build nothing else runs."""
    budget = Budget(budget_s)
    checks: list[Check] = []
    if "build" in parts:
        guarded("build CUDA extension", build_extension, checks)
        if checks[-1].status == FAIL:
            return checks  # nothing else can run on the GPU kernels
    bf16 = torch.cuda.is_bf16_supported()
    if "kernels" in parts:
        run_kernel_checks(bf16, checks)
    if "devices" in parts:
        guarded("kernels on other streams and devices", lambda: check_devices(torch.cuda.device_count()), checks)
    if "compile" in parts:
        guarded("torch.compile on CUDA", check_compile, checks)
    reports = run_fits(fit_specs(parts, bf16, checks), budget, checks)
    if "memory" in parts:
        guarded("memory 16-mixed / 32-true", lambda: gpu_fits.judge_memory(reports), checks)
    if "bandwidth" in parts:
        for dtype_name in ("fp32", "fp16"):
            guarded(f"bandwidth {dtype_name}", lambda d=dtype_name: check_bandwidth(d), checks)
    if "bench" in parts:
        run_benchmarks(budget, checks)
    # Last: memcheck slows the kernels down a hundredfold, so it gets what time is left.
    if "sanitizer" in parts:
        run_sanitizer(budget, checks)
    return checks


def build_extension() -> Check:
    """Build (or load) the extension and confirm its CUDA kernels are registered."""
    from sru_lightning.ops import load_cuda_extension
    from sru_lightning.ops.op import cuda_kernels_loaded

    started = time.monotonic()
    path = load_cuda_extension()
    if not cuda_kernels_loaded():
        return Check("build CUDA extension", FAIL, f"{path} has no CUDA kernels registered")
    return Check("build CUDA extension", PASS, f"ready in {time.monotonic() - started:.0f} s")


def run_kernel_checks(bf16: bool, checks: list[Check]) -> None:
    """The kernels against the CPU kernels and the reference in every storage dtype, then bad inputs."""
    for dtype_name in STORAGE_DTYPES:
        if dtype_name == "bf16" and not bf16:
            checks.append(Check("kernels bf16", SKIP, "this GPU has no bf16 support"))
            continue
        guarded(f"kernels {dtype_name}", lambda d=dtype_name: check_kernels(d), checks)
    guarded("bad input: c0 on the CPU, U on the GPU", check_device_mismatch, checks)
    guarded("NaN input: same non-finite pattern as CPU", check_nonfinite, checks)


def fit_specs(parts, bf16: bool, checks: list[Check]) -> list[gpu_fits.FitSpec]:
    """The fits the chosen parts ask for; those this machine cannot run are SKIP lines instead."""
    specs = list(gpu_fits.FITS if "fits" in parts else ()) + list(gpu_fits.MEMORY_FITS if "memory" in parts else ())
    if "deepspeed" in parts:
        try:
            import deepspeed  # noqa: F401

            specs += list(gpu_fits.DEEPSPEED_FITS)
        except Exception as error:
            checks.append(Check("fit DeepSpeed ZeRO-2", SKIP, f"deepspeed does not import: {str(error)[:120]}"))
    if not bf16:
        checks += [Check(spec.name, SKIP, "this GPU has no bf16 support") for spec in specs if "bf16" in spec.precision]
        specs = [spec for spec in specs if "bf16" not in spec.precision]
    return specs


def run_fits(specs: list[gpu_fits.FitSpec], budget: Budget, checks: list[Check]) -> dict[str, dict]:
    """Each fit in its own process, one at a time: the seconds a fit reports are its own, and no
    fit's memory peak or speed depends on another one sharing the GPU. Returns each fit's report;
    a memory fit adds a line only when it failed (the memory part judges the others)."""
    reports = {}
    for spec in specs:
        if budget.remaining() < 20:
            checks.append(Check(spec.name, SKIP, "time budget spent"))
            continue
        try:
            process = gpu_fits.launch_fit(spec)
        except Exception as error:
            checks.append(Check(spec.name, FAIL, f"could not start: {error}"))
            continue
        check, report = gpu_fits.collect_fit(spec, process, budget.remaining())
        reports[spec.name] = report
        if not spec.peak_memory or check.status == FAIL:
            checks.append(check)
    return reports


def run_benchmarks(budget: Budget, checks: list[Check]) -> None:
    """SRU against cuDNN LSTM in fp32 and fp16, while the budget lasts."""
    for dtype_name in ("fp32", "fp16"):
        if budget.remaining() < 30:
            checks.append(Check(f"bench {dtype_name}", SKIP, "time budget spent"))
            continue
        guarded(f"bench {dtype_name}", lambda d=dtype_name: check_benchmark(d), checks)


def run_sanitizer(budget: Budget, checks: list[Check]) -> None:
    """compute-sanitizer's memcheck with what is left of the budget (at most 150 s)."""
    if budget.remaining() < 30:
        checks.append(Check("compute-sanitizer memcheck", SKIP, "time budget spent"))
    else:
        guarded("compute-sanitizer memcheck", lambda: check_sanitizer(min(150.0, budget.remaining())), checks)


@dataclasses.dataclass
class GPUCheckSettings:
    """The command's settings (`key=value` on the command line)."""

    only: str = setting(",".join(PARTS), "run only these parts", choices=PARTS, listing=True)
    budget: float = setting(420.0, "seconds for the whole check", at_least=1)
    json: str = setting("", "also write the results as JSON into this file")


PROG = command_prog("gpu-check")
PURPOSE = (
    "Checks that need a CUDA GPU: CUDA kernels vs CPU kernels and the reference (also on a non-default stream, "
    "a second GPU and under compute-sanitizer), torch.compile vs eager, fits in 16-mixed, bf16-mixed, 16-true "
    "and DeepSpeed ZeRO-2, peak memory, kernel bandwidth, speed vs cuDNN LSTM. One summary; exit status 0 all "
    "passed, 1 a check failed, 2 no CUDA device."
)
#: The word that starts one fit of the check in a process of its own, followed by its spec as JSON.
FIT_WORKER = "--fit-worker"


def parse_settings(argv) -> GPUCheckSettings:
    """`key=value` arguments (or the old `flag` spellings) -> checked settings; raises UsageError."""
    settings, _ = read_settings(argv, GPUCheckSettings, UsageError, old_flags=True)
    return settings


def main(argv=None) -> int:
    argv = [] if argv is None else list(argv)
    # The check's own worker processes (not the user's command line): one fit, or the sanitized kernels.
    if argv[:1] == [SANITIZER_WORKER]:
        return sanitizer_worker()
    if argv[:1] == [FIT_WORKER] and len(argv) == 2:
        report = gpu_fits.fit_worker(gpu_fits.FitSpec(**json.loads(argv[1])))
        print(gpu_fits.RESULT_PREFIX + json.dumps(report), flush=True)
        return 0
    if wants_help(argv):
        examples = [PROG, f"{PROG} only=kernels,fits budget=300 json=gpu-check.json"]
        print(command_usage(PROG, PURPOSE, GPUCheckSettings, examples=examples))
        return 0
    try:
        args = parse_settings(argv)
    except UsageError as error:
        print_error(str(error), PROG)
        return 2
    message = no_cuda_message()
    if message:
        print(message, file=sys.stderr)
        return 2
    started = time.monotonic()
    name = torch.cuda.get_device_name()
    major, minor = torch.cuda.get_device_capability()
    header = (
        f"sru_lightning GPU check: {name} (sm_{major}{minor}), torch {torch.__version__}, CUDA {torch.version.cuda}"
    )
    print(header + "\n(running; one summary follows)", flush=True)
    checks = run_checks({part.strip() for part in args.only.split(",")}, args.budget)
    print(format_summary(checks, header, time.monotonic() - started), flush=True)
    if args.json:
        with open(args.json, "w") as handle:
            json.dump([check.__dict__ for check in checks], handle, indent=2)
    return exit_status(checks)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
