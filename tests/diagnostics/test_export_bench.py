"""`bench export`: the default models eagerly and from their exports, interleaved, one table."""

from __future__ import annotations

import pytest

pytest.importorskip("onnxruntime", reason="needs the `export` extra: pip install 'sru_lightning[export]'")

from sru_lightning.diagnostics import export_bench  # noqa: E402


@pytest.mark.slow
def test_export_bench_times_every_model_on_every_backend_with_ratios_to_eager_and_to_the_lstm():
    config = export_bench.ExportBenchConfig(
        tokens=2, length=8, batch=2, repeats=1, warmup=0, backends=("eager", "onnxruntime")
    )
    table = export_bench.format_table(export_bench.run_export_benchmark(config))
    lines = table.splitlines()
    assert lines[0].startswith("Export benchmark: default models, threads=1, decoding step at B=1 (2 chained steps)")
    rows = {(line[:22].strip(), line[22:35].strip()): line[35:].split() for line in lines[2:8]}
    models = ("SRU (model=sru)", "SRU++ (model=srupp)", "nn.LSTM (model=lstm)")
    assert set(rows) == {(model, backend) for model in models for backend in ("eager", "onnxruntime")}
    for model in models:
        eager = rows[(model, "eager")]
        assert eager[2] == eager[5] == "1.00"  # x eager of eager itself
        assert float(rows[(model, "onnxruntime")][0]) > 0
    lstm = rows[("nn.LSTM (model=lstm)", "onnxruntime")]
    assert lstm[3] == lstm[6] == "1.00"  # x LSTM of the LSTM itself
    assert "export time: SRU onnx" in lines[-2]
