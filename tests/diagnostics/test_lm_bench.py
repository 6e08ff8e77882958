"""`bench lm`: its options, the overhead table, the curve's table and chart (fake run folders), and
both parts end to end on tiny sizes (slow)."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch
from lightning.pytorch.callbacks import LearningRateMonitor

from sru_lightning.callbacks import FolderModelCheckpoint, TrainingThroughput
from sru_lightning.diagnostics import bench, lm_bench, lm_curve


def test_bench_lm_hands_its_settings_to_the_overhead_or_the_curve(monkeypatch, tmp_path, capsys):
    seen = []
    monkeypatch.setattr(lm_bench, "measure_overhead", lambda config: seen.append(config) or "result")
    monkeypatch.setattr(lm_bench, "format_overhead", lambda result: "overhead table")
    monkeypatch.setattr(lm_curve, "main_curve", lambda config: seen.append(config))
    assert bench.main(["lm", "model=lstm", "extra=model.net.hidden_size=512", "repeats=3"]) == 0
    assert "overhead table" in capsys.readouterr().out
    chart = tmp_path / "curve.png"
    argv = ["lm", "curve=true", "budget=7", "recipe=model=srupp x=1", f"out={tmp_path}"]
    argv += [f"plot={chart}", "target=1.804"]
    assert bench.main(argv) == 0
    assert bench.main(["lm", "curve=true", "runs=recipe,sru", "seeds=3,4", "extra=y=2"]) == 0
    overhead, curve, seeded = seen
    assert (overhead.model, overhead.extra, overhead.repeats, overhead.warmup, overhead.curve) == (
        "lstm",
        "model.net.hidden_size=512",
        3,
        5,
        False,
    )
    assert (curve.curve, curve.budget, curve.recipe, curve.out, curve.plot, curve.target) == (
        True,
        7,
        "model=srupp x=1",
        str(tmp_path),
        str(chart),
        1.804,
    )
    assert lm_curve.curve_runs(curve) == {
        "sru": ["model=sru"],
        "srupp": ["model=srupp"],
        "lstm": ["model=lstm"],
        "recipe": ["model=srupp", "x=1"],
    }
    assert lm_curve.seeds(curve) == [None] and lm_curve.seeds(seeded) == [3, 4]
    assert lm_curve.curve_runs(seeded) == {"recipe": ["experiment=speedrun_10min", "y=2"], "sru": ["model=sru", "y=2"]}
    assert lm_curve.fit_folder(tmp_path, "sru", None) == tmp_path / "sru"
    assert lm_curve.fit_folder(tmp_path, "sru", 3) == tmp_path / "sru-seed3"
    assert lm_curve.max_time(7) == "00:00:00:07" and lm_curve.max_time(3725) == "00:01:02:05"


@pytest.mark.parametrize(
    "arguments, says",
    [
        (["model=gru"], "bench lm: error: `model` must be one of "),
        (["budget=0"], "bench lm: error: `budget` must be an integer >= 1, got 0"),
        (["plot=x.png"], "bench lm: error: `plot` is a setting of the curve: add curve=true"),
        (["seeds=1,2"], "bench lm: error: `seeds` is a setting of the curve: add curve=true"),
        (["target=1.8"], "bench lm: error: `target` is a setting of the curve: add curve=true"),
        (["curve=true", "target=-1"], "bench lm: error: `target` must be a number >= 0, got -1.0"),
        (["curve=true", "runs=sru,gru"], "`runs` must name each of sru, srupp, lstm, recipe at most once"),
        (["curve=true", "runs=sru,sru"], "`runs` must name each of sru, srupp, lstm, recipe at most once"),
        (["curve=true", "seeds=1,x"], "error: `seeds` must be non-negative integers, comma-separated, got '1,x'"),
        (["extra=a='b"], "bench lm: error: `extra` must be overrides as a shell would split them"),
        (["length=3"], "unknown setting 'length'; it is a setting of `bench op`, `bench export`"),
    ],
)
def test_bench_lm_refuses_bad_settings_in_one_line(arguments, says, capsys):
    assert bench.main(["lm", *arguments]) == 2
    errors = capsys.readouterr().err.strip().splitlines()
    assert len(errors) == 1 and says in errors[0], errors


def test_profiler_actions_fall_into_their_groups():
    checkpoint, monitor = FolderModelCheckpoint(monitor="val_bpc"), LearningRateMonitor()
    throughput = TrainingThroughput()
    clock = lm_bench.LoopClock(lm_bench.StepProfiler(), 1, 1)
    callbacks = {cb.state_key: cb for cb in (checkpoint, monitor, throughput, clock)}
    group = {
        action: (lm_bench.classify(action, callbacks) or ("left out",))[0]
        for action in (
            f"[Callback]{checkpoint.state_key}.on_train_batch_end",
            "[Callback]LearningRateMonitor.on_train_batch_start",
            "[Callback]TrainingThroughput.on_train_batch_end",
            "[Callback]LoopClock.on_train_batch_end",
            "[_TrainingEpochLoop].train_dataloader_next",
            "[Logger]AppendingCSVLogger.save",
            "[Strategy]SingleDeviceStrategy.training_step",
            "[LightningModule]SRULanguageModel.optimizer_step",
            "[LightningModule]SRULanguageModel.on_train_batch_start",
        )
    }
    assert list(group.values()) == [
        "callbacks: Lightning's",
        "callbacks: Lightning's",
        "callbacks: ours",
        "left out",
        "data loading",
        "logging (loggers)",
        "model step: forward + loss, carried state, metrics",
        "model step: optimizer step, zero_grad, lr schedule",
        "LightningModule hooks",
    ]


def test_the_profiler_keeps_each_actions_own_time_while_recording():
    profiler = lm_bench.StepProfiler()
    profiler.recording = True
    with profiler.profile("outer"):
        with profiler.profile("inner"):
            pass
    with profiler.profile("outer"):
        pass
    inner = profiler.recorded_durations["inner"][0]
    assert profiler.own_seconds["inner"] == pytest.approx(inner)
    assert profiler.own_seconds["outer"] == pytest.approx(sum(profiler.recorded_durations["outer"]) - inner)


def test_the_profiler_off_records_nothing_and_still_closes_what_it_opened():
    profiler = lm_bench.StepProfiler()
    profiler.recording = True
    with profiler.profile("outer"):
        profiler.active = False
        with profiler.profile("inner"):  # started while off: neither started nor stopped
            pass
    assert set(profiler.recorded_durations) == {"outer"} and not profiler.current_actions
    profiler.active = True
    with profiler.profile("inner"):
        pass
    assert len(profiler.recorded_durations["inner"]) == 1


def test_the_clock_profiles_the_block_of_steps_after_the_timed_ones():
    clock = lm_bench.LoopClock(lm_bench.StepProfiler(), warmup=2, repeats=3)
    assert clock.total_steps == 8
    profiled = [step for step in range(1, 12) if clock._profiles(step)]
    assert profiled == [6, 7, 8]  # after 2 warmup steps and 3 with the profiler off


def test_overhead_table_names_the_biggest_item_over_the_goal():
    config = lm_bench.LMBenchConfig(repeats=10, warmup=2)
    groups = {group: (1.0, 1.0 if phase else 0.0) for group, phase in lm_bench.GROUPS.items()}
    items = [("callbacks: ours", "SeedEveryBatch.on_train_batch_start", 0.9), ("data loading", "fetch", 0.1)]
    text = lm_bench.format_overhead(lm_bench.OverheadResult(config, "model=sru", 12.0, 10.0, groups, items))
    assert "fit/plain 1.200, the loop adds 20.0% (goal: at most 10%)" in text
    assert "total (mean per step)" in text and "Lightning loop (unprofiled)" in text
    assert "over the goal: the biggest item is SeedEveryBatch.on_train_batch_start (callbacks: ours)" in text
    text = lm_bench.format_overhead(lm_bench.OverheadResult(config, "model=sru", 10.5, 10.0, groups, items))
    assert "adds 5.0%" in text and "over the goal" not in text


@pytest.mark.parametrize(
    "precision, dtype, scaled",
    [("32-true", torch.float32, False), ("bf16-mixed", torch.bfloat16, False), ("16-mixed", torch.float16, True)],
)
def test_the_plain_step_runs_in_the_fits_precision(precision, dtype, scaled):
    from lightning.pytorch.plugins.precision import MixedPrecision, Precision

    from sru_lightning.nn import LanguageNet

    torch.manual_seed(0)
    net = LanguageNet(vocab_size=11, embedding_dim=8, hidden_size=16, num_layers=1)
    plugin = Precision() if precision == "32-true" else MixedPrecision(precision, "cpu")
    model = SimpleNamespace(
        net=net, optimizer_config={"_target_": "torch.optim.AdamW", "lr": 1e-2}, lr_scheduler_config=None
    )
    trainer = SimpleNamespace(precision_plugin=plugin, gradient_clip_val=1.0, estimated_stepping_batches=10)
    step = lm_bench._PlainStep(trainer, model, [torch.randint(0, 11, (2, 5)), torch.randint(0, 11, (2, 5))])
    outputs = []
    step.net.decoder.register_forward_hook(lambda module, args, output: outputs.append(output.dtype))
    before = [parameter.detach().clone() for parameter in step.net.parameters()]
    assert set(step()) == set(lm_bench._PlainStep.PHASES)
    assert outputs == [dtype] and (step.scaler is not None) == scaled
    assert all(parameter.dtype == torch.float32 for parameter in step.net.parameters())
    assert any(not torch.equal(old, new) for old, new in zip(before, step.net.parameters()))


def _fake_run(folder, status, bits):
    (folder / "csv").mkdir(parents=True)
    rows = ["epoch,step,train_loss,val_bpc,wall_seconds"]
    rows += [f"{i},{10 * i},,{value},{2.0 * (i + 1)}" for i, value in enumerate(bits)]
    rows.insert(2, "0,10,4.1,,")  # a training row between validations
    (folder / "csv" / "metrics.csv").write_text("\n".join(rows) + "\n")
    record = {"status": status, "monitor": "val_bpc", "optimizer_steps": 10 * len(bits), "tokens_per_second": 900.0}
    (folder / "result.json").write_text(json.dumps({**record, "metrics": {"val_bpc": bits[-1]}}))


def test_curve_table_and_chart_from_run_folders(tmp_path):
    pytest.importorskip("matplotlib", reason="the chart needs the bench extra (matplotlib)")
    runs = {  # name -> each seed's validations at 2, 4 and 6 s
        "sru": [[5.0, 4.0, 3.5], [5.0, 4.0, 3.7]],  # mean final 3.6
        "recipe": [[4.0, 3.5, 3.0], [4.0, 3.8, 3.2]],  # at or below 3.6 by 4 s and by 6 s
        "lstm": [[6.0, 5.0, 4.5]],
    }
    for name, seeds in runs.items():
        for seed, bits in enumerate(seeds):
            _fake_run(lm_curve.fit_folder(tmp_path, name, seed), "completed", bits)
    curves = {name: [lm_curve.read_curve(tmp_path / f"{name}-seed{seed}") for seed in range(len(seeds))]
              for name, seeds in runs.items()}  # fmt: skip
    assert curves["sru"][0]["points"] == [(2.0, 5.0), (4.0, 4.0), (6.0, 3.5)]
    curves["srupp"] = [lm_curve.read_curve(tmp_path / "missing")]  # a run that left nothing
    config = lm_bench.LMBenchConfig(out=str(tmp_path), budget=20, recipe="model/optimizer=muon")
    lines = lm_curve.format_curve(curves, lm_curve.curve_runs(config), 20).splitlines()
    assert lines[0] == (
        "Curve: 20 s fits, final and best val_bpc (means over each run's fits);"
        " reach s: seconds to val_bpc <= 3.6000 (sru's mean final value)"
    )
    header = ["run", "status", "fits", "steps", "final", "spread", "best", "tok/s", "reach", "s", "overrides"]
    assert lines[1].split() == header
    rows = {line.split()[0]: line.split() for line in lines[2:]}
    assert rows["sru"][:9] == ["sru", "completed", "2", "30", "3.6000", "0.2000", "3.6000", "900", "-"]
    assert rows["recipe"][:9] == ["recipe", "completed", "2", "30", "3.1000", "0.2000", "3.1000", "900", "6"]
    assert rows["recipe"][-1] == "model/optimizer=muon"
    assert rows["lstm"][2:9] == ["1", "30", "4.5000", "0.0000", "4.5000", "900", "never"]
    assert rows["srupp"][1:5] == ["no", "result", "1", "-"]
    chart = tmp_path / "curve.png"
    lm_curve.plot_curve(curves, str(chart), 20)
    assert chart.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and chart.stat().st_size > 5000
    # a given target: every run is timed against it, the default one too
    lines = lm_curve.format_curve(curves, lm_curve.curve_runs(config), 20, target=4.0).splitlines()
    assert lines[0].endswith("; reach s: seconds to val_bpc <= 4.0000 (given)")
    rows = {line.split()[0]: line.split() for line in lines[2:]}
    assert rows["sru"][8] == "4" and rows["recipe"][8] == "2" and rows["lstm"][8] == "never"
    targeted = tmp_path / "targeted.png"
    lm_curve.plot_curve(curves, str(targeted), 20, target=4.0)
    assert targeted.read_bytes() != chart.read_bytes()


def test_curve_reads_a_completed_fit_with_the_same_overrides_instead_of_running_it(tmp_path, monkeypatch, capsys):
    config = lm_bench.LMBenchConfig(out=str(tmp_path), budget=5, runs="sru,lstm", seeds="1,2")
    done = lm_curve.fit_folder(tmp_path, "sru", 1)
    _fake_run(done, "completed", [4.0, 3.0])
    clock = "+callbacks.wall_clock._target_=sru_lightning.diagnostics.lm_curve.WallClock"
    made = ["data=pydoc", "trainer.max_time=00:00:00:05", "trainer.max_epochs=-1", "trainer.val_check_interval=0.25"]
    made += ["model=sru", "seed=1", clock]
    (done / ".hydra").mkdir()
    (done / ".hydra" / "overrides.yaml").write_text("".join(f"- {item}\n" for item in reversed(made)))
    assert lm_curve.completed_with(done, made)
    assert not lm_curve.completed_with(done, [*made[:-1], "model.net.hidden_size=8"])
    failed = lm_curve.fit_folder(tmp_path, "lstm", 1)
    _fake_run(failed, "failed", [4.0])
    (failed / ".hydra").mkdir()
    lstm = [item.replace("model=sru", "model=lstm") for item in made]
    (failed / ".hydra" / "overrides.yaml").write_text("".join(f"- {item}\n" for item in lstm))
    started = []
    monkeypatch.setattr(lm_curve.subprocess, "run", lambda argv, **kwargs: started.append(argv) or _Exit(0))
    second = [lm_curve.fit_folder(tmp_path, name, 2) for name in ("sru", "lstm")]
    assert lm_curve.run_curve(config) == {"sru": [done, second[0]], "lstm": [failed, second[1]]}
    # every run's fit of seed 1 first (sru's is read), then those of seed 2
    assert [(argv[argv.index("fit") + 5], argv[argv.index("fit") + 6]) for argv in started] == [
        ("model=lstm", "seed=1"),
        ("model=sru", "seed=2"),
        ("model=lstm", "seed=2"),
    ]
    assert "sru seed 1: completed earlier with the same overrides" in capsys.readouterr().out


class _Exit:
    def __init__(self, returncode: int) -> None:
        self.returncode, self.stderr = returncode, ""


@pytest.mark.slow  # fits a tiny model in this process
def test_bench_lm_times_the_fit_against_the_plain_step(capsys):
    extra = "debug=tiny trainer.limit_train_batches=20 threads=1"
    assert bench.main(["lm", "repeats=4", "warmup=2", f"extra={extra}"]) == 0
    output = capsys.readouterr().out
    assert "Training loop benchmark: model=sru debug=tiny" in output and "fit/plain " in output
    assert "model step: backward" in output and "callbacks: ours" in output
    assert "TrainingThroughput.on_train_batch" in output or "SeedEveryBatch" in output
    assert "4 steps and 4 profiled ones after 2" in output and "its own work" in output


@pytest.mark.slow  # four fits, each in its own process
def test_bench_lm_curve_end_to_end(tmp_path, capsys):
    pytest.importorskip("matplotlib", reason="the chart needs the bench extra (matplotlib)")
    chart = tmp_path / "curve.png"
    extra = "debug=tiny trainer.limit_val_batches=2 threads=1"
    argv = ["lm", "curve=true", "budget=4", f"extra={extra}", f"out={tmp_path / 'runs'}", f"plot={chart}"]
    assert bench.main(argv) == 0
    lines = capsys.readouterr().out.splitlines()
    title = next(line for line in lines if line.startswith("Curve: 4 s fits, final and best val_bpc"))
    assert title.endswith("(sru's mean final value)")
    table = lines[lines.index(title) + 2 :][:4]
    assert [row.split()[:2] for row in table] == [[name, "completed"] for name in ("sru", "srupp", "lstm", "recipe")]
    for name in ("sru", "srupp", "lstm", "recipe"):
        assert lm_curve.read_curve(tmp_path / "runs" / name)["points"], name
    assert chart.is_file() and chart.stat().st_size > 5000
