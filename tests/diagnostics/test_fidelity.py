"""Fidelity table: half storage with float accumulation beats all-half arithmetic by >= 2x."""

import pytest
import torch

from sru_lightning.diagnostics.fidelity import fidelity_table, format_table, main


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
    assert main(["--length", "16", "--batch", "2", "--hidden", "8", "--bidirectional"]) == 0
    out = capsys.readouterr().out
    assert "L=16 B=2 D=8 bidirectional" in out
    lines = out.splitlines()
    assert lines[1].split()[:4] == ["storage", "backend", "h", "err"]
    assert [line.split()[0] for line in lines[3:]] == ["float32", "float16", "bfloat16"]


def test_command_rejects_bad_sizes_naming_the_option(capsys):
    with pytest.raises(SystemExit):
        main(["--length", "0"])
    assert "`--length` must be a positive int, got 0" in capsys.readouterr().err


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU: torch.cuda.is_available() is False")
def test_cuda_kernel_meets_the_same_target():
    rows = {row.storage_dtype: row for row in fidelity_table(length=128, batch=8, hidden=32, device="cuda")}
    for dtype in (torch.float16, torch.bfloat16):
        assert rows[dtype].h_error <= 0.5 * rows[dtype].all_half_h_error, format_table(list(rows.values()))
        assert rows[dtype].grad_error <= 0.5 * rows[dtype].all_half_grad_error, format_table(list(rows.values()))
