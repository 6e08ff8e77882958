"""Finding nvcc (CUDA_HOME, PATH, the nvidia-cuda-nvcc wheels), checking its version against
torch's, and choosing the GPU architectures; fake nvcc scripts stand in for real toolkits."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

from sru_lightning.ops import cuda_toolkit


def fake_nvcc(bin_dir: Path, release: str) -> Path:
    bin_dir.mkdir(parents=True, exist_ok=True)
    nvcc = bin_dir / "nvcc"
    nvcc.write_text(
        "#!/bin/sh\n"
        "echo 'nvcc: NVIDIA (R) Cuda compiler driver'\n"
        f"echo 'Cuda compilation tools, release {release}, V{release}.1'\n"
    )
    nvcc.chmod(0o755)
    return nvcc


@pytest.fixture
def clean_search(monkeypatch, tmp_path):
    """No CUDA_HOME, a PATH without nvcc, no wheels: each test adds what it needs."""
    monkeypatch.delenv("CUDA_HOME", raising=False)
    monkeypatch.delenv("CUDA_PATH", raising=False)
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", f"{empty}:/usr/bin:/bin")
    monkeypatch.setattr(sys, "path", [p for p in sys.path if not (Path(p or ".") / "nvidia").is_dir()])
    monkeypatch.setattr(cuda_toolkit.importlib.util, "find_spec", lambda name: None)
    return tmp_path


def test_version_is_read_from_nvcc_output(tmp_path):
    assert cuda_toolkit.nvcc_version(fake_nvcc(tmp_path / "bin", "12.8")) == (12, 8)


def test_nvcc_without_a_release_line_is_a_clear_error(tmp_path):
    broken = tmp_path / "nvcc"
    broken.write_text("#!/bin/sh\necho hello\n")
    broken.chmod(0o755)
    with pytest.raises(cuda_toolkit.CudaToolkitError, match="did not print a CUDA release"):
        cuda_toolkit.nvcc_version(broken)


def test_cuda_home_comes_before_path_and_the_matching_major_wins(clean_search, monkeypatch):
    home = clean_search / "cuda-12.4"
    fake_nvcc(home / "bin", "12.4")
    path_nvcc = fake_nvcc(clean_search / "other" / "bin", "13.0")
    monkeypatch.setenv("CUDA_HOME", str(home))
    monkeypatch.setenv("PATH", f"{path_nvcc.parent}:/usr/bin:/bin")

    candidates = cuda_toolkit.find_nvcc_candidates()
    assert [(c.origin, c.version) for c in candidates] == [("CUDA_HOME", (12, 4)), ("PATH", (13, 0))]
    assert candidates[0].root == home
    assert cuda_toolkit.select_nvcc("12.8", candidates).origin == "CUDA_HOME"
    assert cuda_toolkit.select_nvcc("13.0", candidates).origin == "PATH"


def test_the_nvcc_wheel_is_found_with_its_runtime_headers_and_library(clean_search, monkeypatch):
    site = clean_search / "site-packages"
    fake_nvcc(site / "nvidia" / "cuda_nvcc" / "bin", "12.8")
    (site / "nvidia" / "cuda_runtime" / "include").mkdir(parents=True)
    (site / "nvidia" / "cuda_runtime" / "lib").mkdir()
    (site / "nvidia" / "cuda_runtime" / "lib" / "libcudart.so.12").write_bytes(b"")
    monkeypatch.setattr(sys, "path", [*sys.path, str(site)])

    (found,) = cuda_toolkit.find_nvcc_candidates()
    assert found.origin == "nvidia-cuda-nvcc wheel" and found.version == (12, 8)
    assert found.root == site / "nvidia" / "cuda_nvcc"
    assert found.include_dirs == (site / "nvidia" / "cuda_runtime" / "include",)
    assert found.cudart_dir == site / "nvidia" / "cuda_runtime" / "lib"
    assert cuda_toolkit.select_nvcc("12.6").path == found.path


def test_mismatched_major_says_exactly_what_to_install(clean_search, monkeypatch):
    path_nvcc = fake_nvcc(clean_search / "cuda-13" / "bin", "13.0")
    monkeypatch.setenv("PATH", f"{path_nvcc.parent}:/usr/bin:/bin")
    with pytest.raises(cuda_toolkit.CudaToolkitError) as error:
        cuda_toolkit.select_nvcc("12.8")
    message = str(error.value)
    assert "torch was built with CUDA 12.8" in message
    assert f"nvcc 13.0 at {path_nvcc} (from PATH)" in message
    assert 'pip install "nvidia-cuda-nvcc-cu12==12.8.*" "nvidia-cuda-runtime-cu12==12.8.*"' in message
    assert 'pip install "sru_lightning[cuda12]"' in message and "CUDA_HOME" in message


def test_cuda13_wheels_have_unsuffixed_names():
    hint = cuda_toolkit.install_hint("13.0")
    assert '"nvidia-cuda-nvcc==13.0.*" "nvidia-cuda-runtime==13.0.*"' in hint and "sru_lightning[cuda13]" in hint


def test_no_nvcc_anywhere_lists_the_places_looked(clean_search):
    with pytest.raises(cuda_toolkit.CudaToolkitError, match="no CUDA compiler .*CUDA_HOME.*PATH.*nvidia-cuda-nvcc"):
        cuda_toolkit.select_nvcc("12.8")


def test_a_cpu_only_torch_has_nothing_to_compile():
    with pytest.raises(cuda_toolkit.CudaToolkitError, match="torch.version.cuda is None"):
        cuda_toolkit.select_nvcc(None, [])


def test_wrapper_script_on_path_resolves_to_its_toolkit(clean_search, monkeypatch):
    # /usr/local/bin/nvcc as an `exec` wrapper: the toolkit is where the real nvcc says it runs.
    toolkit = clean_search / "cuda-12.8"
    (toolkit / "include").mkdir(parents=True)
    (toolkit / "include" / "cuda_runtime_api.h").write_text("")
    wrapper_dir = clean_search / "local-bin"
    wrapper_dir.mkdir()
    wrapper = wrapper_dir / "nvcc"
    wrapper.write_text(
        "#!/bin/sh\n"
        f"case \"$1\" in --dryrun) echo '#$ _HERE_={toolkit}/bin' >&2;; "
        "*) echo 'Cuda compilation tools, release 12.8, V12.8.1';; esac\n"
    )
    wrapper.chmod(0o755)
    monkeypatch.setenv("PATH", f"{wrapper_dir}:/usr/bin:/bin")
    (found,) = cuda_toolkit.find_nvcc_candidates()
    assert found.root == toolkit


# --- architectures ----------------------------------------------------------------------------


def test_arch_lists_parse_in_every_separator():
    assert cuda_toolkit.parse_arch_list("9.0;8.0") == ("8.0", "9.0")
    assert cuda_toolkit.parse_arch_list("8.0 9.0+PTX") == ("8.0", "9.0+PTX")
    assert cuda_toolkit.parse_arch_list("10.0,8.6") == ("8.6", "10.0")


@pytest.mark.parametrize("bad", ["", "sm_80", "8", "ampere"])
def test_bad_arch_list_names_the_argument_and_value(bad):
    with pytest.raises(ValueError, match=f"cuda_arch: expected compute capabilities .*received {bad!r}"):
        cuda_toolkit.parse_arch_list(bad)


def test_gencode_flags_add_ptx_only_where_asked():
    assert cuda_toolkit.gencode_flags(("8.0", "9.0+PTX")) == [
        "-gencode=arch=compute_80,code=sm_80",
        "-gencode=arch=compute_90,code=sm_90",
        "-gencode=arch=compute_90,code=compute_90",
    ]


def test_argument_beats_environment_beats_visible_gpus(monkeypatch):
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "7.5")
    monkeypatch.setattr(cuda_toolkit, "visible_device_archs", lambda: ("9.0",))
    assert cuda_toolkit.resolve_archs("8.0;9.0") == (("8.0", "9.0"), "cuda_arch")
    assert cuda_toolkit.resolve_archs(None) == (("7.5",), "TORCH_CUDA_ARCH_LIST")
    monkeypatch.delenv("TORCH_CUDA_ARCH_LIST")
    assert cuda_toolkit.resolve_archs(None) == (("9.0",), "the visible GPUs")


def test_a_build_covers_devices_of_its_archs_or_above_its_ptx():
    assert cuda_toolkit.archs_cover(("8.0", "9.0"), ("8.0",))
    assert cuda_toolkit.archs_cover(("8.0", "9.0"), ("8.0", "9.0"))
    assert not cuda_toolkit.archs_cover(("8.0",), ("9.0",))
    assert cuda_toolkit.archs_cover(("8.0+PTX",), ("9.0",))
    assert not cuda_toolkit.archs_cover(("9.0+PTX",), ("8.0",))
    assert not cuda_toolkit.archs_cover(("8.0",), ())


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs a CUDA compiler: nvcc is not on PATH")
def test_this_machines_nvcc_is_found_with_its_toolkit_headers():
    found = [c for c in cuda_toolkit.find_nvcc_candidates() if c.origin == "PATH"]
    assert found, "nvcc is on PATH but was not found"
    nvcc = found[0]
    assert nvcc.version >= (11, 0)
    assert (nvcc.root / "include" / "cuda_runtime_api.h").is_file(), nvcc
    assert cuda_toolkit.select_nvcc(f"{nvcc.version[0]}.0", found) == nvcc
