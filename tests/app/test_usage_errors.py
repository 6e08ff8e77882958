"""One rule for a usage error, whatever the command: one line on stderr that names the setting,
exit status 2, no traceback, and no run directory left behind.

The table below tries bad values for the keys of every command (fit, validate, test, generate,
bench, fidelity, build, gpu-check) through the real entry point, in-process. The converse is
checked too: an error of the package itself is a failure with its traceback, never a usage error.
"""

from __future__ import annotations

import json

import pytest
from helpers.tiny_run import TINY_RUN

from sru_lightning.app import cli
from sru_lightning.diagnostics.bench import MODES as BENCH_MODES

TINY = [*TINY_RUN, "+trainer.enable_progress_bar=false"]
PROG = "python -m sru_lightning"

# (command, key, arguments, what the message must contain). "{run}" is a trained tiny run,
# "{truncated}" the first bytes of its checkpoint, "{other_text}" a text file of characters
# its vocabulary lacks, "{empty_dir}" a folder without checkpoints.
TRAINER_CASES = [
    ("fit", "seed", ["seed=abc"], "`seed` must be an integer"),
    (
        "fit",
        "ckpt_path",
        ["ckpt_path=/no/such.ckpt"],
        "`ckpt_path` must be a checkpoint file, a run directory, 'auto' or 'last'",
    ),
    ("fit", "ckpt_path", ["ckpt_path={truncated}"], "cannot read the checkpoint"),
    ("fit", "ckpt_path", ["ckpt_path={run}", "model.net.hidden_size=24"], "was trained with model.net.hidden_size=16"),
    ("fit", "ckpt_path", ["ckpt_path={run}", "model=lstm"], "was trained with model.net.rnn='sru'"),
    ("fit", "ckpt_path", ["ckpt_path={empty_dir}"], "holds no readable checkpoint"),
    ("fit", "resume_dir", ["ckpt_path=last", "resume_dir=/nonexistent"], "`resume_dir` must be a folder"),
    ("fit", "trainer.max_steps", ["trainer.max_steps=0"], "`trainer.max_steps` must be a positive"),
    ("fit", "trainer.max_steps", ["trainer.max_steps=abc"], "`trainer.max_steps` must be an integer"),
    ("fit", "trainer.max_epochs", ["trainer.max_epochs=0"], "`trainer.max_epochs` must be a positive"),
    ("fit", "trainer.limit_train_batches", ["trainer.limit_train_batches=0"], "`trainer.limit_train_batches` must"),
    ("fit", "trainer.val_check_interval", ["trainer.val_check_interval=0"], "`trainer.val_check_interval` must"),
    ("fit", "trainer.val_check_interval", ["trainer.val_check_interval=1.5"], "`trainer.val_check_interval` must"),
    ("fit", "trainer.val_check_interval", ["trainer.val_check_interval=10000"], "`val_check_interval` (10000)"),
    ("fit", "trainer.max_time", ["trainer.max_time=00:00:00:00"], "`trainer.max_time` must be a duration"),
    ("validate", "ckpt_path", [], "`validate` needs the weights to evaluate"),
    ("fit", "trainer.max_time", ["trainer.max_time=soon"], "got 'soon'"),
    (
        "fit",
        "trainer.log_every_n_steps",
        ["trainer.log_every_n_steps=-3"],
        "`trainer.log_every_n_steps` must be a positive number of steps, 0 to log no training steps, or null",
    ),
    ("fit", "trainer.precision", ["trainer.precision=8-true"], "`trainer.precision` must be"),
    ("fit", "trainer.gradient_clip_val", ["trainer.gradient_clip_val=abc"], "`trainer.gradient_clip_val` must be"),
    ("fit", "trainer.<unknown>", ["trainer.nokey=1"], "Could not override 'trainer.nokey'"),
    (
        "fit",
        "model.net.hidden_size",
        ["model.hidden_size=32"],
        "`model.hidden_size` is a setting of the network, which moved to `model.net.hidden_size`: use "
        "model.net.hidden_size=32",
    ),
    (
        "validate",
        "model.net.sru_options.rescale",
        ["model.sru_options.rescale=false"],
        "which moved to `model.net.sru_options.rescale`: use model.net.sru_options.rescale=false",
    ),
    ("fit", "model.<unknown>", ["model.nokey=1"], "Could not override 'model.nokey'"),
    ("fit", "model", ["model=nope"], "Could not find 'model/nope'"),
    ("fit", "model.net.rnn", ["model.net.rnn=gru"], "`rnn` must be one of"),
    ("fit", "model.net.hidden_size", ["model.net.hidden_size=0"], "`hidden_size` must be a positive integer"),
    ("fit", "model.net.num_layers", ["model.net.num_layers=abc"], "`num_layers` must be a positive integer"),
    ("fit", "model.net.embedding_dim", ["model.net.embedding_dim=-1"], "`embedding_dim` must be a positive integer"),
    ("fit", "model.net.dropout", ["model.net.dropout=1.5"], "`dropout` must be in [0, 1)"),
    (
        "fit",
        "model.net.sru_options.bidirectional",
        ["+model.net.sru_options.bidirectional=true"],
        "`sru_options.bidirectional` must be false",
    ),
    ("fit", "data", ["data=nope"], "Could not find 'data/nope'"),
    ("fit", "data.batch_size", ["data.batch_size=0"], "`data.batch_size` must be a positive integer"),
    ("fit", "data.seq_len", ["data.seq_len=abc"], "`data.seq_len` must be a positive integer"),
    ("fit", "data.path", ["data=text", "data.path=/no/such.txt"], "`data.path` must point to"),
    # Hydra reads letters beyond ASCII only in quotes: the error shows the quoted form
    ("fit", "data.path", ["data=text", "data.path=/no/ü.txt"], """only in quotes: 'data.path="/no/ü.txt"'"""),
    ("fit", "data.path", ["data=text", "data.path=/no/中文.txt"], """only in quotes: 'data.path="/no/中文.txt"'"""),
    (
        "fit",
        "data.level",
        ["data=text", "data.path={other_text}", "data.level=sentence"],
        "`data.level` must be one of",
    ),
    (
        "fit",
        "data.encoding",
        ["data=text", "data.path={other_text}", "data.encoding=utf-99"],
        "`data.encoding` must be a text encoding",
    ),
    ("fit", "logger", ["logger=nope"], "Could not find 'logger/nope'"),
    ("fit", "model.net.rnn_dropout", ["model.net.rnn_dropout=2"], "`rnn_dropout` must be in [0, 1)"),
    ("fit", "model.net.tie_weights", ["model.net.tie_weights=maybe"], "`tie_weights` must be true or false"),
    ("fit", "model.optimizer.lr", ["model.optimizer.lr=abc"], "torch.optim.adamw.AdamW"),
    (
        "fit",
        "model.optimizer.momentum",
        ["model/optimizer=muon", "model.optimizer.momentum=-1"],
        "MuonAdamW: momentum should be >= 0 but is: -1",
    ),
    (
        "fit",
        "model.lr_scheduler.warmup_fraction",
        ["model.lr_scheduler.warmup_fraction=2"],
        "`warmup_fraction` must be in [0, 1)",
    ),
    ("fit", "data.eval_batch_size", ["data.eval_batch_size=0"], "`data.eval_batch_size` must be a positive integer"),
    ("fit", "trainer.accelerator", ["trainer.accelerator=tpu9"], "invalid accelerator name: `accelerator='tpu9'`"),
    ("fit", "trainer.devices", ["trainer.devices=0"], "`Trainer(devices=0)` value is not a valid input"),
    (
        "validate",
        "ckpt_path",
        ["ckpt_path=/no/such.ckpt"],
        "`ckpt_path` must be a checkpoint file, a run directory, 'auto' or 'last'",
    ),
    ("validate", "ckpt_path", ["ckpt_path={truncated}"], "cannot read the checkpoint"),
    (
        "validate",
        "data.path",
        ["ckpt_path={run}", "data=text", "data.path={other_text}", "data.batch_size=4", "data.seq_len=16"],
        "not in the checkpoint's vocabulary",
    ),
    ("fit", "data.path", ["data=shards", "data.path=/no/such/shards"], "does not exist; prepare it with"),
    ("validate", "resume_dir", ["ckpt_path=last", "resume_dir=/nonexistent"], "`resume_dir` must be a folder"),
    ("test", "ckpt_path", ["ckpt_path={empty_dir}"], "holds no readable checkpoint"),
    (
        "test",
        "model.net.hidden_size",
        ["ckpt_path={run}", "model.net.hidden_size=24"],
        "was trained with model.net.hidden_size=16",
    ),
]

TOOL_CASES = [
    ("generate", "length", ["ckpt_path={run}", "length=0"], "`length` must be a positive integer"),
    ("generate", "length", ["ckpt_path={run}", "length=abc"], "`length` must be an integer"),
    ("generate", "temperature", ["ckpt_path={run}", "temperature=-1"], "`temperature` must be a finite number"),
    ("generate", "top_k", ["ckpt_path={run}", "top_k=-2"], "`top_k` must be an integer >= 0"),
    ("generate", "device", ["ckpt_path={run}", "device=gpu"], "`device` must be 'cpu' or 'cuda'"),
    ("generate", "prompt", ["ckpt_path={run}", "prompt="], "`prompt` must hold at least one token"),
    ("generate", "ckpt_path", ["ckpt_path=/no/such.ckpt"], "`ckpt_path` must be a checkpoint file"),
    ("generate", "ckpt_path", ["ckpt_path={truncated}"], "cannot read the checkpoint"),
    ("generate", "ckpt_path", ["ckpt_path={empty_dir}"], "holds no readable checkpoint"),
    ("generate", "<unknown>", ["lenght=5"], "unknown setting 'lenght'"),
    ("generate", "seed", ["ckpt_path={run}", "seed=abc"], "`seed` must be an integer"),
    ("generate", "resume_dir", ["ckpt_path=last", "resume_dir=/nonexistent"], "resume_dir='/nonexistent'"),
    ("export", "format", ["ckpt_path={run}", "format=zip", "out=x"], "`format` must be one of onnx, pt2, aoti"),
    ("export", "out", ["ckpt_path={run}", "format=onnx"], "`out` is required"),
    ("export", "overwrite", ["ckpt_path={run}", "overwrite=maybe", "out=x"], "`overwrite` must be true or false"),
    ("export", "ckpt_path", ["ckpt_path=/no/such.ckpt", "out=x"], "`ckpt_path` must be a checkpoint file"),
    ("export", "ckpt_path", ["ckpt_path={truncated}", "out=x"], "cannot read the checkpoint"),
    ("export", "<unknown>", ["frmat=onnx"], "unknown setting 'frmat' (did you mean 'format'?)"),
    ("prepare", "out", ["data=pydoc"], "`out` is required"),
    ("prepare", "data", ["data=shards", "data.path=x", "out=x"], "got data=shards, which is prepared already"),
    ("prepare", "data.path", ["data=text", "data.path=/no/such.txt", "out=x"], "`data.path` must point to"),
    ("prepare", "data.vocab_size", ["data=pydoc", "data.tokenizer=bpe", "out=x"], "`data.vocab_size` must be"),
    ("prepare", "workers", ["data=pydoc", "out=x", "workers=-1"], "`workers` must be at least 0, got -1"),
    ("prepare", "<unknown>", ["data=pydoc", "outt=x"], "unknown setting 'outt' (did you mean 'out'?)"),
    ("serve", "model", ["model=/no/such.ckpt"], "`model` must be a checkpoint file, a run directory or 'last'"),
    ("serve", "port", ["model={run}", "port=99999"], "`port` must be from 0 (a free port) to 65535, got 99999"),
    ("serve", "max_streams", ["model={run}", "max_streams=0"], "`max_streams` must be a positive integer"),
    ("serve", "<unknown>", ["prot=5"], "unknown setting 'prot' (did you mean 'port'?)"),
    ("bench", "batch", ["batch=0"], "bench op: error: `batch` must be an integer >= 1, got 0"),
    ("bench", "layers", ["op", "layers=0"], "`layers` must be an integer >= 1"),
    ("bench", "repeats", ["compile", "repeats=0"], "bench compile: error: `repeats` must be an integer >= 1"),
    (  # the server's own refusal, alone (not inside the benchmark's traceback)
        "bench",
        "model",
        ["serve", "model={empty_dir}", "seconds=1"],
        "serve: error: `model` is the directory",
    ),
    ("bench", "warmup", ["warmup=x"], "`warmup` must be an integer, got 'x'"),
    ("bench", "tokens", ["decode", "tokens=0"], "`tokens` must be an integer >= 1"),
    ("bench", "tokens", ["documents", "tokens=5"], "unknown setting 'tokens'; it is a setting of `bench decode`"),
    (
        "bench",
        "<subcommand>",
        ["nope"],
        f"unknown subcommand 'nope' (did you mean 'op'?); choose one of: {', '.join(BENCH_MODES)}",
    ),
    ("bench", "<unknown>", ["op", "lenght=4"], "unknown setting 'lenght' (did you mean 'length'?)"),
    ("bench", "<unknown>", ["op", "--lenght", "4"], "unknown setting '--lenght' (did you mean 'length'?)"),
    ("bench", "length", ["length=0"], "`length` must be an integer >= 1"),
    ("bench", "sizes", ["data", "sizes=30,x"], "`sizes` must be comma-separated positive integers (MB)"),
    ("bench", "threads", ["threads=x"], "`threads` must be an integer, got 'x'"),
    ("bench", "dtype", ["dtype=fp8"], "`dtype` must be one of bf16, fp16, fp32, fp64, got 'fp8'"),
    ("bench", "statistic", ["statistic=mean"], "`statistic` must be one of min, median, got 'mean'"),
    ("bench", "plot", ["plot=/no/such/dir/x.png"], "`plot` must be a file in an existing folder"),
    ("bench", "plot", ["plot=x.txt"], "`plot` must name an image file"),
    ("bench", "curve", ["lm", "curve=maybe"], "`curve` must be true or false, got 'maybe'"),
    ("fidelity", "device", ["device=gpu"], "`device` must be cpu, cuda or cuda:N, got 'gpu'"),
    ("fidelity", "length", ["length=abc"], "`length` must be an integer, got 'abc'"),
    ("fidelity", "hidden", ["hidden=0"], "`hidden` must be an integer >= 1, got 0"),
    ("fidelity", "batch", ["batch=0"], "`batch` must be an integer >= 1, got 0"),
    ("fidelity", "seed", ["seed=x"], "`seed` must be an integer, got 'x'"),
    ("fidelity", "<unknown>", ["bidirectonal=true"], "unknown setting 'bidirectonal' (did you mean 'bidirectional'?)"),
    ("build", "cuda_arch", ["cuda_arch=9.x"], "cuda_arch: expected compute capabilities"),
    ("build", "all_levels", ["all_levels=yes please"], "`all_levels` must be true or false, got 'yes please'"),
    ("build", "<unknown>", ["verbos=true"], "unknown setting 'verbos' (did you mean 'verbose'?)"),
    ("gpu-check", "only", ["only=nope"], "`only` must be one of build, kernels, devices"),
    ("gpu-check", "budget", ["budget=soon"], "`budget` must be a number, got 'soon'"),
    ("gpu-check", "<unknown>", ["jsn=x.json"], "unknown setting 'jsn' (did you mean 'json'?)"),
]

CASES = TRAINER_CASES + TOOL_CASES


def _case_id(case) -> str:
    command, key, arguments, _ = case
    return f"{command}-{key}-{'_'.join(arguments)[-40:]}"


@pytest.fixture(scope="module")
def places(tmp_path_factory) -> dict[str, str]:
    """A trained tiny run and the odd inputs the table refers to."""
    root = tmp_path_factory.mktemp("usage")
    run = root / "run"
    assert cli.main(["fit", *TINY, f"hydra.run.dir={run}"]) == 0
    truncated = root / "truncated.ckpt"
    truncated.write_bytes((run / "checkpoints" / "last.ckpt").read_bytes()[:4000])
    other_text = root / "other.txt"  # characters the pydoc vocabulary does not hold
    other_text.write_text("\u4e00\u4e8c\u4e09\u56db\u4e94 " * 2000)
    empty_dir = root / "empty"
    empty_dir.mkdir()
    return {"run": str(run), "truncated": str(truncated), "other_text": str(other_text), "empty_dir": str(empty_dir)}


def invoke(argv: list[str]) -> int:
    try:
        return cli.main(argv)
    except SystemExit as exit_request:  # argparse's exit, as the console script would see it
        return exit_request.code if isinstance(exit_request.code, int) else 1


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES, ids=[_case_id(case) for case in CASES])
def test_a_bad_value_is_one_line_naming_it_with_status_2(case, places, tmp_path, monkeypatch, capsys):
    command, key, arguments, expected = case
    monkeypatch.chdir(tmp_path)
    arguments = [argument.format(**places) for argument in arguments]
    run_dir = tmp_path / "attempt"
    argv = [command, *arguments]
    if command in cli.TRAINER_COMMANDS:  # the tiny settings first: the case's own values win
        argv = [command, *TINY, *arguments, f"hydra.run.dir={run_dir}"]
    capsys.readouterr()
    status = invoke(argv)
    out, err = capsys.readouterr()
    lines = [line for line in err.splitlines() if line.strip()]
    if command == "generate":  # generate names the checkpoint it read on stderr before it starts
        lines = [line for line in lines if not line.startswith(f"{PROG} generate: /")]
    assert status == 2, f"exit status {status}; stderr: {err}"
    assert len(lines) == 1, f"expected one line on stderr, got: {err}"
    assert lines[0].startswith(PROG), lines[0]
    assert expected in lines[0], lines[0]
    assert "Traceback" not in out + err
    assert "run directory" not in out, "a usage error leaves no run directory to point at"
    assert not run_dir.exists(), "a usage error leaves no failed run directory behind"


def test_the_table_covers_every_command():
    assert {case[0] for case in CASES} == {*cli.TRAINER_COMMANDS, *cli.TOOL_COMMANDS}


def _groups_of_the_main_config() -> list[str]:
    """The config groups conf/config.yaml picks an option of (`optional` ones included)."""
    import yaml

    from sru_lightning._resources import conf_dir

    defaults = yaml.safe_load((conf_dir() / "config.yaml").read_text())["defaults"]
    names = [key.split()[-1] for entry in defaults if isinstance(entry, dict) for key in entry]
    return [name for name in names if name != "hydra"]


@pytest.mark.parametrize("group", _groups_of_the_main_config())
def test_a_misspelled_option_of_any_config_group_is_one_line_naming_its_options(group, tmp_path, monkeypatch, capsys):
    # experiment, hparams_search and debug default to none: a misspelled option must not run
    # the default silently (the step limits keep a fit that wrongly starts short).
    monkeypatch.chdir(tmp_path)
    run_dir = tmp_path / "attempt"
    argv = ["fit", f"{group}=nonexistent_xyz", "trainer.max_steps=1", "trainer.limit_val_batches=1"]
    capsys.readouterr()
    status = invoke([*argv, f"hydra.run.dir={run_dir}"])
    _, err = capsys.readouterr()
    lines = [line for line in err.splitlines() if line.strip()]
    assert status == 2, f"exit status {status}; stderr: {err[-2000:]}"
    assert len(lines) == 1, err
    options = ", ".join(cli.config_groups()[group])
    assert f"Could not find '{group}/nonexistent_xyz'; Available options in '{group}': {options}" in lines[0]
    assert not run_dir.exists()


# A bug of the package, planted where the old rule would have taken it for the user's mistake:
# a TypeError while the run is built, a ValueError in a callback before the first optimizer step.
# In-process: a command keeps its state in its own RunContext, so nothing is left for the next test.
@pytest.mark.parametrize("where,error", [("build", TypeError), ("before_the_first_step", ValueError)])
def test_a_bug_in_the_package_is_a_failure_with_its_traceback_not_a_usage_error(
    tmp_path, monkeypatch, capsys, where, error
):
    from sru_lightning.app.runs import run_trainer
    from sru_lightning.callbacks import TrainingThroughput

    def broken(*args, **kwargs):
        raise error("a bug inside the package")

    if where == "build":
        monkeypatch.setattr(run_trainer, "set_thread_count", broken)
    else:
        monkeypatch.setattr(TrainingThroughput, "on_fit_start", broken)
    monkeypatch.chdir(tmp_path)
    run_dir = tmp_path / "run"
    with pytest.raises(error, match="a bug inside the package"):  # out of main: the interpreter prints its traceback
        cli.main(["fit", *TINY, f"hydra.run.dir={run_dir}"])
    assert f"{PROG}: error:" not in capsys.readouterr().err, "told as a usage error"
    name = error.__name__
    log_text = (run_dir / "sru_lightning.log").read_text()
    assert "Traceback (most recent call last)" in log_text and f"{name}: a bug inside the package" in log_text
    record = json.loads((run_dir / "result.json").read_text())
    assert record["status"] == "failed" and record["error"] == f"{name}: a bug inside the package"
