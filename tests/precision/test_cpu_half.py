"""Whether this CPU multiplies half-precision matrices natively, read from its flags (injected
here for a CPU with and one without), and the slowdown a report of a half regime names."""

from __future__ import annotations

import math

import pytest
import torch

from sru_lightning.precision import cpu_half
from sru_lightning.precision.cpu_half import cpu_flags, cpu_half_advice, half_matmul_slowdown, lacks_native_half

# The flags lines of two x86 CPUs, as /proc/cpuinfo spells them (shortened).
AVX2_ONLY = "processor\t: 0\nvendor_id\t: AuthenticAMD\nflags\t\t: fpu sse2 avx avx2 fma f16c\n"
SAPPHIRE_RAPIDS = "flags\t\t: fpu avx2 avx512f avx512_bf16 avx512_fp16 amx_bf16 amx_tile amx_int8\n"


def never_measured(dtype):
    raise AssertionError("nothing is measured on a CPU with native half arithmetic")


def test_the_flags_are_read_from_the_first_flags_line():
    assert cpu_flags(AVX2_ONLY) == frozenset({"fpu", "sse2", "avx", "avx2", "fma", "f16c"})
    assert "amx_bf16" in cpu_flags(SAPPHIRE_RAPIDS)
    assert cpu_flags("processor\t: 0\n") is None  # no flags line: unknown, not "none"


@pytest.mark.parametrize(
    "dtype, flags, lacking",
    [
        (torch.bfloat16, cpu_flags(AVX2_ONLY), True),
        (torch.float16, cpu_flags(AVX2_ONLY), True),
        (torch.bfloat16, cpu_flags(SAPPHIRE_RAPIDS), False),
        (torch.float16, cpu_flags(SAPPHIRE_RAPIDS), False),
        (torch.bfloat16, {"avx512f", "avx512_bf16"}, False),  # a Cooper Lake / Zen 4: bf16 only
        (torch.float16, {"avx512f", "avx512_bf16"}, True),
        (torch.bfloat16, None, None),
        (torch.float32, cpu_flags(AVX2_ONLY), None),
    ],
)
def test_native_half_arithmetic_follows_the_dtypes_own_features(dtype, flags, lacking):
    assert lacks_native_half(dtype, flags) is lacking


def test_a_cpu_without_native_bf16_is_named_with_the_slowdown_and_the_advice():
    advice = cpu_half_advice(torch.bfloat16, flags=cpu_flags(AVX2_ONLY), slowdown=lambda dtype: 52.4)
    assert advice == (
        "no native bfloat16 arithmetic on this CPU (no AVX512_BF16 or AMX-BF16): a bfloat16 matmul "
        "measured 52x slower than float32; precision '32-true' trains faster"
    )
    advice = cpu_half_advice(torch.float16, flags={"avx512_bf16"}, slowdown=lambda dtype: 3.14)
    assert "no native float16 arithmetic" in advice and "(no AVX512_FP16 or AMX-FP16)" in advice
    assert "measured 3.1x slower than float32" in advice


def test_a_cpu_with_native_half_arithmetic_gets_no_advice_and_no_measurement():
    for dtype in (torch.bfloat16, torch.float16):
        assert cpu_half_advice(dtype, flags=cpu_flags(SAPPHIRE_RAPIDS), slowdown=never_measured) is None
    assert cpu_half_advice(torch.float32, flags=cpu_flags(AVX2_ONLY), slowdown=never_measured) is None


def test_where_the_flags_are_unknown_only_a_real_slowdown_is_reported():
    assert cpu_half_advice(torch.bfloat16, flags=None, slowdown=lambda dtype: 1.3) is None
    advice = cpu_half_advice(torch.bfloat16, flags=None, slowdown=lambda dtype: 8.0)
    assert advice == (
        "on this CPU a bfloat16 matmul measured 8.0x slower than float32; precision '32-true' trains faster"
    )


def test_the_flags_of_this_machine_are_read_by_default(monkeypatch):
    monkeypatch.setattr(cpu_half, "cpu_flags", lambda cpuinfo=None: cpu_flags(AVX2_ONLY))
    assert "no native bfloat16" in cpu_half_advice(torch.bfloat16, slowdown=lambda dtype: 20.0)
    monkeypatch.setattr(cpu_half, "cpu_flags", lambda cpuinfo=None: cpu_flags(SAPPHIRE_RAPIDS))
    assert cpu_half_advice(torch.bfloat16, slowdown=never_measured) is None


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_the_measured_slowdown_is_a_ratio_of_times_and_leaves_the_thread_count(dtype):
    threads = torch.get_num_threads()
    ratio = half_matmul_slowdown(dtype)
    assert math.isfinite(ratio) and ratio > 0
    assert torch.get_num_threads() == threads
