"""The GPU check without a GPU: its refusal, its judging logic, and its parts run on CPU
(the kernel comparison with the CPU kernel in the CUDA kernel's seat)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from sru_lightning.diagnostics import gpu_check, gpu_fits, gpu_kernel_checks, kernel_parity
from sru_lightning.diagnostics.checks import FAIL, PASS, SKIP, Check
from sru_lightning.diagnostics.gpu_fits import FitSpec

REPO = Path(__file__).resolve().parents[2]


def test_without_cuda_it_says_so_and_exits_non_zero(monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert gpu_check.main([]) == 2
    error = capsys.readouterr().err
    assert "no CUDA device" in error and "torch.cuda.is_available() is False" in error
    assert "nothing was checked" in error


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")
def test_the_one_command_refuses_cleanly_without_cuda():
    completed = subprocess.run(
        ["bash", str(REPO / "examples" / "gpu_check.sh")],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        env={"PYTHON": sys.executable, "PATH": "/usr/bin:/bin"},
    )
    assert completed.returncode == 2, completed.stderr
    assert "gpu-check: no CUDA device" in completed.stderr
    assert "Traceback" not in completed.stderr


def test_relative_error_treats_nan_and_shape_mismatch_as_failures():
    assert kernel_parity.relative_error(torch.tensor([1.0, 2.0]), torch.tensor([1.0, 2.0])) == 0.0
    assert kernel_parity.relative_error(torch.tensor([1.0, 2.2]), torch.tensor([1.0, 2.0])) == pytest.approx(0.1)
    assert kernel_parity.relative_error(torch.tensor([float("nan"), 2.0]), torch.tensor([1.0, 2.0])) == math.inf
    assert kernel_parity.relative_error(torch.zeros(3), torch.zeros(2)) == math.inf
    assert not kernel_parity.relative_error(torch.tensor([float("nan")]), torch.tensor([1.0])) <= 1.0


def test_inference_outputs_are_compared_with_the_forward_of_the_reference():
    errors = kernel_parity.compare_outputs(
        {"h": torch.ones(2), "h_inference": torch.full((2,), 1.5), "grad_U": torch.ones(1)},
        {"h": torch.ones(2), "grad_U": torch.ones(1)},
    )
    assert errors == {"h": 0.0, "h_inference": 0.5, "grad_U": 0.0}


def test_variants_cover_every_way_of_calling_the_recurrence():
    variants = kernel_parity.VARIANTS
    assert {v.k for v in variants} == {3, 4}
    for flag in ("bidirectional", "mask_c", "mask_pad", "per_step_weight_c", "single_step"):
        assert any(getattr(v, flag) for v in variants), flag
    assert any(not v.has_skip_term for v in variants) and any(not v.c0 for v in variants)
    assert {v.scale_x for v in variants} == {None, "float", "tensor"}
    assert set(kernel_parity.STORAGE_DTYPES) == {"fp32", "fp64", "fp16", "bf16"}


@pytest.mark.parametrize("dtype_name", ["fp64", "bf16"])
def test_kernel_comparison_runs_every_small_variant_on_cpu(dtype_name):
    # The same code path the GPU check runs, with the CPU kernel in the CUDA kernel's seat.
    small = [v for v in kernel_parity.VARIANTS if v.name != "large"]
    check = gpu_kernel_checks.check_kernels(dtype_name, small, device="cpu")
    assert check.status == PASS, check.detail
    assert f"{len(small)} variants" in check.detail


def test_kernel_comparison_fails_when_the_kernel_is_wrong(monkeypatch):
    real = kernel_parity.run_recurrence

    def off_by_a_bit(inputs, variant, device, grad_seed=1, reference=False):
        outputs = real(inputs, variant, device, grad_seed, reference)
        if not reference and device == "cpu" and variant.name == "mask_pad":
            outputs["h"] = outputs["h"] * 1.01
        return outputs

    monkeypatch.setattr(kernel_parity, "run_recurrence", off_by_a_bit)
    variants = [v for v in kernel_parity.VARIANTS if v.name in ("basic", "mask_pad")]
    check = gpu_kernel_checks.check_kernels("fp32", variants, device="cpu")
    assert check.status == FAIL and "mask_pad vs reference: h 1.0e-02" in check.detail


def test_device_mismatch_check_judges_the_error():
    # On CPU "cuda" cannot be reached, so the meta device plays the GPU: whatever the op does
    # with it, the check must report PASS only for a ValueError naming `c0`.
    check = gpu_kernel_checks.check_device_mismatch(device="meta")
    assert check.name == "bad input: c0 on the CPU, U on the GPU"
    assert (check.status == PASS) == ("ValueError: " in check.detail and "`c0`" in check.detail)


def test_nonfinite_check_runs_and_catches_a_kernel_that_drops_nan(monkeypatch):
    assert gpu_kernel_checks.check_nonfinite(device="cpu").status == PASS
    real = kernel_parity.run_recurrence

    def kernel_that_zeroes_nan(inputs, variant, device, grad_seed=1, reference=False):
        outputs = real(inputs, variant, "cpu", grad_seed, reference)
        if device == "cpu":
            return outputs
        return {name: torch.nan_to_num(value) for name, value in outputs.items()}

    monkeypatch.setattr(kernel_parity, "run_recurrence", kernel_that_zeroes_nan)
    check = gpu_kernel_checks.check_nonfinite(device="stand-in for cuda")
    assert check.status == FAIL and "fp32 h" in check.detail


def test_fit_judgement():
    spec = FitSpec("fit 16-mixed", "16-mixed", expected_storage="fp16", steps=8)
    good = {"losses": [4.0, 3.9, 3.5, 3.2, 3.0, 2.9, 2.8, 2.7], "storage": ["fp16"], "backends": ["cpp"]}
    assert gpu_fits.judge_fit(spec, good).status == PASS
    for change, reason in [
        ({"losses": good["losses"][:4] + [float("nan")] * 4}, "non-finite loss"),
        ({"losses": [3.0] * 8}, "loss did not fall"),
        ({"storage": ["fp32"]}, "recurrence stored ['fp32'], expected ['fp16']"),
        ({"backends": ["reference"]}, "backend on the device ['reference']"),
        ({"losses": [4.0, 3.0]}, "only 2 of 8 steps ran"),
    ]:
        check = gpu_fits.judge_fit(spec, {**good, **change})
        assert check.status == FAIL and reason in check.detail, check.detail


def test_memory_judgement():
    reports = {"memory 32-true": {"peak_bytes": 4 * 2**30}, "memory 16-mixed": {"peak_bytes": 2 * 2**30}}
    check = gpu_fits.judge_memory(reports)
    assert check.status == PASS and "= 0.50" in check.detail
    reports["memory 16-mixed"]["peak_bytes"] = 5 * 2**30
    assert gpu_fits.judge_memory(reports).status == FAIL
    assert gpu_fits.judge_memory({}).status == FAIL


def test_a_failing_part_becomes_one_fail_line_and_the_rest_still_runs():
    checks = []
    gpu_check.guarded("first", lambda: 1 / 0, checks)
    gpu_check.guarded("second", lambda: Check("second", PASS, "fine"), checks)
    assert [c.status for c in checks] == [FAIL, PASS]
    assert "ZeroDivisionError" in checks[0].detail


def test_summary_and_exit_status():
    checks = [Check("a", PASS, "1.0 ms"), Check("b", SKIP, "no bf16"), Check("c", FAIL, "bad")]
    text = gpu_check.format_summary(checks, "header line", 12.3)
    assert text.splitlines()[0] == "header line"
    assert text.splitlines()[-1] == "1 passed, 1 failed, 1 skipped in 12 s"
    assert gpu_check.exit_status(checks) == 1
    assert gpu_check.exit_status(checks[:2]) == 0
    assert gpu_check.exit_status([]) == 1


@pytest.mark.slow
def test_fit_worker_runs_in_its_own_process_and_reports(tmp_path):
    # The worker the GPU check launches per precision, here on CPU with bf16-mixed.
    spec = FitSpec(
        "fit bf16-mixed (cpu)",
        "bf16-mixed",
        expected_storage="bf16",
        steps=6,
        batch=4,
        seq_len=16,
        hidden=32,
        layers=1,
        accelerator="cpu",
    )
    process = gpu_fits.launch_fit(spec)
    check, report = gpu_fits.collect_fit(spec, process, timeout_s=120)
    assert report["storage"] == ["bf16"] and report["backends"] == ["cpp"], report
    assert len(report["losses"]) == 6 and all(math.isfinite(x) for x in report["losses"])
    assert check.status == PASS, check.detail
    json.dumps(report)  # what crosses the process boundary is plain JSON


# -- the parts added for streams, devices, compute-sanitizer and speed --------------------------
from sru_lightning.diagnostics import gpu_speed  # noqa: E402


@pytest.mark.parametrize("k, bidirectional, dtype", [(3, False, torch.float32), (4, True, torch.float16)])
def test_bandwidth_counts_the_bytes_of_every_tensor_the_kernels_touch(k, bidirectional, dtype):
    from sru_lightning.ops import op  # noqa: F401

    length, batch, hidden = 5, 3, 4
    width = (2 if bidirectional else 1) * hidden
    U = torch.randn(length, batch, k * width, dtype=dtype)
    x = torch.randn(length, batch, width, dtype=dtype) if k == 3 else None
    weight_c, bias, c0 = (
        torch.randn(2 * width, dtype=dtype),
        torch.randn(2 * width, dtype=dtype),
        torch.randn(batch, width, dtype=dtype),
    )
    forward_in = [U, x, weight_c, bias, c0]
    forward_out = torch.ops.sru_lightning.recurrence_forward(
        U, x, weight_c, bias, c0, None, 1.0, None, None, None, None, bidirectional, True, True
    )
    h, c_last, c_all = forward_out
    backward_in = [torch.randn_like(h), torch.randn_like(c_last), U, x, weight_c, bias, c0, c_all]
    backward_out = torch.ops.sru_lightning.recurrence_backward(
        *backward_in[:2], None, *backward_in[2:7], None, 1.0, None, None, None, None, c_all, bidirectional, True
    )

    def nbytes(tensors):
        return sum(t.numel() * t.element_size() for t in tensors if t is not None)

    traffic = gpu_speed.recurrence_traffic(length, batch, hidden, k, U.element_size(), bidirectional)
    assert traffic.forward == nbytes(forward_in) + nbytes(forward_out)
    assert traffic.backward == nbytes(backward_in) + nbytes(backward_out)
    assert gpu_speed.gigabytes_per_second(3_000_000_000, 1500.0) == pytest.approx(2.0)


def test_speed_lines_name_sizes_and_ratios():
    bandwidth = gpu_speed.describe_bandwidth(
        {(256, 64, 1024): {"forward_gbps": 1800.4, "forward_ms": 0.5, "backward_gbps": 1500.0, "backward_ms": 1.2}}
    )
    assert bandwidth == "L=256 B=64 D=1024: forward 1800 GB/s (0.500 ms), backward 1500 GB/s (1.200 ms)"
    models = gpu_speed.describe_models(
        (256, 64, 1024), {"SRU": 2.0, "cuDNN LSTM": 8.0}, {"SRU": 1.0, "cuDNN LSTM": 3.0}
    )
    assert models == "L=256 B=64 D=1024: SRU 2.00/1.00 ms (0.25x LSTM), cuDNN LSTM 8.00/3.00 ms (1.00x LSTM)"
    assert gpu_speed.BENCH_SIZES[0] == (256, 64, 1024)


def test_a_second_gpu_is_covered_only_when_present():
    assert gpu_kernel_checks.extra_devices(1) == []
    assert gpu_kernel_checks.extra_devices(4) == ["cuda:1"]


def test_compute_sanitizer_is_skipped_when_missing_and_its_summary_judged(monkeypatch):
    monkeypatch.setattr(gpu_kernel_checks.shutil, "which", lambda name: None)
    assert gpu_kernel_checks.check_sanitizer(60).status == SKIP
    command = gpu_kernel_checks.sanitizer_command("/opt/cuda/bin/compute-sanitizer")
    assert command[:3] == ["/opt/cuda/bin/compute-sanitizer", "--tool", "memcheck"]
    assert command[-1] == gpu_kernel_checks.SANITIZER_WORKER and sys.executable in command
    clean = "kernels fp32: PASS ...\n========= ERROR SUMMARY: 0 errors\n"
    assert gpu_kernel_checks.judge_sanitizer(0, clean).status == PASS
    dirty = "========= Invalid __global__ read of size 4 bytes\n========= ERROR SUMMARY: 2 errors\n"
    check = gpu_kernel_checks.judge_sanitizer(99, dirty)
    assert check.status == FAIL and "2 errors" in check.detail
    assert gpu_kernel_checks.judge_sanitizer(0, "no summary at all").status == FAIL


def test_fits_run_one_at_a_time(monkeypatch):
    events = []

    class Finished:
        def __init__(self, name):
            self.name = name

    def launch(spec):
        assert not events or events[-1][0] == "collect", "a fit started while another was running"
        events.append(("launch", spec.name))
        return Finished(spec.name)

    def collect(spec, process, timeout_s):
        events.append(("collect", process.name))
        return Check(spec.name, PASS, "ok"), {"peak_bytes": 1}

    monkeypatch.setattr(gpu_fits, "launch_fit", launch)
    monkeypatch.setattr(gpu_fits, "collect_fit", collect)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda: True)
    checks = gpu_check.run_checks({"fits", "memory"}, budget_s=300)
    names = [spec.name for spec in gpu_fits.FITS + gpu_fits.MEMORY_FITS]
    assert [name for kind, name in events if kind == "launch"] == names
    assert [c.name for c in checks if c.name.startswith("fit")] == [spec.name for spec in gpu_fits.FITS]


def test_the_new_parts_can_be_chosen():
    for part in ("devices", "compile", "sanitizer", "bandwidth"):
        assert part in gpu_check.PARTS


def test_parts_past_the_time_budget_are_skipped_in_order(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda: False)
    checks = gpu_check.run_checks({"fits", "bench", "sanitizer"}, budget_s=0)
    bf16_fits = [spec.name for spec in gpu_fits.FITS if "bf16" in spec.precision]
    other_fits = [spec.name for spec in gpu_fits.FITS if "bf16" not in spec.precision]
    assert [(c.name, c.status) for c in checks] == [
        *((name, SKIP) for name in bf16_fits + other_fits),
        ("bench fp32", SKIP),
        ("bench fp16", SKIP),
        ("compute-sanitizer memcheck", SKIP),
    ]
    assert [c.detail for c in checks][-3:] == ["time budget spent"] * 3
    assert all(c.detail == "this GPU has no bf16 support" for c in checks[: len(bf16_fits)])


def test_the_sanitizer_runs_the_worker_that_gpu_check_dispatches(monkeypatch):
    """compute-sanitizer starts `python -m <module> --sanitizer-worker`: that module's main runs the
    worker of the kernel checks."""
    command = gpu_kernel_checks.sanitizer_command("/opt/cuda/bin/compute-sanitizer")
    assert command[-3:] == ["-m", gpu_check.__name__, gpu_kernel_checks.SANITIZER_WORKER]
    ran = []
    monkeypatch.setattr(gpu_check, "sanitizer_worker", lambda: ran.append(True) or 0)
    assert gpu_check.main([gpu_kernel_checks.SANITIZER_WORKER]) == 0 and ran == [True]
