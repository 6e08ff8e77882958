"""The `cuda_emulation` tier: the source of csrc/sru_cuda_kernels.cu compiled as C++ and run
serially on the CPU through the real CUDA binding's plumbing, checked against the CPU kernels
and the float64 reference in every variant and storage dtype (no GPU needed)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from sru_lightning._resources import csrc_dir
from sru_lightning.diagnostics import cuda_emulation, kernel_parity
from sru_lightning.ops import build, functional

pytestmark = [pytest.mark.cuda_emulation, pytest.mark.toolchain]
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module", autouse=True)
def emulated_ops():
    """The emulation, compiled (or found in the cache) and loaded once for all these tests."""
    return cuda_emulation.emulated_ops()


def threads_per_block() -> int:
    source = (csrc_dir() / "sru_cuda_kernels.cu").read_text()
    return int(re.search(r"kThreadsPerBlock = (\d+);", source).group(1))


@pytest.mark.parametrize("dtype_name", ["fp32", "fp64", "fp16", "bf16"])
def test_emulated_cuda_kernels_match_the_cpu_kernels_and_the_reference(dtype_name):
    comparison = cuda_emulation.compare_emulated_kernels(dtype_name)
    assert comparison.passed, comparison.failures
    assert comparison.variants == len(kernel_parity.VARIANTS)


def test_the_variants_fill_whole_blocks_and_end_in_partial_ones():
    block = threads_per_block()
    columns = [v.shape[1] * (2 if v.bidirectional else 1) * v.shape[2] for v in kernel_parity.VARIANTS]
    assert any(c % block == 0 and c >= block for c in columns), "no variant of whole blocks only"
    assert any(c > block and c % block != 0 for c in columns), "no variant with several blocks and a partial last one"
    assert any(c < block for c in columns), "no variant smaller than one block"


def test_the_emulated_ops_have_their_own_namespace_and_the_cpu_kernels_come_back(emulated_ops):
    ops = emulated_ops
    tensors = kernel_parity.make_inputs(kernel_parity.Variant("basic"), torch.float32)
    args = (
        tensors["U"],
        tensors["x"],
        tensors["weight_c"],
        tensors["bias"],
        tensors["c0"],
        None,
        1.0,
        None,
        None,
        None,
        None,
        False,
        True,
        False,
    )
    emulated = ops.recurrence_forward(*args)
    cpu = torch.ops.sru_lightning.recurrence_forward(*args)
    with cuda_emulation.emulated_cuda_kernels():
        routed = torch.ops.sru_lightning.recurrence_forward(*args)
    after = torch.ops.sru_lightning.recurrence_forward(*args)
    # The device's expf and the CPU kernels' vectorised exponential round differently.
    assert torch.equal(routed[0], emulated[0]) and not torch.equal(emulated[0], cpu[0])
    assert torch.equal(after[0], cpu[0])
    torch.testing.assert_close(emulated[0], cpu[0], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.float64], ids=str)
def test_vector_and_scalar_loads_of_U_agree(dtype):
    # k == 4: an aligned U takes the one-vector load, U one element off its alignment the scalar loads.
    variant = kernel_parity.Variant("k4", k=4, mask_pad=True)
    inputs = kernel_parity.make_inputs(variant, dtype)
    shifted = torch.empty(inputs["U"].numel() + 1, dtype=dtype)[1:].view(inputs["U"].shape)
    shifted.copy_(inputs["U"])
    assert shifted.data_ptr() % (4 * shifted.element_size()) != 0
    expected = kernel_parity.run_recurrence(inputs, variant, "cpu")
    with cuda_emulation.emulated_cuda_kernels():
        aligned = kernel_parity.run_recurrence(inputs, variant, "cpu")
        misaligned = kernel_parity.run_recurrence({**inputs, "U": shifted}, variant, "cpu")
    for name, value in expected.items():
        assert torch.equal(aligned[name], misaligned[name]), name
        torch.testing.assert_close(aligned[name], value, rtol=5e-3, atol=5e-3)


def test_the_emulation_is_keyed_by_every_header_and_kernel_file(tmp_path):
    # A header the emulation list never named, or an edited copy of the kernels, is a new build.
    plain = build.emulation_variant()
    assert {path.name for path in plain.included} >= {p.name for p in csrc_dir().glob("*.h")} | {"sru_cuda_kernels.cu"}
    for name in build.EMULATION_KERNEL_FILES:
        shutil.copy(csrc_dir() / name, tmp_path / name)
    assert build.emulation_variant(tmp_path).build_spec().name == plain.build_spec().name
    (tmp_path / "sru_step.h").write_text((csrc_dir() / "sru_step.h").read_text() + "\n// edited\n")
    edited = build.emulation_variant(tmp_path).build_spec()
    sanitized = build.emulation_variant(sanitize=True).build_spec()
    assert len({plain.build_spec().name, edited.name, sanitized.name}) == 3
    assert plain.build_spec().name.startswith("sru_lightning_cuda_emulation_")
    with pytest.raises(FileNotFoundError, match="lacks"):
        build.emulation_variant(tmp_path / "nowhere")


def test_a_second_emulation_build_in_one_process_is_refused(tmp_path):
    for name in build.EMULATION_KERNEL_FILES:
        shutil.copy(csrc_dir() / name, tmp_path / name)
    (tmp_path / "sru_cuda_kernels.cu").write_text((csrc_dir() / "sru_cuda_kernels.cu").read_text() + "\n// copy\n")
    with pytest.raises(RuntimeError, match="already loaded .* in a new process"):
        build.load_emulation(tmp_path)


def test_an_empty_sequence_keeps_the_initial_state():
    # L == 0: the kernels run no step and must not prefetch one.
    U, x, c0 = torch.randn(0, 2, 6), torch.randn(0, 2, 2), torch.randn(2, 2)
    weight_c, bias = torch.randn(4), torch.randn(4)
    with cuda_emulation.emulated_cuda_kernels():
        h, c_last = functional.sru_recurrence(U, x, weight_c, bias, c0)
    assert h.shape == (0, 2, 2) and torch.equal(c_last, c0)


# -- under AddressSanitizer, and with bugs injected into a copy of the .cu ----------------------
SMALL_VARIANTS = [v.name for v in kernel_parity.VARIANTS if v.name != "large"]

INJECTED_BUGS = {
    # forward: the reset gate reads the forget gate's weight
    1: (
        "forward_step<A>(now.u0, now.u1, now.u2, now.skip, now.wf, now.wr,",
        "forward_step<A>(now.u0, now.u1, now.u2, now.skip, now.wf, sru_injected_bug() == 1 ? now.wf : now.wr,",
    ),
    # backward: the reset bias collects the forget gate's gradient
    2: ("sum_br += g.u2;", "sum_br += sru_injected_bug() == 2 ? g.u1 : g.u2;"),
    # indexing: the last column reads one column past the end of U
    3: (
        "const T* u = U + s.offset * dims.k;",
        "const T* u = U + (s.offset + (sru_injected_bug() == 3 ? 1 : 0)) * dims.k;",
    ),
    # documents: the gradient crosses a document boundary into the previous document
    4: (
        "grad_c = now.restart ? A(0) : g.c_prev;",
        "grad_c = now.restart && sru_injected_bug() != 4 ? A(0) : g.c_prev;",
    ),
}
BUG_SWITCH = """#include <cstdlib>
static int sru_injected_bug() {
  static const int bug = std::getenv("SRU_INJECTED_BUG") ? std::atoi(std::getenv("SRU_INJECTED_BUG")) : 0;
  return bug;
}
"""


def run_emulation(arguments, environment, timeout=900):
    return subprocess.run(
        [sys.executable, "-m", "sru_lightning.diagnostics.cuda_emulation", *arguments],
        cwd=REPO,
        env=environment,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.mark.slow
def test_the_emulated_kernels_run_clean_under_address_sanitizer():
    completed = run_emulation(["--sanitize", "--variants", *SMALL_VARIANTS], cuda_emulation.sanitizer_environment())
    output = completed.stdout + completed.stderr
    assert completed.returncode == 0, output[-4000:]
    assert output.count(": PASS ") == 4 and "AddressSanitizer" not in output, output[-4000:]


@pytest.mark.slow
def test_bugs_injected_into_the_cuda_source_fail_the_tier(tmp_path):
    kernels_dir = tmp_path / "kernels"
    kernels_dir.mkdir()
    for name in build.EMULATION_KERNEL_FILES:
        shutil.copy(csrc_dir() / name, kernels_dir / name)
    kernels = kernels_dir / "sru_cuda_kernels.cu"
    text = kernels.read_text()
    for bug, (original, injected) in INJECTED_BUGS.items():
        assert text.count(original) == 1, f"bug {bug}: the .cu no longer contains {original!r}; update the test"
        text = text.replace(original, injected)
    kernels.write_text(text.replace("namespace sru_lightning {", BUG_SWITCH + "namespace sru_lightning {", 1))

    arguments = [
        "--kernels-dir",
        str(kernels_dir),
        "--dtypes",
        "fp32",
        "bf16",
        "--variants",
        "basic",
        "k4 (skip from U)",
        "mask_pad",
        "documents",
    ]
    # Wrong math needs only the comparison; reading out of bounds needs AddressSanitizer.
    plain, sanitized = dict(os.environ), cuda_emulation.sanitizer_environment()
    outcomes = {bug: run_emulation(arguments, {**plain, "SRU_INJECTED_BUG": str(bug)}) for bug in (0, 1, 2, 4)}
    outcomes[3] = run_emulation(arguments + ["--sanitize"], {**sanitized, "SRU_INJECTED_BUG": "3"})
    text_of = {bug: done.stdout + done.stderr for bug, done in outcomes.items()}
    assert outcomes[0].returncode == 0, text_of[0][-3000:]  # the patched copy itself is sound
    # forward bug: h is wrong; backward bug: only the bias gradient is
    assert outcomes[1].returncode == 1 and "FAIL" in text_of[1] and re.search(r"vs reference: .*\bh\b", text_of[1])
    assert outcomes[2].returncode == 1 and "grad_bias" in text_of[2] and not re.search(r"\bh \d", text_of[2])
    # gradient across a document boundary: the forward is right, the gradients of "documents" are not
    assert outcomes[4].returncode == 1 and "documents" in text_of[4] and "grad_U" in text_of[4], text_of[4][-3000:]
    # reading past U: AddressSanitizer stops the process, as compute-sanitizer would report it
    assert outcomes[3].returncode != 0 and "heap-buffer-overflow" in text_of[3], text_of[3][-3000:]
