"""The benchmark command runs end to end on tiny sizes (structure, not speed)."""

from __future__ import annotations

import pytest
import torch

from sru_lightning.diagnostics import bench

TINY = [
    "--length",
    "4",
    "--batch",
    "2",
    "--hidden",
    "8",
    "--layers",
    "2",
    "--repeats",
    "2",
    "--warmup",
    "1",
    "--threads",
    "1",
]


def test_saved_tensor_bytes_counts_each_storage_once():
    a = torch.randn(10, requires_grad=True)
    b = torch.randn(10, requires_grad=True)
    assert bench.saved_tensor_bytes(lambda: a * b) == 2 * 10 * 4
    assert bench.saved_tensor_bytes(lambda: a * a) == 10 * 4
    assert bench.saved_tensor_bytes(lambda: (a.detach() * 2).sum()) == 0


def test_bench_prints_table_and_draws_chart(tmp_path, capsys):
    chart = tmp_path / "bench.png"
    assert bench.main(TINY + ["--no-peer", "--plot", str(chart)]) == 0
    output = capsys.readouterr().out
    lines = output.splitlines()
    assert lines[0].startswith("SRU benchmark: L=4 B=2 D=8 layers=2 dtype=fp32 threads=1 (best of 2)")
    rows = {line.split("  ")[0].strip(): line for line in lines[2:]}
    for model in ("SRU (sru_lightning)", "nn.LSTM", "nn.GRU", "GEMM floor"):
        assert model in rows, output
    lstm_columns, gru_columns = rows["nn.LSTM"].split(), rows["nn.GRU"].split()
    assert lstm_columns[2] == "1.000" and lstm_columns[-2] == "1.000"  # its own ratios
    assert gru_columns[3] == "1.000" and gru_columns[-1] == "1.000"
    assert "recurrence op alone" not in output  # float32 has no half/fp32 ratio to show
    assert "saved for backward, SRU stack" in output and "ratio" in output
    assert chart.exists() and chart.stat().st_size > 1000


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_half_dtype_bench_reports_same_dtype_ratios_and_the_kernel_ratio(capsys, dtype):
    assert bench.main(TINY + ["--no-peer", "--dtype", dtype]) == 0
    output = capsys.readouterr().out
    assert f"dtype={dtype}" in output.splitlines()[0]
    rows = {line.split("  ")[0].strip(): line.split() for line in output.splitlines()[2:]}
    assert rows["nn.LSTM"][2] == "1.000" and rows["GEMM floor"][5] == "1.000"  # "GEMM floor" is two words
    kernel = next(line for line in output.splitlines() if line.startswith("recurrence op alone"))
    half_ms, fp32_ms, ratio = (float(kernel.split()[i]) for i in (7, 10, 13))
    assert ratio == pytest.approx(half_ms / fp32_ms, rel=0.05)  # the times are printed rounded


def test_half_policy_saves_less_than_fp32():
    saved = bench.measure_saved_bytes(bench.BenchConfig(length=4, batch=2, hidden=8, layers=2))
    assert 0 < saved["half (bf16 autocast)"] < saved["fp32"]


def test_bench_rejects_bad_sizes(capsys):
    with pytest.raises(SystemExit):
        bench.main(["--hidden", "0"])
    assert "--hidden must be >= 1, got 0" in capsys.readouterr().err


@pytest.mark.peer
@pytest.mark.slow
def test_bench_includes_the_sru_package(capsys):
    assert bench.main(TINY) == 0
    assert "sru package" in capsys.readouterr().out


def test_bench_restores_the_thread_count():
    before = torch.get_num_threads()
    bench.run_benchmark(
        bench.BenchConfig(
            length=2, batch=1, hidden=4, layers=1, repeats=1, warmup=0, threads=before + 1, include_peer=False
        )
    )
    assert torch.get_num_threads() == before


def test_decode_bench_times_the_default_model_and_the_same_size_lstm_through_generate(capsys):
    assert bench.main(["--decode", "--tokens", "5", "--repeats", "1", "--warmup", "0", "--threads", "1"]) == 0
    output = capsys.readouterr().out
    lines = output.splitlines()
    assert lines[0].startswith("Decoding benchmark: default model: embedding 64, hidden 256, 3 layers")
    assert "5 tokens per run, threads=1 (best of 1)" in lines[0]
    rows = {line.split("  ")[0].strip(): line.split() for line in lines[2:5]}
    assert set(rows) == {"SRU (model=sru)", "SRU++ (model=srupp)", "nn.LSTM (model=lstm)"}
    lstm = rows["nn.LSTM (model=lstm)"]
    assert lstm[-1] == lstm[-3] == "1.00"  # its own ratios
    assert float(rows["SRU (model=sru)"][-4]) > 0


def test_documents_bench_times_packed_against_padded_and_the_op_with_and_without_boundaries(capsys):
    arguments = ["--documents", "--length", "16", "--batch", "2", "--hidden", "8", "--repeats", "2", "--warmup", "0"]
    assert bench.main(arguments) == 0
    packing, overhead = capsys.readouterr().out.split("\n\n")
    packing_lines = packing.splitlines()
    assert packing_lines[0].startswith("training on 8 documents of 1..16 tokens")
    layouts = {line[:28].strip(): line[28:].split() for line in packing_lines[2:]}
    assert sorted(layouts) == ["packed (reset)", "padded (mask_pad)"] and layouts["padded (mask_pad)"][1] == "1.00"
    assert all(float(rate) > 0 and float(ratio) > 0 for rate, ratio in layouts.values())
    lines = overhead.strip().splitlines()
    assert lines[0].startswith("recurrence op, forward+backward, float32, L=16 B=2 D=8")
    rows = {line[:28].strip(): line[28:].split() for line in lines[2:]}
    assert sorted(rows) == sorted(["no flags (reset=None)", "flags, no boundary", "a document every 32 steps"])
    assert rows["no flags (reset=None)"][1] == "1.000"
    assert all(float(ms) > 0 and float(ratio) > 0 for ms, ratio in rows.values())


def test_packed_and_padded_batches_hold_the_same_documents_and_predictions():
    from sru_lightning.diagnostics import documents_bench

    documents = [torch.arange(1, n + 1) for n in (5, 1, 8, 3, 6)]
    padded = documents_bench.padded_batches(documents, batch=2, length=8)
    packed = documents_bench.packed_batches(documents, batch=2, length=8)
    predicted = sum(d.numel() - 1 for d in documents)
    for batches in (padded, packed):
        assert sum(int((targets != -100).sum()) for _, targets, _, _ in batches) == predicted
    real = sum(int((~mask_pad).sum()) for _, _, mask_pad, _ in padded)
    assert real == sum(d.numel() for d in documents) and sum(t.shape[0] for t, *_ in padded) == 5
    stream = torch.cat([tokens.reshape(-1) for tokens, *_ in packed])[:23]
    starts = torch.cat([reset.reshape(-1) for *_, reset in packed])[:23]
    assert torch.equal(stream, torch.cat(documents)) and starts.nonzero().flatten().tolist() == [0, 5, 6, 14, 17]
