"""Building and loading the extension: prebuild command, missing compiler, fallback warning."""

from __future__ import annotations

import warnings

import pytest
import torch

from sru_lightning.ops import build, functional
from sru_lightning.ops.testing import make_case


def test_prebuild_command_prints_where_the_library_is(capsys):
    assert build.main([]) == 0
    output = capsys.readouterr().out
    assert "recurrence extension (CPU" in output and build.EXTENSION_NAME in output
    assert torch._C._dispatch_has_kernel_for_dispatch_key("sru_lightning::recurrence_forward", "CPU")


def test_sources_exist_and_cpu_torch_builds_cpu_sources_only():
    cpu_only = build.extension_sources(with_cuda=False)
    assert [path.rsplit("/", 1)[-1] for path in cpu_only] == list(build.CPU_SOURCES)
    with_cuda = build.extension_sources(with_cuda=True)
    assert with_cuda[-2:] and all(source.endswith((".cpp", ".cu")) for source in with_cuda)
    for source in with_cuda:
        assert open(source).read(1)


def test_missing_compiler_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("CXX", "no-such-compiler-sru")
    with pytest.raises(build.ExtensionBuildError, match="no C\\+\\+ compiler found .*no-such-compiler-sru"):
        build.build_extension()


@pytest.fixture
def failed_build(monkeypatch):
    """The state of a process whose build failed: no library, a remembered error."""
    monkeypatch.setattr(build, "_library_path", None)
    monkeypatch.setattr(build, "_failure", build.ExtensionBuildError("sru_lightning: no C++ compiler found"))
    monkeypatch.setattr(build, "_warned", False)


def test_build_command_reports_failure(failed_build, capsys):
    assert build.main([]) == 1
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
