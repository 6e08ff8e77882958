"""Which vector levels a CPU library holds and which a process needs (sru_lightning.ops.cpu_levels):
the level read from the processor's features, the cap, the library that covers a process."""

from __future__ import annotations

import pytest

from sru_lightning.ops import build, cpu_levels
from sru_lightning.ops.signature import CPU_VECTOR_LEVELS

AVX2 = {"sse2", "avx", "avx2", "fma", "f16c"}
AVX512 = AVX2 | {"avx512f", "avx512vl", "avx512bw", "avx512dq"}
AVX512_BF16 = AVX512 | {"avx512_bf16"}


@pytest.mark.parametrize(
    ("flags", "level"),
    [
        (set(), "baseline"),
        ({"avx2", "fma"}, "baseline"),  # no F16C: the AVX2 level needs all three
        (AVX2, "avx2"),
        (AVX2 | {"avx512f"}, "avx2"),  # AVX-512 without VL
        (AVX512, "avx512"),
        (AVX512_BF16, "avx512_bf16"),
        (AVX2 | {"avx512_bf16"}, "avx2"),  # each level needs the ones before it
    ],
)
def test_level_of_the_processor_features(flags, level):
    assert cpu_levels.level_of_flags(flags) == level


@pytest.mark.parametrize(
    ("level", "cap", "running"),
    [
        ("avx512_bf16", None, "avx512_bf16"),
        ("avx512_bf16", "avx2", "avx2"),
        ("avx512_bf16", "baseline", "baseline"),
        ("avx2", "avx512", "avx2"),  # a cap never raises the level
        ("avx512", "avx512_bf16", "avx512"),  # the widest name is no cap (as in csrc/sru_cpu.cpp)
        ("avx512", "sse9", "avx512"),
    ],
)
def test_the_cap_lowers_the_level_only(level, cap, running):
    assert cpu_levels.capped(level, cap) == running


def test_the_levels_a_process_needs_follow_the_cap(monkeypatch):
    monkeypatch.setattr(cpu_levels, "processor_level", lambda: "avx512_bf16")
    monkeypatch.delenv(cpu_levels.CAP_ENV, raising=False)
    assert cpu_levels.needed_levels() == ("avx512", "avx512_bf16")
    monkeypatch.setenv(cpu_levels.CAP_ENV, "avx2")
    assert cpu_levels.needed_levels() == ("avx2",)
    # Each set of levels is its own cache entry; the sources key every one alike.
    level_sets = [("avx2",), ("avx512", "avx512_bf16"), CPU_VECTOR_LEVELS]
    specs = {levels: build.cpu_build_spec(levels) for levels in level_sets}
    assert len({spec.name for spec in specs.values()}) == 3
    assert len({spec.key["sources"] for spec in specs.values()}) == 1


def test_a_library_of_every_level_covers_every_process():
    for level in CPU_VECTOR_LEVELS:
        assert cpu_levels.covers(CPU_VECTOR_LEVELS, cpu_levels.levels_for(level))
    assert cpu_levels.covers(("avx2",), ("avx2",))
    assert not cpu_levels.covers(("avx2",), ("avx512",))
    # The library of an avx512_bf16 processor has no bfloat16 code at the avx512 level: a process
    # capped to avx512 needs its own.
    assert not cpu_levels.covers(("avx512", "avx512_bf16"), ("avx512",))
    assert "-DSRU_CPU_AVX512_WITHOUT_BF16" in cpu_levels.defines(("avx512", "avx512_bf16"))
    assert "-DSRU_CPU_AVX512_WITHOUT_BF16" not in cpu_levels.defines(CPU_VECTOR_LEVELS)


def test_the_build_message_quotes_a_time_from_the_files_it_compiles():
    one_level = cpu_levels.expected_seconds(("avx2",), cores=2)
    every_level = cpu_levels.expected_seconds(CPU_VECTOR_LEVELS, cores=2)
    assert 20 <= one_level < every_level <= 90
    assert cpu_levels.expected_seconds(("avx2",), cores=1) > one_level
    assert cpu_levels.expected_duration(("avx2",)).startswith("about ")
