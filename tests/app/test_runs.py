"""Training runs that never surprise: any step count, every documented option, honest final
numbers, no silent NaN, resumes that keep everything, visible runs and clear errors.

Runs go through the real command line (`sru_lightning.app.cli.main`, in-process for speed; the
signal tests in test_signals.py use real subprocesses) with a tiny model.
"""

from __future__ import annotations

import csv
import importlib.util
import json
import math
from pathlib import Path

import pytest
import torch
from helpers import preloaded
from helpers.tiny_run import TINY_RUN

from sru_lightning.app import cli
from sru_lightning.models.schedules import WarmupCosineLR

TINY = [*TINY_RUN, "+trainer.enable_progress_bar=false"]


def fit(*overrides: str) -> int:
    own_callbacks = any(item.startswith("callbacks=") for item in overrides)
    tiny = [item for item in TINY if not (own_callbacks and item.startswith("~callbacks"))]
    return cli.main(["fit", *tiny, *overrides])


def result_of(run_dir: Path) -> dict:
    return json.loads((run_dir / "result.json").read_text())


def csv_rows(run_dir: Path) -> list[dict]:
    with open(run_dir / "csv" / "metrics.csv") as handle:
        return list(csv.DictReader(handle))


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)


# --------------------------------------------------------------------------------------------
# any length of run
@pytest.mark.parametrize("total", [1, 2, 3, 10, 11, 5000])
def test_the_default_schedule_is_valid_for_any_step_count(total):
    parameter = torch.nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.SGD([parameter], lr=1.0)
    schedule = WarmupCosineLR(optimizer, total_steps=total)
    rates = []
    for _ in range(total):
        rates.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        schedule.step()
    assert all(math.isfinite(rate) and 0 < rate <= 1.0 for rate in rates)
    assert max(rates) == pytest.approx(1.0), "the peak rate is reached"
    if total >= 3:
        assert rates[0] < 1.0, "the run warms up"
        assert rates[-1] == pytest.approx(0.04), "and ends at the floor"


def test_an_unknown_step_count_warms_up_then_holds_the_peak():
    parameter = torch.nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.SGD([parameter], lr=2.0)
    schedule = WarmupCosineLR(optimizer, total_steps=None, fallback_warmup_steps=4)
    rates = []
    for _ in range(8):
        rates.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        schedule.step()
    assert rates[:4] == pytest.approx([0.4, 0.8, 1.2, 1.6]) and rates[4:] == pytest.approx([2.0] * 4)


@pytest.mark.parametrize(
    "overrides,steps",
    [
        (["trainer.max_steps=1"], 1),
        (["trainer.max_steps=2"], 2),
        (["trainer.max_steps=10", "trainer.limit_train_batches=null"], 10),
        (["trainer.max_steps=11", "trainer.limit_train_batches=null"], 11),
        (["trainer.limit_train_batches=8", "trainer.accumulate_grad_batches=2"], 4),
    ],
    ids=["max_steps=1", "max_steps=2", "max_steps=10", "max_steps=11", "limit_x_accumulate"],
)
def test_fits_of_any_length_complete(overrides, steps, tmp_path):
    run_dir = tmp_path / "run"
    assert fit(*overrides, f"hydra.run.dir={run_dir}") == 0
    record = result_of(run_dir)
    assert record["status"] == "completed" and record["optimizer_steps"] == steps
    assert math.isfinite(record["metrics"]["val_bpc"])


def test_a_time_limited_fit_without_epoch_limit_uses_the_fallback_schedule(tmp_path, capsys):
    run_dir = tmp_path / "run"
    assert (
        fit(
            "trainer.max_epochs=-1",
            "trainer.limit_train_batches=null",
            "trainer.max_time=00:00:00:02",
            f"hydra.run.dir={run_dir}",
        )
        == 0
    )
    out = capsys.readouterr().out
    assert out.count("The number of optimizer steps is unknown") == 1, "announced once"
    assert result_of(run_dir)["status"] == "completed" and result_of(run_dir)["optimizer_steps"] >= 1


def test_max_steps_zero_is_a_usage_error(tmp_path, capsys):
    assert fit("trainer.max_steps=0", f"hydra.run.dir={tmp_path / 'run'}") == 2
    err = capsys.readouterr().err
    assert "`trainer.max_steps` must be a positive number of optimizer steps, or -1" in err
    assert "Traceback" not in err


# --------------------------------------------------------------------------------------------
# honest numbers
def test_the_final_numbers_describe_the_final_weights(tmp_path, capsys):
    """An epoch without validation (every 2nd epoch validates) ends the fit: the CLI validates."""
    run_dir = tmp_path / "run"
    assert (
        fit(
            "callbacks=none",
            "trainer.limit_train_batches=5",
            "trainer.check_val_every_n_epoch=2",
            f"hydra.run.dir={run_dir}",
        )
        == 0
    )
    out = capsys.readouterr().out
    record = result_of(run_dir)
    assert "Validating the final weights (step 5): no validation ran in this fit" in out
    final = record["metrics"]["val_bpc"]
    assert f"final val_bpc={final:.4f}" in out
    # the same number as evaluating the last checkpoint (written at the end of the fit)
    assert (
        cli.main(
            [
                "validate",
                *TINY,
                f"ckpt_path={run_dir / 'checkpoints' / 'last.ckpt'}",
                f"hydra.run.dir={tmp_path / 'check'}",
            ]
        )
        == 0
    )
    assert result_of(tmp_path / "check")["metrics"]["val_bpc"] == pytest.approx(final, rel=1e-5)


def test_a_max_steps_stop_validates_inside_the_fit_and_keeps_a_best_checkpoint(tmp_path, capsys):
    run_dir = tmp_path / "run"
    assert fit("trainer.limit_train_batches=null", "trainer.max_steps=5", f"hydra.run.dir={run_dir}") == 0
    out = capsys.readouterr().out
    record = result_of(run_dir)
    assert "Validating the final weights" not in out, "the in-fit validation is already fresh"
    best = [p.name for p in (run_dir / "checkpoints").glob("epoch*-val_bpc*.ckpt")]
    assert best == [f"epoch000-val_bpc{record['metrics']['val_bpc']:.4f}.ckpt"]
    assert "val_bpc" not in out.split("run directory")[1] or "could not find the monitored key" not in out
    # result.json keeps how the run went
    for key in ("optimizer_steps", "tokens_per_second", "train_tokens", "wall_seconds", "started"):
        assert key in record
    assert record["train_tokens"] == 5 * 4 * 16 and record["tokens_per_second"] > 0
    # the first batch's FLOPs, counted (the recurrence included); no MFU without a known peak
    assert record["flops_per_batch"] > 0 and record["flops_per_second"] > 0 and "mfu" not in record
    assert "train_bpc" in record["metrics"]


# --------------------------------------------------------------------------------------------
# no silent NaN
def test_a_nan_loss_stops_the_run_with_a_reason_and_a_failure_status(tmp_path, capsys):
    run_dir = tmp_path / "run"
    assert (
        fit(
            "model.optimizer.lr=1e30",
            "trainer.gradient_clip_val=null",
            "trainer.limit_train_batches=6",
            f"hydra.run.dir={run_dir}",
        )
        == 1
    )
    err = capsys.readouterr().err
    assert "the training loss is nan at optimizer step" in err and "Likely causes" in err
    assert "Traceback" not in err
    assert result_of(run_dir)["status"] == "failed"
    assert not (run_dir / "checkpoints" / "interrupted.ckpt").exists(), "nothing that looks resumable"


def test_a_sweep_marks_the_nan_job_failed_and_finishes_the_others(tmp_path, capsys):
    sweep_dir = tmp_path / "sweep"
    status = cli.main(
        [
            "fit",
            "-m",
            *TINY,
            "model.optimizer.lr=3e-3,1e30",
            "trainer.gradient_clip_val=null",
            "trainer.limit_train_batches=6",
            f"hydra.sweep.dir={sweep_dir}",
        ]
    )
    assert status == 1
    with open(sweep_dir / "summary.csv") as handle:
        rows = list(csv.DictReader(handle))
    assert [row["status"] for row in rows] == ["completed", "failed"]
    assert float(rows[0]["tokens_per_second"]) > 0 and float(rows[0]["wall_seconds"]) > 0
    assert "training loss is nan" in rows[1]["error"]


def test_16_true_trains_finite(tmp_path):
    run_dir = tmp_path / "run"
    assert (
        fit(
            "trainer.precision=16-true",
            "trainer.limit_train_batches=null",
            "trainer.max_steps=32",
            "trainer.log_every_n_steps=1",
            f"hydra.run.dir={run_dir}",
        )
        == 0
    )
    losses = [float(row["train_loss"]) for row in csv_rows(run_dir) if row.get("train_loss")]
    assert len(losses) == 32 and all(math.isfinite(loss) for loss in losses)
    assert math.isfinite(result_of(run_dir)["metrics"]["val_bpc"])


def test_float16_parameters_get_an_eps_float16_can_hold():
    from sru_lightning.models.optimization import FLOAT16_SAFE_EPS, make_eps_safe_for_float16

    half = torch.nn.Parameter(torch.zeros(3, dtype=torch.float16))
    full = torch.nn.Parameter(torch.zeros(3))
    optimizer = torch.optim.AdamW([{"params": [half]}, {"params": [full]}], eps=1e-8)
    make_eps_safe_for_float16(optimizer)
    assert optimizer.param_groups[0]["eps"] == FLOAT16_SAFE_EPS and optimizer.param_groups[1]["eps"] == 1e-8
    assert float(torch.tensor(FLOAT16_SAFE_EPS, dtype=torch.float16)) > 0


# --------------------------------------------------------------------------------------------
# resume keeps everything
def _fake_run(root: Path, name: str, step: int, status: str | None, config_from: Path) -> Path:
    from omegaconf import OmegaConf

    from sru_lightning.app.runs.checkpoints import RUN_CONFIG_KEY
    from sru_lightning.app.runs.records import RECORD_VERSION
    from sru_lightning.models.checkpoint_format import FORMAT_KEY, FORMAT_VERSION

    run_dir = root / name
    (run_dir / "checkpoints").mkdir(parents=True)
    (run_dir / ".hydra").mkdir()
    (run_dir / ".hydra" / "config.yaml").write_text((config_from / ".hydra" / "config.yaml").read_text())
    config = OmegaConf.to_container(OmegaConf.load(run_dir / ".hydra" / "config.yaml"))
    torch.save(
        {"global_step": step, FORMAT_KEY: FORMAT_VERSION, RUN_CONFIG_KEY: config}, run_dir / "checkpoints" / "last.ckpt"
    )
    if status is not None:
        (run_dir / "result.json").write_text(json.dumps({"status": status, "format_version": RECORD_VERSION}))
    return run_dir


def test_ckpt_path_last_skips_failed_runs_and_runs_without_a_step(tmp_path, capsys):
    import os
    import time

    from sru_lightning.app.runs.ckpt_path import latest_continuable

    template = tmp_path / "outputs" / "template"
    assert fit("trainer.max_steps=1", f"hydra.run.dir={template}") == 0
    for good in (template / "checkpoints").iterdir():  # older than the runs below
        os.utime(good, (time.time() - 100, time.time() - 100))
    _fake_run(tmp_path / "outputs", "failed", 7, "failed", template)
    _fake_run(tmp_path / "outputs", "never_trained", 0, "interrupted", template)
    found = latest_continuable(tmp_path / "outputs")
    assert found is not None and found.parent == (template / "checkpoints").absolute()


def test_resuming_into_the_same_directory_keeps_metrics_and_history(tmp_path):
    run_dir = tmp_path / "run"
    steps = ["trainer.limit_train_batches=null", "trainer.log_every_n_steps=1"]
    assert fit(*steps, "trainer.max_steps=3", f"hydra.run.dir={run_dir}") == 0
    first_rows = csv_rows(run_dir)
    assert fit(*steps, "trainer.max_steps=6", "ckpt_path=last", f"hydra.run.dir={run_dir}") == 0
    rows = csv_rows(run_dir)
    logged = sorted(int(row["step"]) for row in rows if row.get("train_loss"))
    assert logged == list(range(6)), "the first attempt's rows are kept, the second continues at step 3"
    assert len(rows) > len(first_rows)
    attempts = [json.loads(line) for line in (run_dir / "history.jsonl").read_text().splitlines()]
    assert [a["optimizer_steps"] for a in attempts] == [3, 6]
    assert "trainer.max_steps=3" in attempts[0]["overrides"] and "trainer.max_steps=6" in attempts[1]["overrides"]


def test_extending_a_finished_max_steps_run_continues_at_the_next_batch(tmp_path):
    run_dir = tmp_path / "run"
    assert fit("trainer.limit_train_batches=null", "trainer.max_steps=3", f"hydra.run.dir={run_dir}") == 0
    assert (
        fit(
            "trainer.limit_train_batches=null",
            "trainer.max_steps=5",
            f"ckpt_path={run_dir}",
            f"hydra.run.dir={run_dir}",
        )
        == 0
    )
    state = torch.load(run_dir / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)
    assert state["epoch"] == 0 and state["global_step"] == 5
    assert state["loops"]["fit_loop"]["state_dict"]["combined_loader"][0]["batches_yielded"] == 5


# --------------------------------------------------------------------------------------------
# checkpoints carry their model
def test_validate_and_test_rebuild_the_model_of_the_checkpoint(tmp_path, capsys):
    lstm_run = tmp_path / "lstm"
    assert fit("model=lstm", f"hydra.run.dir={lstm_run}") == 0
    trained = result_of(lstm_run)["metrics"]["val_bpc"]
    # no model=lstm: the checkpoint says what it is
    assert cli.main(["validate", *TINY, f"ckpt_path={lstm_run}", f"hydra.run.dir={tmp_path / 'v'}"]) == 0
    assert result_of(tmp_path / "v")["metrics"]["val_bpc"] == pytest.approx(trained, rel=1e-5)
    assert cli.main(["test", *TINY, f"ckpt_path={lstm_run}", f"hydra.run.dir={tmp_path / 't'}"]) == 0
    capsys.readouterr()
    # an override that contradicts the checkpoint: one sentence
    assert cli.main(["validate", *TINY, "model=sru", f"ckpt_path={lstm_run}", f"hydra.run.dir={tmp_path / 'x'}"]) == 2
    err = capsys.readouterr().err
    assert "`model.net.rnn` cannot change when a run is evaluated" in err
    assert "was trained with model.net.rnn='lstm'" in err and "asks for model.net.rnn='sru'" in err
    assert "Traceback" not in err


# --------------------------------------------------------------------------------------------
# every documented option, visible runs, clear errors, no noise
def test_logger_none_and_callbacks_none_work_and_keep_checkpoints_in_the_run(tmp_path, capsys):
    assert fit("logger=none", f"hydra.run.dir={tmp_path / 'a'}") == 0
    assert (tmp_path / "a" / "checkpoints" / "last.ckpt").is_file()
    assert fit("callbacks=none", f"hydra.run.dir={tmp_path / 'b'}") == 0
    assert (
        sorted(p.name for p in (tmp_path / "b").rglob("*.ckpt"))
        == sorted(p.name for p in (tmp_path / "b" / "checkpoints").glob("*.ckpt"))
        and (tmp_path / "b" / "checkpoints" / "last.ckpt").is_file()
    )


def test_a_run_is_visible_on_the_console_and_in_its_log_file(tmp_path, capsys):
    run_dir = tmp_path / "run"
    assert fit(f"hydra.run.dir={run_dir}") == 0
    out = capsys.readouterr().out
    assert out.count(f"run directory: {run_dir}") == 2, "printed at start and end"
    assert "SRU recurrence precision (policy 'auto')" in out, "the precision report reaches the console"
    log_text = (run_dir / "sru_lightning.log").read_text()
    assert "SRU recurrence precision" in log_text and "final val_bpc=" in log_text


def test_known_noise_is_gone_and_real_warnings_appear_once(tmp_path, capsys):
    assert (
        fit(
            "model=lstm", "trainer.limit_train_batches=null", "trainer.max_steps=3", f"hydra.run.dir={tmp_path / 'run'}"
        )
        == 0
    )
    captured = capsys.readouterr()
    text = captured.out + captured.err
    assert "IterableDataset` has `__len__`" not in text
    assert "LeafSpec" not in text and "Tip:" not in text
    assert "holds no SRU layer" not in text  # an LSTM baseline has none by design
    assert "could not find the monitored key" not in text


def test_sru_large_does_not_warn_about_its_own_config(tmp_path, capsys):
    assert (
        fit(
            "model=sru_large",
            "model.net.sru_options.projection_size=8",
            "trainer.max_steps=1",
            f"hydra.run.dir={tmp_path / 'run'}",
        )
        == 0
    )
    captured = capsys.readouterr()
    assert "rnn_dropout" not in captured.out + captured.err


@pytest.mark.parametrize(
    "overrides,message",
    [
        (["trainer.max_steps=abc"], "`trainer.max_steps` must be an integer, got 'abc'"),
        (["trainer.limit_val_batches=many"], "`trainer.limit_val_batches` must be an integer or a number or null"),
        (["data.seq_len=20000"], "too few for 4 streams x 1 process(es) x data.seq_len=20000"),
    ],
)
def test_bad_settings_are_named_without_a_traceback(overrides, message, tmp_path, capsys):
    assert fit(*overrides, f"hydra.run.dir={tmp_path / 'run'}") == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_an_empty_or_tiny_text_file_is_named(tmp_path, capsys):
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    assert fit("data=text", f"data.path={empty}", f"hydra.run.dir={tmp_path / 'a'}") == 2
    err = capsys.readouterr().err
    assert f"{str(empty)!r} under `data.path` holds no text" in err and "Traceback" not in err
    tiny = tmp_path / "tiny.txt"
    tiny.write_text("hello world " * 30)
    assert fit("data=text", f"data.path={tiny}", f"hydra.run.dir={tmp_path / 'b'}") == 2
    err = capsys.readouterr().err
    assert f"data.path={str(tiny)!r} has" in err and "it needs at least" in err and "Traceback" not in err


def test_the_command_first_hint_does_not_repeat_the_command(capsys):
    assert cli.main(["trainer.max_steps=2", "fit"]) == 2
    err = capsys.readouterr().err
    assert "`python -m sru_lightning fit trainer.max_steps=2`" in err


# --------------------------------------------------------------------------------------------
# every option of every config group runs a tiny fit
# These default to the GPU; the engine configs' runs on CPU processes (accelerator=cpu,
# devices=2) are the 2-process fits of tests/strategies/test_engines.py.
GPU_ONLY = {("trainer", name) for name in ("gpu", "ddp", "deepspeed_stage_2", "deepspeed_stage_3", "fsdp", "fsdp2")}
CPU_FORM = {
    "ddp": "trainer=ddp_cpu",
    **{
        name: "its run in tests/strategies/test_engines.py"
        for name in ("deepspeed_stage_2", "deepspeed_stage_3", "fsdp", "fsdp2")
    },
}
SUBPROCESS = {("trainer", "ddp_cpu")}  # launches processes that re-run the command line


def _option_overrides(group: str, option: str, tmp_path: Path) -> list[str]:
    text = tmp_path / "corpus.txt"
    from pydoc_data.topics import topics

    text.write_text("\n".join(topics[key] for key in sorted(topics))[:60_000])
    enwik8 = tmp_path / "enwik8"
    enwik8.write_bytes(text.read_bytes()[:60_000])
    enwik8_data = [f"data.path={enwik8}", "data.train_bytes=40000", "data.val_bytes=10000", "data.test_bytes=10000"]
    documents = tmp_path / "documents"
    documents.mkdir()
    for index, key in enumerate(sorted(topics)[:40]):
        (documents / f"{index:03d}.txt").write_text(topics[key][:3000])
    if group == "data" and option in ("shards", "litdata"):  # a corpus prepared ahead (`prepare`)
        prepared = tmp_path / "prepared"
        words = ["prepare", "data=text", f"data.path={text}", f"out={prepared}", f"format={option}", "progress=false"]
        assert cli.main(words) == 0
        return [f"data={option}", f"data.path={prepared}"]
    # a search's trial at the tiny sizes, 4 s long
    tiny_trial = [
        "model.net.hidden_size=16",
        "model.net.num_layers=1",
        "model.net.embedding_dim=8",
        "data.seq_len=16",
        "data.batch_size=4",
        "trainer.max_time=00:00:00:04",
    ]
    extra = {
        ("data", "stdlib"): ["data.max_chars=200000"],
        ("data", "enwik8"): enwik8_data,
        ("data", "text"): [f"data.path={text}"],
        ("data", "documents"): [f"data.path={documents}"],
        ("model", "sru_large"): ["model.net.sru_options.projection_size=8"],
        ("experiment", "enwik8"): [
            *enwik8_data,
            "trainer=cpu",
            "trainer.precision=32-true",
            "model.net.sru_options.projection_size=8",
        ],
        # one trial of the time-budgeted search, tiny and 4 s long
        ("hparams_search", "speedrun_10min"): [
            "hydra.sweeper.n_trials=1",
            *tiny_trial,
            f"hydra.sweep.dir={tmp_path / 'run'}",
        ],
        # the grid cut to one tiny 4 s trial (a swept key given on the command line is not swept)
        ("hparams_search", "speedrun_10min_grid"): [
            "model.net.dropout=0.0",
            *tiny_trial,
            "trainer.precision=32-true",
            f"hydra.sweep.dir={tmp_path / 'run'}",
        ],
        # one trial of the pruned search, tiny and 4 s long (a swept key given on the command
        # line is fixed, as in Optuna's sweeper)
        ("hparams_search", "speedrun"): [
            "hydra.sweeper.n_trials=1",
            "model=sru",
            "model/optimizer=adamw",
            *tiny_trial,
            "trainer.precision=32-true",
            f"hydra.sweep.dir={tmp_path / 'run'}",
        ],
        # one trial of the search, at the tiny sizes, written to the sweep folder's job 0
        ("hparams_search", "lm_optuna"): [
            "hydra.sweeper.n_trials=1",
            "model.net.hidden_size=16",
            "model.net.num_layers=1",
            f"hydra.sweep.dir={tmp_path / 'run'}",
        ],
    }
    return [f"{group}={option}", *extra.get((group, option), [])]


def _tiny_for(group: str) -> list[str]:
    # An experiment sets model/data/trainer sizes after the command line's group choices, so
    # the tiny sizes come as overrides after it; callbacks=<option> replaces the group whole.
    if group == "debug":  # the tiny sizes are the option under test
        return []
    return [item for item in TINY if not (group == "callbacks" and item.startswith("~callbacks"))]


OPTION_CASES = [
    pytest.param(
        group,
        option,
        marks=[
            *(
                [
                    pytest.mark.skipif(
                        not torch.cuda.is_available(),
                        reason=f"trainer={option} as configured needs a CUDA GPU "
                        f"({CPU_FORM.get(option, 'trainer=cpu')} is its CPU form)",
                    )
                ]
                if (group, option) in GPU_ONLY
                else []
            ),
            *([pytest.mark.slow] if (group, option) in SUBPROCESS else []),
            *(
                [
                    pytest.mark.skipif(
                        importlib.util.find_spec("hydra_plugins.hydra_optuna_sweeper") is None,
                        reason="needs the `sweepers` extra (hydra-optuna-sweeper)",
                    )
                ]
                if group == "hparams_search"
                else []
            ),
        ],
        id=f"{group}={option}",
    )
    for group, options in cli.config_groups().items()
    for option in options
]


@pytest.mark.parametrize("group,option", OPTION_CASES)
def test_every_option_of_every_group_runs_a_tiny_fit(group, option, tmp_path):
    run_dir = tmp_path / "run"
    overrides = [*_tiny_for(group), *_option_overrides(group, option, tmp_path), f"hydra.run.dir={run_dir}"]
    if (group, option) in SUBPROCESS:
        import os
        import sys

        root = str(Path(cli.__file__).resolve().parents[2])
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))}
        done = preloaded.run(
            [sys.executable, "-m", "sru_lightning", "fit", *overrides],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
            preload_children=True,
        )
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    else:
        assert cli.main(["fit", *overrides]) == 0
    record = result_of(run_dir / "0" if group == "hparams_search" else run_dir)
    assert record["status"] == "completed" and record["optimizer_steps"] >= 1
    assert math.isfinite(record["metrics"]["val_bpc"])


def test_the_model_summary_shows_the_networks_layers_and_can_be_turned_off(tmp_path, capsys):
    assert fit(f"hydra.run.dir={tmp_path / 'a'}") == 0
    out = capsys.readouterr().out
    assert all(f"net.{layer}" in out for layer in ("embedding", "rnn", "decoder")), out
    assert fit("+trainer.enable_model_summary=false", f"hydra.run.dir={tmp_path / 'b'}") == 0
    assert "net.decoder" not in capsys.readouterr().out
