"""Fidelity table: half storage with float accumulation beats all-half arithmetic by >= 2x;
the error measure and the input builder it shares with the kernel comparisons."""

import math

import pytest
import torch

from sru_lightning.diagnostics.fidelity import fidelity_table, format_table, main
from sru_lightning.ops.testing import recurrence_inputs, relative_error


@pytest.fixture(scope="module")
def rows():
    return {row.storage_dtype: row for row in fidelity_table(length=128, batch=8, hidden=32)}


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_storage_with_float_accumulation_has_at_most_half_the_all_half_error(rows, dtype):
    row = rows[dtype]
    assert row.h_error <= 0.5 * row.all_half_h_error, format_table(list(rows.values()))
    assert row.grad_error <= 0.5 * row.all_half_grad_error, format_table(list(rows.values()))


def test_errors_are_at_the_level_of_each_storage_dtype(rows):
    # fp32 storage is float32-exact; half storage errors sit near their dtype's rounding.
    assert rows[torch.float32].h_error < 1e-6 and rows[torch.float32].grad_error < 1e-5
    assert rows[torch.float32].all_half_h_error is None
    assert rows[torch.float16].h_error < 4 * torch.finfo(torch.float16).eps
    assert rows[torch.bfloat16].h_error < 4 * torch.finfo(torch.bfloat16).eps
    assert rows[torch.float16].h_error < rows[torch.bfloat16].h_error


def test_command_prints_the_table(capsys):
    assert main(["length=16", "batch=2", "hidden=8", "bidirectional=true"]) == 0
    out = capsys.readouterr().out
    assert "L=16 B=2 D=8 bidirectional" in out
    lines = out.splitlines()
    assert lines[1].split()[:4] == ["storage", "backend", "h", "err"]
    assert [line.split()[0] for line in lines[3:]] == ["float32", "float16", "bfloat16"]


def test_command_rejects_bad_settings_naming_the_setting(capsys):
    assert main(["length=0"]) == 2
    assert "fidelity: error: `length` must be an integer >= 1, got 0" in capsys.readouterr().err
    assert main(["device=gpu"]) == 2
    assert "fidelity: error: `device` must be cpu, cuda or cuda:N, got 'gpu'" in capsys.readouterr().err


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU: torch.cuda.is_available() is False")
def test_cuda_kernel_meets_the_same_target():
    rows = {row.storage_dtype: row for row in fidelity_table(length=128, batch=8, hidden=32, device="cuda")}
    for dtype in (torch.float16, torch.bfloat16):
        assert rows[dtype].h_error <= 0.5 * rows[dtype].all_half_h_error, format_table(list(rows.values()))
        assert rows[dtype].grad_error <= 0.5 * rows[dtype].all_half_grad_error, format_table(list(rows.values()))


def test_relative_error_nan_rule():
    nan, inf = float("nan"), float("inf")
    assert relative_error(torch.tensor([1.0, 2.2]), torch.tensor([1.0, 2.0])) == pytest.approx(0.1)
    # NaN (or inf) where the reference is finite: infinitely wrong, on either side
    assert relative_error(torch.tensor([nan, 2.0]), torch.tensor([1.0, 2.0])) == math.inf
    assert relative_error(torch.tensor([1.0, 2.0]), torch.tensor([nan, 2.0])) == math.inf
    assert relative_error(torch.tensor([inf, 2.0]), torch.tensor([1.0, 2.0])) == math.inf
    # the same non-finite value at the same place: equal there, the rest is measured
    assert relative_error(torch.tensor([nan, 2.2]), torch.tensor([nan, 2.0])) == pytest.approx(0.1)
    assert relative_error(torch.tensor([-inf, 2.2]), torch.tensor([-inf, 2.0])) == pytest.approx(0.1)
    assert relative_error(torch.tensor([inf, 2.0]), torch.tensor([-inf, 2.0])) == math.inf
    assert relative_error(torch.zeros(3), torch.zeros(2)) == math.inf
    assert relative_error(torch.zeros(0), torch.zeros(0)) == 0.0


def test_fidelity_inputs_hold_a_forget_bias_and_a_gradient_of_h():
    inputs = recurrence_inputs(6, 2, 3, bidirectional=True, forget_bias=2.0, with_grad_h=True, seed=4)
    assert torch.equal(inputs["bias"], torch.tensor([2.0] * 6 + [0.0] * 6, dtype=torch.float64))
    assert inputs["grad_h"].shape == inputs["x"].shape == (6, 2, 6)
    again = recurrence_inputs(6, 2, 3, bidirectional=True, forget_bias=2.0, with_grad_h=True, seed=4)
    assert all(torch.equal(again[name], value) for name, value in inputs.items() if value is not None)


def test_input_builder_names_a_bad_mask_pad_style():
    with pytest.raises(ValueError, match="`mask_pad` must be one of \\('fixed', 'random'\\), got 'tail'"):
        recurrence_inputs(4, 2, 3, mask_pad="tail")
