"""Every shell command in README.md and docs/ is checked.

The commands are the lines of the fenced ```bash blocks (a trailing `\\` joins a line to the
next; `# ...` comments are dropped). Each is checked by what it runs:

- `python -m sru_lightning fit|validate|test ...` (also after `srun`, `torchrun -m`, `sbatch`
  of the example job): every override is composed with Hydra's compose API against `conf/`, so
  an unknown group, option or key fails; sweep values (`a,b`, `choice(...)`) are composed one
  by one. The cheap ones also run for real, in-process, in a scratch folder, with `debug=tiny`
  appended (`NOT_RUN` names the ones that only compose, and why).
- the tool commands (`bench`, `build`, `fidelity`, `gpu-check`, `generate`, `export`, `prepare`):
  their `key=value` settings are parsed by the command's own `parse_settings` (bench's with its
  subcommand, prepare's with its data overrides composed), which stops there; an old `--flag`
  spelling fails; `generate` and `export` of a tiny run also run for real.
- `make`, `pip install`, `bash examples/...`, `sbatch examples/...`: the Makefile target, the
  extras in pyproject.toml, the script (bash -n) exist.
- `python -m sru_lightning.hf.lm_eval ...`: the evaluation harness's own parser accepts the
  arguments, and the model they name is registered.
- `python examples/<script>.py ...`: the script's own `parse_args(argv)` accepts the arguments
  (tests/precision/test_fabric.py runs examples/fabric_loop.py for real).
- `python examples/lightning_cli.py ...`: its arguments are parsed by the script's LightningCLI
  (a `--config` file and a `> file` that earlier commands write are left to the run); each also
  runs for real, in-process, with `LIGHTNING_CLI_TINY` appended (`<checkpoint.ckpt>`: the newest
  checkpoint such a fit wrote).

A command of any other kind fails the test until a check for it is added here. Placeholders
(`outputs/<date>/<time>`, ...) are replaced by the values in `PLACEHOLDERS`.
"""

from __future__ import annotations

import importlib
import importlib.util
import itertools
import json
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOC_FILES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]

TRAINER = ("fit", "validate", "test")
TOOLS = ("bench", "build", "fidelity", "gpu-check", "generate", "export", "prepare")

# Placeholder in a documented command -> what the test puts there ({run}: the tiny run's folder).
PLACEHOLDERS = {
    "outputs/<date>/<time>": "{run}",
    "HOST:29500": "127.0.0.1:29500",
    "/data/enwik8": "{scratch}/enwik8",
    "data.path=my_documents/": "data.path={scratch}/my_documents/",
    "data.path=corpus.jsonl": "data.path={scratch}/corpus.jsonl",
}

# Documented fit/validate/test commands that only compose (matched by a substring of the
# command as written), with the reason they do not run here.
NOT_RUN = {
    "trainer.max_time=00:00:03:00": "a timed three-minute comparison run",
    "hparams_search=lm_optuna": "a 40-trial Optuna search",
    "hparams_search=speedrun_10min": "a search of 10-minute trials",
    "hparams_search=speedrun ": "a pruned search of 5-minute trials (tests/app/test_search.py runs it on tiny fits)",
    "hydra/sweeper=optuna": "an Optuna search",
    "hydra/launcher=slurm": "submits to a SLURM cluster",
    "hydra/launcher=joblib": "starts worker processes (tests/app/test_sweepers.py runs the joblib launcher)",
    "trainer=ddp ": "needs GPUs",
    "trainer=gpu": "needs a GPU",
    "experiment=enwik8": "needs the enwik8 data",
    "data=shards": "reads the folder a documented `prepare` writes (tests/app/test_prepare_cli.py runs both)",
    "data=litdata": "reads the folder `prepare format=litdata` writes (tests/app/test_prepare_cli.py runs both)",
}
# Documented runs that run for real only in the `slow` tier: multiruns (several tiny fits each)
# and a compiled fit (tens of seconds of compiling).
SLOW_RUNS = ("fit -m model=sru,srupp,lstm", "model.compile=true")
# The LightningCLI example (examples/lightning_cli.py) and what its documented runs get appended.
LIGHTNING_CLI = ["python", "examples/lightning_cli.py"]
LIGHTNING_CLI_TINY = [
    *("--model.net.hidden_size", "16", "--model.net.embedding_dim", "8", "--model.net.num_layers", "1"),
    *("--data.batch_size", "4", "--data.seq_len", "16"),
    *("--trainer.max_steps", "3", "--trainer.limit_val_batches", "1", "--trainer.logger", "false"),
    *("--trainer.enable_progress_bar", "false", "--trainer.enable_model_summary", "false"),
]
LIGHTNING_CLI_CHECKPOINT = "<checkpoint.ckpt>"
# Tool commands that run for real on the tiny run (the others are parsed only).
RUN_TOOLS = ("generate", "export")


# --------------------------------------------------------------------------------------------
# reading the documents
@dataclass(frozen=True)
class Command:
    source: str  # file:line
    text: str  # as written (continuations joined)

    def __str__(self) -> str:
        return f"{self.source}: {self.text}"


def documented_commands() -> list[Command]:
    commands = []
    for path in DOC_FILES:
        lines = path.read_text().splitlines()
        in_bash = False
        pending, start = "", 0
        for number, line in enumerate(lines, 1):
            if line.startswith("```"):
                in_bash = line.strip() == "```bash" if not in_bash else False
                continue
            if not in_bash:
                continue
            if not pending:
                start = number
            if line.rstrip().endswith("\\"):
                pending += line.rstrip()[:-1] + " "
                continue
            text = " ".join((pending + line).split())
            pending = ""
            words = shlex.split(text, comments=True)
            if words:
                commands.append(Command(f"{path.relative_to(ROOT)}:{start}", shlex.join(words)))
    return commands


COMMANDS = documented_commands()


def substitute(text: str, values: dict[str, str]) -> str:
    for placeholder, value in PLACEHOLDERS.items():
        text = text.replace(placeholder, value.format(**values))
    return text


def expand_synopsis(words: list[str]) -> list[list[str]]:
    """A synopsis (`[dtype=fp32|bf16|fp16] [plot=chart.png]`) -> the commands it stands for:
    the optional parts all given, one command per alternative of a `key=a|b|c` value."""
    if not any(w.startswith("[") for w in words):
        return [words]
    words = [w.strip("[]") for w in words if w.strip("[]") and w not in ("...",)]

    def alternatives(word: str) -> list[str]:
        key, equals, value = word.rpartition("=") if "|" in word else ("", "", word)
        return [key + equals + choice for choice in value.split("|")]

    choices = [alternatives(w) for w in words]
    return [list(combination) for combination in itertools.product(*choices)]


def sru_argv(words: list[str]) -> list[str] | None:
    """The `sru_lightning` arguments of a command line, wherever the launcher puts them."""
    for i, word in enumerate(words):
        if word == "-m" and i + 1 < len(words) and words[i + 1] == "sru_lightning":
            return words[i + 2 :]
        if word == "sru-lightning":
            return words[i + 1 :]
    return None


# --------------------------------------------------------------------------------------------
# checks
def compose_overrides(command: str, overrides: list[str]) -> None:
    """Compose `config` with the overrides of a fit/validate/test command; a sweep's values one at
    a time (an interval sweep at its lower end). Unknown groups, options and keys raise."""
    from hydra import compose, initialize_config_dir
    from hydra.core.override_parser.overrides_parser import OverridesParser

    from sru_lightning._resources import conf_dir

    overrides = [o for o in overrides if o != "-m" and o != "--multirun"]
    parsed = OverridesParser.create().parse_overrides(overrides)
    fixed, sweeps = [], []
    for text, override in zip(overrides, parsed):
        if not override.is_sweep_override():
            fixed.append(text)
            continue
        key = override.get_key_element()
        if override.is_interval_sweep():
            values = [override.value().start]
        else:
            values = list(override.sweep_string_iterator())
        sweeps.append([f"{key}={value}" for value in values])
    variants = (
        [fixed]
        if not sweeps
        else [
            fixed + [choice if i == j else options[0] for i, options in enumerate(sweeps)]
            for j, choices in enumerate(sweeps)
            for choice in choices
        ]
    )
    with initialize_config_dir(config_dir=str(conf_dir()), version_base="1.3"):
        for variant in variants:
            cfg = compose("config", overrides=variant, return_hydra_config=True)
            assert cfg.trainer is not None, (command, variant)


class Parsed(BaseException):
    """Raised right after a tool command's own parser accepted its arguments."""


def parse_tool_arguments(command: str, arguments: list[str], monkeypatch) -> None:
    """Run the tool command's parser on `arguments` and stop there: a usage error fails."""
    from sru_lightning.app import cli

    old_flags = [word for word in arguments if word.startswith("--") and word != "--help"]
    assert not old_flags, f"`{command} {' '.join(arguments)}`: the documents spell settings key=value, not {old_flags}"
    module = importlib.import_module(cli.TOOL_COMMANDS[command][0])
    real = module.parse_settings  # every tool command: key=value settings, checked there

    def parse_then_stop(argv):
        raise Parsed(real(argv))

    monkeypatch.setattr(module, "parse_settings", parse_then_stop)
    try:
        status = cli.main([command, *arguments])
    except Parsed:
        return
    if "--help" in arguments or "-h" in arguments:
        assert status == 0, f"{command} --help exited {status}"
        return
    pytest.fail(f"`{command} {' '.join(arguments)}` did not get past its parser (exit status {status})")


def lightning_cli_module():
    """examples/lightning_cli.py, imported (it is a script, not a package module)."""
    spec = importlib.util.spec_from_file_location("lightning_cli_example", ROOT / LIGHTNING_CLI[1])
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def lightning_cli_parts(words: list[str]) -> tuple[list[str], str | None, str | None]:
    """(the script's arguments, the `--config` file they read, the `> file` its output goes to)."""
    arguments, output = words[len(LIGHTNING_CLI) :], None
    if ">" in arguments:
        at = arguments.index(">")
        arguments, output = arguments[:at], arguments[at + 1]
    config = arguments[arguments.index("--config") + 1] if "--config" in arguments else None
    return arguments, config, output


def parse_lightning_cli_arguments(arguments: list[str], monkeypatch) -> None:
    """Run the example's LightningCLI parser on `arguments` and stop before anything is built."""
    module = lightning_cli_module()

    def stop(self):
        raise Parsed(self.config)

    monkeypatch.setattr(module.LanguageModelCLI, "before_instantiate_classes", stop)
    monkeypatch.setattr(sys, "argv", [LIGHTNING_CLI[1]])  # the script's own, not pytest's
    try:
        module.main(arguments)
    except Parsed:
        return
    except SystemExit as exit:  # --print_config (0) or a parser error
        assert exit.code in (0, None), f"`{' '.join(arguments)}` did not get past its parser (exit {exit.code})"
        return
    pytest.fail(f"`{' '.join(arguments)}` did not stop after its parser")


def makefile_targets() -> set[str]:
    text = (ROOT / "Makefile").read_text()
    return set(re.findall(r"^([A-Za-z][\w.-]*):", text, re.M))


def pyproject_extras() -> set[str]:
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        tomllib = pytest.importorskip("tomli", reason="reading pyproject.toml on Python 3.10 needs tomli")
    return set(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"])


def check_pip_install(words: list[str]) -> None:
    targets = [w for w in words[2:] if not w.startswith("-")]
    assert targets, words
    for target in targets:
        match = re.fullmatch(r"(?:sru_lightning|\.)(?:\[([\w,-]+)\])?", target)
        assert match, f"pip install of {target!r}: the docs install this package with its extras"
        missing = set((match.group(1) or "").split(",")) - {""} - pyproject_extras()
        assert not missing, f"extras {sorted(missing)} are not in pyproject.toml"


def sbatch_overrides(words: list[str], env: dict[str, str]) -> list[str]:
    """The fit overrides examples/slurm_requeue.sbatch passes for this submission."""
    script = next(w for w in words if w.endswith(".sbatch"))
    assert (ROOT / script).is_file(), script
    assert subprocess.run(["bash", "-n", str(ROOT / script)]).returncode == 0
    for word in words:
        if word.startswith("--export="):
            env.update(dict(part.split("=", 1) for part in word.split("=", 1)[1].split(",") if "=" in part))
    text = (ROOT / script).read_text()
    assert "-m sru_lightning fit" in text and "EXTRA_OVERRIDES" in text
    return [f"trainer={env.get('TRAINER', 'ddp')}", "trainer.devices=1", *env.get("EXTRA_OVERRIDES", "").split()]


def check_example_script(script: str, arguments: list[str]) -> None:
    """A Python example's arguments go through the example's own parser, which stops there."""
    path = ROOT / script
    assert path.is_file(), path
    spec = importlib.util.spec_from_file_location(f"documented_example_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert hasattr(module, "parse_args"), f"{script} needs a parse_args(argv) for this check"
    try:
        module.parse_args(arguments)
    except SystemExit as exit:  # argparse's usage error
        pytest.fail(f"`{script} {' '.join(arguments)}` did not get past its parser (exit status {exit.code})")


def check_harness_arguments(arguments: list[str], monkeypatch) -> None:
    """`python -m sru_lightning.hf.lm_eval ...`: the harness's own parser accepts the arguments
    (it stops there) and the model they name is registered."""
    pytest.importorskip("lm_eval", reason="the evaluation harness needs the `hf` extra")
    from lm_eval._cli import HarnessCLI
    from lm_eval.api.registry import get_model

    import sru_lightning.hf.harness  # noqa: F401  (registers --model sru_lightning)

    monkeypatch.setattr(sys, "argv", ["lm_eval", *arguments])
    try:
        parsed = HarnessCLI().parse_args()
    except SystemExit as exit:  # argparse's usage error
        pytest.fail(f"`lm_eval {' '.join(arguments)}` did not get past its parser (exit status {exit.code})")
    get_model(parsed.model)


def check_statically(command: Command, monkeypatch) -> None:
    """The check every documented command gets (nothing runs but parsers and Hydra's compose)."""
    words = shlex.split(substitute(command.text, {"run": "outputs/run", "scratch": "/tmp"}))
    env = {}
    while words and re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", words[0]):
        key, value = words.pop(0).split("=", 1)
        env[key] = value
    program = words[0]
    if program == "make":
        missing = set(words[1:]) - makefile_targets()
        assert not missing, f"Makefile has no target {sorted(missing)}"
        return
    if program == "pip" or words[:3] == ["python", "-m", "pip"]:
        check_pip_install(words if program == "pip" else words[2:])
        return
    if program == "bash" and words[1].startswith("examples/"):
        script = ROOT / words[1]
        assert script.is_file(), script
        assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
        if script.name == "gpu_check.sh":  # exec python -m sru_lightning gpu-check "$@"
            assert 'gpu-check "$@"' in script.read_text()
            parse_tool_arguments("gpu-check", words[2:], monkeypatch)
        return
    if program == "sbatch":
        compose_overrides("fit", sbatch_overrides(words, env))
        return
    if words[: len(LIGHTNING_CLI)] == LIGHTNING_CLI:
        arguments, config, _ = lightning_cli_parts(words)
        if config is not None:  # the file an earlier command writes; the run reads it
            at = arguments.index("--config")
            arguments = arguments[:at] + arguments[at + 2 :]
        parse_lightning_cli_arguments(arguments, monkeypatch)
        return
    if program == "python" and len(words) > 1 and words[1].startswith("examples/") and words[1].endswith(".py"):
        check_example_script(words[1], words[2:])
        return
    if words[:3] == ["python", "-m", "sru_lightning.hf.lm_eval"]:
        check_harness_arguments(words[3:], monkeypatch)
        return
    argv = sru_argv(words)
    assert argv is not None, f"no check for this kind of command; add one to {Path(__file__).name}"
    if argv in (["--help"], ["-h"]):  # the list of commands and config groups
        from sru_lightning.app import cli

        assert cli.main(argv) == 0
        return
    if argv and argv[0] == "<command>":  # the synopsis of every command
        from sru_lightning.app import cli

        for name in cli.TOOL_COMMANDS:
            parse_tool_arguments(name, ["--help"], monkeypatch)
        for name in TRAINER:
            compose_overrides(name, [])
        return
    for variant in expand_synopsis(argv):
        name, rest = variant[0], variant[1:]
        if name in TRAINER:
            compose_overrides(name, rest)
        elif name in TOOLS:
            parse_tool_arguments(name, rest, monkeypatch)
        else:
            pytest.fail(f"unknown command {name!r}")


@pytest.mark.parametrize("command", COMMANDS, ids=str)
def test_documented_command_is_valid(command, monkeypatch):
    check_statically(command, monkeypatch)


def test_the_documents_have_the_commands_this_test_expects():
    texts = [c.text for c in COMMANDS]
    assert texts[:2] == ["make run", "make test"], "README.md's first commands must stay `make run` / `make test`"
    kinds = {sru_argv(shlex.split(t))[0] for t in texts if sru_argv(shlex.split(t))}
    assert {"fit", "generate", "export", "bench", "build"} <= kinds, kinds
    for placeholder in NOT_RUN:
        assert any(placeholder in t for t in texts), f"NOT_RUN entry {placeholder!r} matches no command"


# --------------------------------------------------------------------------------------------
# running the cheap ones
def not_run_reason(text: str) -> str | None:
    words = shlex.split(text)
    if words[0] != "python":
        return f"launched by {words[0]}"
    for marker, reason in NOT_RUN.items():
        if marker in text + " ":
            return reason
    return None


RUNNABLE = [
    c
    for c in COMMANDS
    if (argv := sru_argv(shlex.split(c.text)))
    and not_run_reason(c.text) is None
    and (argv[0] in TRAINER or argv[0] in RUN_TOOLS)
]
LIGHTNING_CLI_RUNS = [c for c in COMMANDS if shlex.split(c.text)[: len(LIGHTNING_CLI)] == LIGHTNING_CLI]


@pytest.fixture(scope="module")
def scratch(tmp_path_factory):
    """A folder holding one tiny run (the `outputs/<date>/<time>` of the documents)."""
    from sru_lightning.app import cli

    folder = tmp_path_factory.mktemp("doc_commands")
    here = os.getcwd()
    os.chdir(folder)
    try:
        assert cli.main(["fit", "debug=tiny"]) == 0
    finally:
        os.chdir(here)
    (result,) = folder.glob("outputs/*/*/result.json")
    assert json.loads(result.read_text())["status"] == "completed"
    # the documents of `data=documents`: a folder of text files, and the same as JSON Lines
    from pydoc_data.topics import topics

    texts = [topics[key][:3000] for key in sorted(topics)[:40]]
    (folder / "my_documents").mkdir()
    for index, text in enumerate(texts):
        (folder / "my_documents" / f"{index:03d}.txt").write_text(text)
    (folder / "corpus.jsonl").write_text("".join(json.dumps({"body": text}) + "\n" for text in texts))
    return folder, result.parent.relative_to(folder).as_posix()


def run_documented(command: Command, scratch, monkeypatch, capsys) -> None:
    from sru_lightning.app import cli

    folder, run = scratch
    monkeypatch.chdir(folder)
    argv = sru_argv(shlex.split(substitute(command.text, {"run": run, "scratch": str(folder)})))
    name = argv[0]
    if name in TRAINER:
        argv = [*argv, "debug=tiny"]
        if "-m" in argv:
            argv.append(f"hydra.sweep.dir=multirun/{len(list(folder.glob('multirun/*')))}")
    if name == "generate":
        argv = [a if not a.startswith("length=") else "length=20" for a in argv]
        model = next((a.split("=", 1)[1] for a in argv if a.startswith("model=")), None)
        if model and not (folder / model).is_dir():  # the export the documents make first
            export = next(c for c in RUNNABLE if f"out={model}" in c.text)
            run_documented(export, scratch, monkeypatch, capsys)
    if name == "export":
        out = next(a.split("=", 1)[1] for a in argv if a.startswith("out="))
        if (folder / out).is_dir():
            return
    status = cli.main(argv)
    out, err = capsys.readouterr()
    assert status == 0, f"{command} exited {status}:\n{err[-3000:]}"
    if name == "generate":
        assert out.strip(), "generate wrote no text"


@pytest.mark.parametrize(
    "command",
    [pytest.param(c, marks=pytest.mark.slow) if any(s in c.text for s in SLOW_RUNS) else c for c in RUNNABLE],
    ids=str,
)
def test_documented_command_runs(command, scratch, monkeypatch, capsys):
    run_documented(command, scratch, monkeypatch, capsys)


def run_documented_lightning_cli(command: Command, folder: Path, monkeypatch, capsys) -> None:
    """A documented example command, in-process in `folder`, with the tiny sizes appended; the
    commands writing the files it reads (`--config`, the checkpoint) run first when missing."""
    monkeypatch.chdir(folder)
    arguments, config, output = lightning_cli_parts(shlex.split(command.text))
    if config is not None and not (folder / config).is_file():
        writer = next(c for c in LIGHTNING_CLI_RUNS if lightning_cli_parts(shlex.split(c.text))[2] == config)
        run_documented_lightning_cli(writer, folder, monkeypatch, capsys)
    if LIGHTNING_CLI_CHECKPOINT in arguments:
        written = sorted((folder / "checkpoints").glob("*.ckpt"), key=lambda path: path.stat().st_mtime)
        if not written:
            fit = next(c for c in LIGHTNING_CLI_RUNS if " fit " in c.text and "--print_config" not in c.text)
            run_documented_lightning_cli(fit, folder, monkeypatch, capsys)
            written = sorted((folder / "checkpoints").glob("*.ckpt"), key=lambda path: path.stat().st_mtime)
        arguments = [str(written[-1]) if a == LIGHTNING_CLI_CHECKPOINT else a for a in arguments]
    monkeypatch.setattr(sys, "argv", [LIGHTNING_CLI[1]])  # the script's own, not pytest's
    capsys.readouterr()
    try:
        lightning_cli_module().main([*arguments, *LIGHTNING_CLI_TINY])
    except SystemExit as exit:  # --print_config ends the process after printing
        assert exit.code in (0, None), f"{command} exited {exit.code}:\n{capsys.readouterr().err[-3000:]}"
    printed = capsys.readouterr().out
    if output is not None:
        (folder / output).write_text(printed)


@pytest.mark.parametrize("command", LIGHTNING_CLI_RUNS, ids=str)
def test_documented_lightning_cli_command_runs(command, tmp_path_factory, monkeypatch, capsys):
    folder = tmp_path_factory.getbasetemp() / "lightning_cli_doc_commands"
    folder.mkdir(exist_ok=True)
    run_documented_lightning_cli(command, folder, monkeypatch, capsys)
