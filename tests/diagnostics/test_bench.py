"""The benchmark command and its subcommands run end to end on tiny sizes (structure, not speed)."""

from __future__ import annotations

import pytest
import torch

from sru_lightning.diagnostics import bench, op_bench, op_levels, step_breakdown

TINY = [
    "length=4",
    "batch=2",
    "hidden=8",
    "layers=2",
    "repeats=2",
    "warmup=1",
    "threads=1",
    "levels=none",
]


def test_saved_tensor_bytes_counts_each_storage_once():
    a = torch.randn(10, requires_grad=True)
    b = torch.randn(10, requires_grad=True)
    assert op_bench.saved_tensor_bytes(lambda: a * b) == 2 * 10 * 4
    assert op_bench.saved_tensor_bytes(lambda: a * a) == 10 * 4
    assert op_bench.saved_tensor_bytes(lambda: (a.detach() * 2).sum()) == 0


def test_bench_prints_table_and_draws_chart(tmp_path, capsys):
    chart = tmp_path / "bench.png"
    assert bench.main(["op", *TINY, "include_peer=false", f"plot={chart}"]) == 0
    output = capsys.readouterr().out
    lines = output.splitlines()
    assert lines[0].startswith("SRU benchmark: L=4 B=2 D=8 layers=2 dtype=fp32 threads=1 (best of 2)")
    rows = {line.split("  ")[0].strip(): line for line in lines[2:]}
    for model in ("SRU (sru_lightning)", "nn.LSTM", "nn.GRU", "GEMM floor"):
        assert model in rows, output
    lstm_columns, gru_columns = rows["nn.LSTM"].split(), rows["nn.GRU"].split()
    assert lstm_columns[2] == "1.000" and lstm_columns[-2] == "1.000"  # its own ratios
    assert gru_columns[3] == "1.000" and gru_columns[-1] == "1.000"
    assert "recurrence op alone" not in output  # levels=none
    assert "saved for backward, SRU stack" in output and "ratio" in output
    assert chart.exists() and chart.stat().st_size > 1000


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_half_dtype_bench_reports_same_dtype_ratios(capsys, dtype):
    assert bench.main(TINY + ["include_peer=false", f"dtype={dtype}"]) == 0
    output = capsys.readouterr().out
    assert f"dtype={dtype}" in output.splitlines()[0]
    rows = {line.split("  ")[0].strip(): line.split() for line in output.splitlines()[2:]}
    assert rows["nn.LSTM"][2] == "1.000" and rows["GEMM floor"][5] == "1.000"  # "GEMM floor" is two words


def _within_rounding(printed_ratio: float, numerator: float, denominator: float, half: float) -> bool:
    """Whether a ratio printed to 3 decimals fits two times that were rounded to +-`half` after it was worked out."""
    low = (numerator - half) / (denominator + half)
    high = (numerator + half) / max(denominator - half, 1e-9)
    return low - 0.0005 <= printed_ratio <= high + 0.0005


def _step_table(output: str) -> dict[str, list[float]]:
    lines = output.splitlines()
    first = lines.index(next(line for line in lines if line.startswith("SRU training step by phase"))) + 2
    rows = {}
    for line in lines[first:]:
        if not line.strip():
            break
        name, numbers = line[:30].strip(), line[30:].split()
        rows[name] = [float(number) for number in numbers]
    return rows


def test_bench_breaks_the_training_step_into_its_phases(capsys):
    assert bench.main(["op", *TINY, "include_peer=false"]) == 0
    output = capsys.readouterr().out
    assert "SRU training step by phase, 2 layers, fp32:" in output
    rows = _step_table(output)
    phases = [name for name in rows if name in step_breakdown.PHASES]
    assert phases == list(step_breakdown.PHASES)
    step, floor = rows["whole step"][0], rows["GEMM floor (the products)"][0]
    summed = sum(rows[name][0] for name in phases)
    assert rows["sum of the phases"][0] == pytest.approx(summed, abs=0.05)  # printed to 0.01 ms each
    assert rows["rest of the step"][0] == pytest.approx(step - rows["sum of the phases"][0], abs=0.02)
    products = [name for name in phases if not name.startswith("recurrence")]
    assert floor == pytest.approx(sum(rows[name][0] for name in products), abs=0.05)
    assert rows["whole step"][1] == 1.0
    assert _within_rounding(rows["whole step"][2], step, floor, half=0.005)  # times printed to 0.01 ms


def test_step_breakdown_sums_its_phases():
    breakdown = step_breakdown.StepBreakdown(
        {phase: float(index + 1) for index, phase in enumerate(step_breakdown.PHASES)}, step_ms=20.0
    )
    assert breakdown.phases_ms == 15.0
    assert breakdown.floor_ms == 1.0 + 4.0 + 5.0  # projection forward and its two gradients
    lines = step_breakdown.breakdown_lines(breakdown, "title")
    assert lines[0] == "title" and lines[-2].split() == ["whole", "step", "20.00", "1.000", "2.000"]


def test_level_table_divides_each_level_s_own_times():
    timings = op_levels.LevelTimings(
        "avx2",
        {
            "fp32": {"forward": 1.0, "backward": 3.0, "total": 4.0},
            "bf16": {"forward": 1.5, "backward": 1.5, "total": 3.0},
            "fp16": {"forward": 1.0, "backward": 1.0, "total": 2.0},
        },
    )
    assert op_levels.level_rows([timings]) == [
        ("avx2", "4.000", "3.000", "2.000", "0.750", "0.500", "1.500", "1.500", "1.500")
    ]


@pytest.mark.slow  # starts a process per level
def test_bench_times_the_op_in_each_storage_dtype_at_the_running_level(capsys):
    from sru_lightning.ops.op import cpu_vector_level

    level = cpu_vector_level()
    assert bench.main(["op", *TINY[:-1], "include_peer=false", f"levels={level}"]) == 0
    output = capsys.readouterr().out
    lines = output.splitlines()
    title = next(index for index, line in enumerate(lines) if line.startswith("recurrence op alone"))
    assert lines[title + 1].split()[:4] == ["level", "fp32", "ms", "bf16"]
    row = lines[title + 2].split()
    assert row[0] == level and "note:" not in output
    fp32, bf16, fp16 = (float(value) for value in row[1:4])
    assert _within_rounding(float(row[4]), bf16, fp32, half=0.0005)
    assert _within_rounding(float(row[6]), bf16, fp16, half=0.0005)


def test_bench_refuses_an_unknown_vector_level(capsys):
    assert bench.main(["op", "levels=avx512,sse9"]) == 2
    assert (
        "`levels` must be all, none, or vector levels separated by commas from baseline, avx2, avx512, "
        "avx512_bf16, got 'avx512,sse9'" in capsys.readouterr().err
    )


def test_levels_all_are_the_processor_s_widest_first():
    from sru_lightning.ops import cpu_levels

    levels = op_bench.selected_levels("all")
    assert levels[0] == cpu_levels.processor_level() and levels[-1] == "baseline"
    assert op_bench.selected_levels("baseline,avx2") == ("avx2", "baseline")
    assert op_bench.selected_levels("none") == ()


def test_half_policy_saves_less_than_fp32():
    saved = op_bench.measure_saved_bytes(op_bench.BenchConfig(length=4, batch=2, hidden=8, layers=2))
    assert 0 < saved["half (bf16 autocast)"] < saved["fp32"]


def test_bench_rejects_bad_sizes(capsys):
    assert bench.main(["hidden=0"]) == 2
    assert "bench op: error: `hidden` must be an integer >= 1, got 0" in capsys.readouterr().err


@pytest.mark.peer
@pytest.mark.slow
def test_bench_includes_the_sru_package(capsys):
    assert bench.main(TINY) == 0
    assert "sru package" in capsys.readouterr().out


def test_bench_restores_the_thread_count():
    before = torch.get_num_threads()
    op_bench.run_benchmark(
        op_bench.BenchConfig(
            length=2,
            batch=1,
            hidden=4,
            layers=1,
            repeats=1,
            warmup=0,
            threads=before + 1,
            include_peer=False,
            levels="none",  # the level table starts a process per level; the thread count is this process's
        )
    )
    assert torch.get_num_threads() == before


def test_decode_bench_times_the_default_model_and_the_same_size_lstm_through_generate(capsys):
    assert bench.main(["decode", "tokens=5", "repeats=1", "warmup=0", "threads=1"]) == 0
    output = capsys.readouterr().out
    lines = output.splitlines()
    assert lines[0].startswith("Decoding benchmark: default model: embedding 64, hidden 256, 3 layers")
    assert "5 tokens per run, threads=1 (best of 1)" in lines[0]
    rows = {line.split("  ")[0].strip(): line.split() for line in lines[2:5]}
    assert set(rows) == {"SRU (model=sru)", "SRU++ (model=srupp)", "nn.LSTM (model=lstm)"}
    lstm = rows["nn.LSTM (model=lstm)"]
    assert lstm[-1] == lstm[-3] == "1.00"  # its own ratios
    assert float(rows["SRU (model=sru)"][-4]) > 0


def test_hf_bench_times_transformers_generate_against_the_packages_decoding(capsys):
    pytest.importorskip("transformers", reason="bench hf needs the `hf` extra: pip install 'sru_lightning[hf]'")
    assert bench.main(["hf", "tokens=4", "repeats=1", "warmup=0", "threads=1"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("transformers generate() against the package's decoding: default model (hidden 256")
    rows = {line.split()[0]: line.split() for line in lines[2:4]}
    assert set(rows) == {"1", "16"}
    for _, package, transformers, ratio, _goal in rows.values():
        # the tokens/s are printed whole: the ratio of the printed figures is close to the printed ratio
        assert float(ratio) == pytest.approx(float(transformers) / float(package), rel=0.05)


def test_documents_bench_times_packed_against_padded_and_the_op_with_and_without_boundaries(capsys):
    arguments = ["documents", "length=16", "batch=2", "hidden=8", "repeats=2", "warmup=0"]
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
    # the boundaries fall inside the 16 steps (every 32 steps would mark only the first)
    assert sorted(rows) == sorted(["no flags (reset=None)", "flags, no boundary", "a document every 8 steps"])
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


def test_documents_bench_rows_never_exceed_the_length():
    from sru_lightning.diagnostics import documents_bench

    assert documents_bench.cases(128)[-1] == documents_bench.cases(64)[-1] == "a document every 32 steps"
    assert documents_bench.cases(16)[-1] == "a document every 8 steps"
    assert documents_bench.cases(1) == documents_bench.CASES  # no boundary fits inside one step
    config = documents_bench.DocumentsBenchConfig(length=1, batch=1, hidden=4, threads=1, repeats=1, warmup=0)
    assert list(documents_bench.measure_reset_overhead(config)) == list(documents_bench.CASES)


@pytest.mark.parametrize(
    "arguments, says",
    [
        (
            ["tokens=5"],
            "bench op: error: unknown setting 'tokens'; it is a setting of `bench decode`, `bench hf`, `bench export`, "
            "`bench serve`; `bench op` takes batch, dtype, hidden,",
        ),
        (["compile", "tokens=5"], "bench compile: error: unknown setting 'tokens'; it is a setting of `bench decode`"),
        (["decode", "layers=3"], "bench decode: error: unknown setting 'layers'; it is a setting of `bench op`;"),
        (
            ["documents", "--no-peer"],
            "bench documents: error: unknown setting '--no-peer'; it is a setting of `bench op`",
        ),
        (["export", "compile"], "bench export: error: expected key=value, got 'compile'; settings: threads, tokens,"),
        (["--decode"], "bench op: error: 'decode' is a subcommand, not a setting: `bench decode ...`"),
        (["xyzzy"], f"bench: error: unknown subcommand 'xyzzy'; choose one of: {', '.join(bench.MODES)}"),
        (["opp"], "unknown subcommand 'opp' (did you mean 'op'?)"),
        (["warmup=-1"], "bench op: error: `warmup` must be an integer >= 0, got -1"),
        (["op", "lenght=4"], "bench op: error: unknown setting 'lenght' (did you mean 'length'?); settings: length,"),
        (["op", "length=four"], "bench op: error: `length` must be an integer, got 'four'"),
        (["op", "include_peer=maybe"], "bench op: error: `include_peer` must be true or false, got 'maybe'"),
        (["op", "statistic=mean"], "bench op: error: `statistic` must be one of min, median, got 'mean'"),
        (["op", "--length"], "bench op: error: `--length` (now `length=...`) needs a value, got nothing"),
    ],
)
def test_bench_refuses_a_setting_its_subcommand_does_not_read_in_one_line(arguments, says, capsys):
    assert bench.main(arguments) == 2
    errors = capsys.readouterr().err.strip().splitlines()
    assert len(errors) == 1 and says in errors[0], errors


def _help(*words: str, capsys) -> str:
    assert bench.main([*words, "--help"]) == 0
    return " ".join(capsys.readouterr().out.split())


def test_each_subcommands_help_lists_only_its_settings_with_its_defaults(capsys):
    assert all(f"{mode} time " in _help(capsys=capsys) for mode in bench.MODES)
    shown = {
        "op": ["length=128 sequence length L", "layers=2", "include_peer=true time the `sru` package too", "plot=''"],
        "compile": ["length=64 sequence length L", "batch=16 batch size B"],
        "export": [
            "threads=1 intra-op threads (torch.set_num_threads)",
            "repeats=7 timed rounds",
            "warmup=2 untimed rounds before them",
            "tokens=100 chained decoding steps per run",
        ],
        "decode": ["tokens=200 tokens generated per run", "threads=2"],
        "documents": ["hidden=256 hidden size D (input size too)"],
    }
    every = {name for mode in bench.MODES for name in bench.mode_settings(mode)}
    for mode, lines in shown.items():
        text = _help(mode, capsys=capsys)
        assert text.startswith(f"usage: python -m sru_lightning bench {mode} [key=value ...]"), text
        assert all(line in text for line in lines), (mode, text)
        for name in every:
            assert (f" {name}=" in text.split("Example:")[0]) is (name in bench.mode_settings(mode)), (mode, name)
    assert _help("op", capsys=capsys) == " ".join(_help_words(["op", "help=true"], capsys))


def _help_words(argv, capsys) -> list[str]:
    assert bench.main(argv) == 0
    return capsys.readouterr().out.split()


def test_old_flag_spellings_still_run_with_one_notice_naming_the_new_form(monkeypatch, capsys):
    seen = []
    monkeypatch.setattr(op_bench, "run_benchmark", lambda config: seen.append(config) or "result")
    monkeypatch.setattr(op_bench, "format_table", lambda result: "table")
    assert bench.main(["op", "--length", "8", "--batch=3", "--no-peer", "--levels", "none"]) == 0
    assert (seen[0].length, seen[0].batch, seen[0].include_peer, seen[0].levels) == (8, 3, False, "none")
    notice = capsys.readouterr().err.strip().splitlines()
    assert notice == [
        "note: `--length 8 --batch=3 --no-peer --levels none` is now `length=8 batch=3 include_peer=false "
        "levels=none`; the --flag form goes away in the next release"
    ]


@pytest.mark.parametrize(
    "words, module, runner, expected",
    [
        (["export"], "export_bench", "run_export_benchmark", dict(threads=1, tokens=100, length=128, repeats=7)),
        (["export", "tokens=5"], "export_bench", "run_export_benchmark", dict(tokens=5, threads=1)),
        (["compile"], "compile_bench", "run_compile_benchmark", dict(length=64, batch=16, threads=2)),
        (["decode", "tokens=5"], "decode_bench", "run_decode_benchmark", dict(tokens=5, threads=2)),
        (["hf"], "hf_bench", "run_hf_benchmark", dict(tokens=200, threads=2, repeats=10)),
        (["op"], "op_bench", "run_benchmark", dict(length=128, batch=32, layers=2, include_peer=True)),
        ([], "op_bench", "run_benchmark", dict(length=128, hidden=256, dtype="fp32")),  # `bench` alone
        (["include_peer=false", "length=8"], "op_bench", "run_benchmark", dict(length=8, include_peer=False)),
        (["--no-peer", "--length", "8"], "op_bench", "run_benchmark", dict(length=8, include_peer=False)),  # old form
    ],
)
def test_each_subcommand_runs_with_its_own_defaults_and_the_options_given(words, module, runner, expected, monkeypatch):
    import importlib

    target = importlib.import_module(f"sru_lightning.diagnostics.{module}")
    seen = []
    monkeypatch.setattr(target, runner, lambda config: seen.append(config) or "result")
    monkeypatch.setattr(target, "format_table", lambda result: "table")
    assert bench.main(words) == 0
    assert {name: getattr(seen[0], name) for name in expected} == expected


def test_level_table_is_left_out_with_a_note_without_the_kernels(monkeypatch):
    from sru_lightning.ops import build

    monkeypatch.setattr(build, "extension_available", lambda: False)
    config = op_bench.BenchConfig(
        length=2, batch=1, hidden=4, layers=1, repeats=1, warmup=0, threads=1, include_peer=False, levels="all"
    )
    result = op_bench.run_benchmark(config)
    assert result.levels == []
    table = op_bench.format_table(result)
    assert "note: the level table times the C++ kernels, which this process could not load: left out" in table
    assert "SRU training step by phase, 1 layer, fp32:" in table
