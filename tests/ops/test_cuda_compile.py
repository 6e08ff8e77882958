"""The CUDA kernels: `nvcc -c` of csrc/sru_cuda_kernels.cu wherever nvcc exists (it needs
only c10/util headers, present in every torch wheel), and CUDA numerics on a GPU."""

from __future__ import annotations

import glob
import os
import shutil
import subprocess

import pytest
import torch
from torch.utils import cpp_extension

from sru_lightning import ops
from sru_lightning._resources import csrc_dir
from sru_lightning.ops.testing import make_case, run_with_grads

NVCC = shutil.which("nvcc")


def cuda_include_dir():
    """Folder with cuda_runtime_api.h: $CUDA_HOME, torch's CUDA_HOME or /usr/local/cuda*."""
    candidates = [os.environ.get("CUDA_HOME"), cpp_extension.CUDA_HOME] + sorted(glob.glob("/usr/local/cuda*"))
    for root in filter(None, candidates):
        if os.path.exists(os.path.join(root, "include", "cuda_runtime_api.h")):
            return os.path.join(root, "include")
    return None


@pytest.mark.toolchain
@pytest.mark.skipif(NVCC is None, reason="needs the CUDA compiler: nvcc is not on PATH")
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_nvcc_compiles_the_kernels(arch, tmp_path):
    includes = [f"-I{csrc_dir()}"]
    for path in cpp_extension.include_paths():
        includes += ["-isystem", str(path)]
    compute = arch.replace("sm_", "compute_")
    command = [
        NVCC,
        "-c",
        str(csrc_dir() / "sru_cuda_kernels.cu"),
        "-o",
        str(tmp_path / "kernels.o"),
        "-std=c++17",
        "-O1",
        f"-gencode=arch={compute},code={arch}",
        *includes,
    ]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-4000:]
    symbols = (tmp_path / "kernels.o").read_bytes()
    for launcher in (b"launch_forward", b"launch_backward"):
        assert launcher in symbols


@pytest.mark.toolchain
@pytest.mark.skipif(cuda_include_dir() is None, reason="needs the CUDA toolkit headers (cuda_runtime_api.h)")
def test_cuda_binding_compiles_against_the_torch_headers(tmp_path):
    # A CPU wheel lacks only the generated c10/cuda/impl/cuda_cmake_macros.h; a placeholder
    # stands in for it so the binding's tensor plumbing and launcher calls are type-checked.
    macros = tmp_path / "c10" / "cuda" / "impl" / "cuda_cmake_macros.h"
    macros.parent.mkdir(parents=True)
    macros.write_text("#pragma once\n")
    compiler = os.environ.get("CXX", "c++")
    command = [compiler, "-fsyntax-only", "-std=c++20", f"-I{csrc_dir()}", f"-I{tmp_path}"]
    for path in cpp_extension.include_paths() + [cuda_include_dir()]:
        command += ["-isystem", str(path)]
    command.append(str(csrc_dir() / "sru_cuda.cpp"))
    result = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-4000:]


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("storage", [torch.float64, torch.float32, torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize(
    "variant",
    [
        dict(bidirectional=True, with_mask_c=True, with_mask_pad=True),
        dict(k=4, per_step_weight_c=True),
        dict(has_skip_term=False, with_c0=False, with_mask_pad=True),
    ],
    ids=["bi-k3-masks", "uni-k4-per-step-v", "no-skip-no-c0"],
)
def test_cuda_kernel_matches_cpu_kernel(storage, variant):
    from sru_lightning.ops import op

    ops.load_cuda_extension()  # raises with the cause when the CUDA extension cannot be built
    assert op.cuda_kernels_loaded(), "CUDA extension loaded but its kernels are not registered"
    tensors, kwargs = make_case(length=7, batch=5, hidden=33, dtype=storage, **variant)
    to_cuda = lambda t: None if t is None else t.cuda()  # noqa: E731
    kwargs_cuda = {k: (to_cuda(v) if torch.is_tensor(v) else v) for k, v in kwargs.items()}
    with ops.trace_storage_dtypes() as calls:
        h, c_last, grads = run_with_grads(ops.sru_recurrence, [to_cuda(t) for t in tensors], kwargs_cuda)
    assert {(call.device_type, call.backend) for call in calls} == {("cuda", "cpp")}
    h_cpu, c_cpu, grads_cpu = run_with_grads(ops.sru_recurrence, tensors, kwargs)
    tolerance = {torch.float64: 1e-10, torch.float32: 1e-5, torch.float16: 4e-3, torch.bfloat16: 3e-2}[storage]
    torch.testing.assert_close(h.cpu(), h_cpu, rtol=tolerance, atol=tolerance)
    torch.testing.assert_close(c_last.cpu(), c_cpu, rtol=tolerance, atol=tolerance)
    for got, expected in zip(grads, grads_cpu):
        if expected is not None:
            torch.testing.assert_close(got.cpu(), expected, rtol=10 * tolerance, atol=10 * tolerance)
