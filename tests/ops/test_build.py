"""Building and loading the extensions: prebuild command, missing compiler, fallback warnings,
a failed CUDA build that keeps the CPU kernels, SRU_LIGHTNING_REQUIRE_KERNELS."""

from __future__ import annotations

import warnings

import pytest
import torch

from sru_lightning.app import build_command
from sru_lightning.ops import build, build_cuda, cpu_levels, cuda_toolkit, functional
from sru_lightning.ops.testing import make_case


def test_prebuild_command_prints_what_it_built_and_where(capsys):
    from sru_lightning.ops.op import cpu_vector_level

    assert build_command.main([]) == 0
    output = capsys.readouterr().out
    levels = build.loaded_cpu_levels()
    # Its own library, or one of every level found in the cache (make test builds that first).
    assert cpu_levels.covers(levels, cpu_levels.needed_levels())
    spec = build.cpu_build_spec(levels)
    assert f"CPU  : {spec.directory()}" in output and spec.name.startswith(build.EXTENSION_NAME)
    assert f"vector levels built: {', '.join(levels)}; this CPU runs: {cpu_vector_level()}" in output
    assert cpu_vector_level() == cpu_levels.running_level()
    if torch.version.cuda is None:
        assert f"CUDA : not built: torch {torch.__version__} has no CUDA" in output
    assert torch._C._dispatch_has_kernel_for_dispatch_key("sru_lightning::recurrence_forward", "CPU")


def test_cpu_and_cuda_extensions_have_separate_sources():
    cpu_only = build.extension_sources()
    assert [path.rsplit("/", 1)[-1] for path in cpu_only] == list(build.CPU_SOURCES)
    cuda = build_cuda.cuda_sources()
    assert [path.rsplit("/", 1)[-1] for path in cuda] == list(build_cuda.CUDA_SOURCES)
    for source in cpu_only + cuda:
        assert open(source).read(1)


def test_cache_folder_is_keyed_by_variant_and_architectures():
    cpu, sm80 = build.cpu_build_spec(), build_cuda.cuda_build_spec(("8.0",))
    sm80_90 = build_cuda.cuda_build_spec(("8.0", "9.0"))
    assert len({cpu.name, sm80.name, sm80_90.name}) == 3
    assert cpu.name.startswith("sru_lightning_cpu_") and sm80.name.startswith("sru_lightning_cuda_")
    assert build_cuda.cuda_build_spec(("8.0",)).name == sm80.name


def test_missing_compiler_is_a_clear_error(monkeypatch, tmp_path):
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))  # nothing cached: it must compile
    monkeypatch.setenv("CXX", "no-such-compiler-sru")
    with pytest.raises(build.ExtensionBuildError, match="no C\\+\\+ compiler found .*no-such-compiler-sru"):
        build.build_extension()


def test_cuda_arch_on_a_cpu_only_torch_is_a_clear_error(monkeypatch, capsys):
    monkeypatch.setattr(torch.version, "cuda", None)
    assert build_command.main(["cuda_arch=8.0;9.0"]) == 2
    err = capsys.readouterr().err
    assert "build: error: `cuda_arch`: this torch" in err and "has no CUDA" in err


def test_bad_cuda_arch_names_the_argument(capsys):
    assert build_command.main(["cuda_arch=ampere-ish"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "cuda_arch" in err[0] and "'ampere-ish'" in err[0] and '"8.0;9.0"' in err[0]


def test_the_old_flag_spelling_of_build_still_works_with_a_notice(capsys):
    assert build_command.main(["--cuda-arch", "ampere-ish", "--verbose"]) == 2  # translated, then checked
    err = capsys.readouterr().err.strip().splitlines()
    assert err[0] == (
        "note: `--cuda-arch ampere-ish --verbose` is now `cuda_arch=ampere-ish verbose=true`; the --flag form goes "
        "away in the next release"
    )
    assert len(err) == 2 and "'ampere-ish'" in err[1]


@pytest.fixture
def failed_build(monkeypatch):
    """The state of a process whose build failed: no library, a remembered error."""
    monkeypatch.setattr(build, "_library_path", None)
    monkeypatch.setattr(build, "_failure", build.ExtensionBuildError("sru_lightning: no C++ compiler found"))
    monkeypatch.setattr(build, "_warned", False)


def test_build_command_reports_failure(failed_build, capsys):
    assert build_command.main([]) == 1
    assert "no C++ compiler found" in capsys.readouterr().out


def test_failed_build_falls_back_to_reference_and_warns_once(failed_build):
    (U, x, weight_c, bias, c0), kwargs = make_case(dtype=torch.float32)
    from sru_lightning import ops

    with warnings.catch_warnings(record=True) as caught, ops.trace_storage_dtypes() as calls:
        warnings.simplefilter("always")
        h1, _ = functional.sru_recurrence(U, x, weight_c, bias, c0, **kwargs)
        h2, _ = functional.sru_recurrence_inference(U, x, weight_c, bias, c0, **kwargs)
    fallback_warnings = [w for w in caught if "Falling back to the pure-PyTorch" in str(w.message)]
    assert len(fallback_warnings) == 1
    assert {call.backend for call in calls} == {"reference"}
    expected, _ = ops.sru_recurrence_reference(U, x, weight_c, bias, c0, **kwargs)
    torch.testing.assert_close(h1, expected)
    torch.testing.assert_close(h2, expected)


def test_extension_can_be_disabled_by_environment(monkeypatch):
    monkeypatch.setattr(build, "_library_path", None)
    monkeypatch.setattr(build, "_failure", None)
    monkeypatch.setenv(build.DISABLE_ENV, "0")
    with pytest.raises(build.ExtensionBuildError, match=build.DISABLE_ENV):
        build.load_extension()


def test_required_kernels_turn_the_cpu_fallback_into_an_error(failed_build, monkeypatch):
    monkeypatch.setenv(build.REQUIRE_ENV, "1")
    (U, x, weight_c, bias, c0), kwargs = make_case(dtype=torch.float32)
    with pytest.raises(build.ExtensionBuildError, match=f"no C\\+\\+ compiler found.*{build.REQUIRE_ENV}=1"):
        functional.sru_recurrence(U, x, weight_c, bias, c0, **kwargs)


# --- a CUDA torch whose CUDA build fails -------------------------------------------------------


@pytest.fixture
def cuda_torch_with_mismatched_nvcc(monkeypatch, tmp_path):
    """A CUDA 12.8 torch on a machine whose only nvcc is CUDA 13.0: the classic mismatch."""
    build.load_extension()  # the CPU kernels, as a real process would have them
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    nvcc = bin_dir / "nvcc"
    nvcc.write_text("#!/bin/sh\necho 'Cuda compilation tools, release 13.0, V13.0.88'\n")
    nvcc.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    monkeypatch.delenv("CUDA_HOME", raising=False)
    monkeypatch.delenv("CUDA_PATH", raising=False)
    monkeypatch.setattr(torch.version, "cuda", "12.8")
    monkeypatch.setattr(cuda_toolkit, "_wheel_candidates", lambda: [])
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(build_cuda, "_cuda_library_path", None)
    monkeypatch.setattr(build_cuda, "_cuda_failure", None)
    monkeypatch.setattr(build_cuda, "_cuda_warned", False)
    monkeypatch.delenv(build.REQUIRE_ENV, raising=False)
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "8.0")


def test_failed_cuda_build_keeps_cpu_kernels_and_warns_once_with_cause_and_fix(cuda_torch_with_mismatched_nvcc):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        # What functional does for a CUDA tensor, twice.
        assert functional._cpp_backend_ready("cuda") is False
        assert functional._cpp_backend_ready("cuda") is False
    cuda_warnings = [w for w in caught if "CUDA recurrence kernels are NOT available" in str(w.message)]
    assert len(cuda_warnings) == 1
    message = str(cuda_warnings[0].message)
    assert "torch was built with CUDA 12.8" in message and "nvcc 13.0" in message  # the cause
    assert "nvidia-cuda-nvcc-cu12==12.8.*" in message and "sru_lightning[cuda12]" in message  # the fix
    assert build.REQUIRE_ENV in message
    # The CPU kernels stay: CPU tensors still run the C++ kernel.
    assert build.extension_available()
    (U, x, weight_c, bias, c0), kwargs = make_case(dtype=torch.float32)
    from sru_lightning import ops

    with ops.trace_storage_dtypes() as calls:
        functional.sru_recurrence(U, x, weight_c, bias, c0, **kwargs)
    assert {call.backend for call in calls} == {"cpp"}


def test_failed_cuda_build_is_an_error_when_kernels_are_required(cuda_torch_with_mismatched_nvcc, monkeypatch):
    monkeypatch.setenv(build.REQUIRE_ENV, "1")
    with pytest.raises(build.ExtensionBuildError, match=f"CUDA 12.8.*{build.REQUIRE_ENV}=1 forbids running the CUDA"):
        functional._cpp_backend_ready("cuda")


def test_build_command_reports_cpu_built_and_cuda_failed(cuda_torch_with_mismatched_nvcc, capsys):
    assert build_command.main(["cuda_arch=8.0;9.0"]) == 1
    output = capsys.readouterr().out
    assert "CPU  : " in output
    assert "CUDA : NOT built: sru_lightning: torch was built with CUDA 12.8" in output
    assert "nvidia-cuda-runtime-cu12==12.8.*" in output


def test_cuda_torch_without_gpu_or_archs_says_what_to_pass(cuda_torch_with_mismatched_nvcc, monkeypatch, capsys):
    monkeypatch.delenv("TORCH_CUDA_ARCH_LIST")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert build_command.main([]) == 0
    assert (
        "CUDA : NOT built: sru_lightning: no GPU is visible and no CUDA architectures were given"
        in capsys.readouterr().out
    )


def test_cuda_compiler_failure_keeps_the_tail_and_names_the_host_compiler_fix():
    output = "x" * 5000 + "error -- unsupported GNU version! gcc versions later than 13 are not supported!"
    assert build_cuda._compiler_output_tail(output).endswith("are not supported!")
    assert len(build_cuda._compiler_output_tail(output)) < 2100
    assert "NVCC_CCBIN" in build_cuda._host_compiler_hint(output)
    assert build_cuda._host_compiler_hint("sru_cuda.cpp:3: error: expected ';'") == ""
