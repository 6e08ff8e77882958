"""`bench data`: the generated corpus, the table and its ratios, and (slow) a whole small run."""

from __future__ import annotations

import pytest

from sru_lightning.diagnostics import data_bench


def test_the_corpus_is_the_size_asked_for_made_of_python_sources(tmp_path):
    path = data_bench.write_corpus(tmp_path / "corpus.txt", 1)
    text = path.read_text(encoding="utf-8")
    assert len(text) == 10**6 and "def " in text and "import " in text


def test_sizes_are_positive_integers():
    assert data_bench.parse_sizes("30, 300,2000") == [30, 300, 2000]
    for bad in ("", "30,x", "0", "-5"):
        with pytest.raises(ValueError, match="`sizes` must be comma-separated positive integers"):
            data_bench.parse_sizes(bad)


PREPARE = {
    "prepare_char_mb_s": 20.0,
    "prepare_char_mb_cpu_s": 30.0,
    "prepare_bpe_mb_s": 1.0,
    "prepare_bpe_mb_cpu_s": 1.5,
    "bpe_learning_mb_s": 2.0,
    "bpe_encoding_mb_s": 8.0,
    "bpe_mb": 30,
}


def test_the_table_states_the_goals_ratios():
    fit = {"peak_rss_mib": 500.0, "first_step_s": 4.0, "setup_s": 2.0, "tokens_per_s": 1000.0}
    rows = [
        {
            "size_mb": 30,
            **PREPARE,
            "shards": fit,
            "memory": {**fit, "tokens_per_s": 800.0},
        },
        {
            "size_mb": 300,
            **PREPARE,
            "shards": {**fit, "peak_rss_mib": 550.0, "first_step_s": 5.0, "setup_s": 2.1},
        },
    ]
    table = data_bench.format_table(data_bench.DataBenchConfig(), rows)
    assert (
        "shards, 300 MB vs 30 MB: peak RSS x1.10, time to first step x1.25 (after the imports: 2.10 s vs 2.00 s, x1.05)"
        in table
    )
    assert "30 MB: tokens/s from shards / in memory = 1.250" in table
    assert "in memory" in table and table.count("shards") >= 2
    assert (
        "30 MB: prepare char 30.0 MB per CPU-second; BPE on 30 MB 1.50 MB per CPU-second, learning the "
        "vocabulary 2.00 MB/s, encoding 8.00 MB/s" in table
    )


@pytest.mark.slow
def test_a_small_run_measures_both_paths(tmp_path):
    config = data_bench.DataBenchConfig(sizes="1", repeats=2, warmup=1, out=str(tmp_path), bpe_mb=1)
    (row,) = data_bench.run_data_benchmark(config)
    assert row["prepare_char_mb_s"] > 0 and row["prepare_bpe_mb_s"] > 0
    assert row["bpe_learning_mb_s"] > row["prepare_bpe_mb_s"] and row["bpe_encoding_mb_s"] > row["prepare_bpe_mb_s"]
    assert row["prepare_char_mb_cpu_s"] > 0 and row["prepare_bpe_mb_cpu_s"] > 0
    for path in ("shards", "memory"):
        assert 100 < row[path]["peak_rss_mib"] < 10_000
        assert 0 < row[path]["first_step_s"] < 600 and row[path]["tokens_per_s"] > 0
        assert 0 < row[path]["setup_s"] < row[path]["first_step_s"]
