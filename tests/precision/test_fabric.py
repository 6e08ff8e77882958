"""The recurrence precision under Lightning Fabric: SRUFabricPrecision picks the storage dtype
the Trainer's SRUPrecisionCallback picks and prints the same report, the recurrence runs in
it (traced), and the same model trains to the same losses under both, in one process and in
two DDP processes; examples/fabric_loop.py resumes exactly from its checkpoint.

Run as a script (`python test_fabric.py trainer|fabric PRECISION OUT`), this file is the
2-process fit the DDP tests start: Lightning's launcher runs it again for the second process.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from lightning.fabric import Fabric
from lightning.fabric.plugins.precision import (
    DeepSpeedPrecision,
    DoublePrecision,
    FSDPPrecision,
    HalfPrecision,
    MixedPrecision,
    Precision,
)
from lightning.pytorch import Callback, Trainer, seed_everything

from sru_lightning.callbacks import SRUFabricPrecision, SRUPrecisionCallback, apply_precision
from sru_lightning.models import SRULanguageModel
from sru_lightning.nn import LanguageNet
from sru_lightning.ops import trace_storage_dtypes
from sru_lightning.precision import detect_regime
from sru_lightning.precision.lightning import lightning_classes

F16, BF16, F32, F64 = torch.float16, torch.bfloat16, torch.float32, torch.float64
VOCAB, BATCH, SEQ_LEN, STEPS = 12, 4, 8, 3
ROOT = Path(__file__).resolve().parents[2]

# precision flag -> the recurrence storage dtype on one CPU process (policy "auto")
STORAGE_ON_CPU = {
    "32-true": F32,
    "64-true": F64,
    "16-mixed": BF16,  # Trainer and Fabric both turn 16-mixed on a CPU into bf16-mixed
    "bf16-mixed": BF16,
    "16-true": F16,
    "bf16-true": BF16,
}


# --------------------------------------------------------------------------------------------
# the same model, data and steps under a Trainer and under Fabric
def token_batches(rank: int = 0) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """STEPS windows of BATCH contiguous streams (each process its own streams)."""
    generator = torch.Generator().manual_seed(100 + rank)
    streams = torch.randint(0, VOCAB, (BATCH, STEPS * SEQ_LEN + 1), generator=generator)
    return [
        (streams[:, k * SEQ_LEN : (k + 1) * SEQ_LEN], streams[:, k * SEQ_LEN + 1 : (k + 1) * SEQ_LEN + 1])
        for k in range(STEPS)
    ]


def language_model() -> SRULanguageModel:
    seed_everything(3, verbose=False)
    # dropout 0: no random numbers drawn, so the two loops cannot differ by their draws
    net = LanguageNet(vocab_size=VOCAB, embedding_dim=8, hidden_size=16, num_layers=2, dropout=0.0)
    return SRULanguageModel(net, optimizer={"_target_": "torch.optim.Adam", "lr": 1e-2})


class RecordLosses(Callback):
    def __init__(self) -> None:
        self.losses: list[float] = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.losses.append(outputs["loss"].item())


def trainer_run(precision: str, devices: int = 1, rank: int = 0, strategy=None):
    """(callback, losses, traced storage dtypes) of STEPS Trainer steps (``strategy`` None:
    DDP on more than one device)."""
    callback, record = SRUPrecisionCallback(), RecordLosses()
    trainer = Trainer(
        accelerator="cpu",
        devices=devices,
        strategy=strategy or ("ddp" if devices > 1 else "auto"),
        precision=precision,
        max_steps=STEPS,
        callbacks=[callback, record],
        use_distributed_sampler=False,  # each process reads its own streams, as under Fabric
        logger=False,
        enable_progress_bar=False,
        enable_checkpointing=False,
        enable_model_summary=False,
    )
    with trace_storage_dtypes() as calls:
        # batch_size=None: the windows are batches already (a plain list would be read as
        # one loader per window)
        trainer.fit(language_model(), torch.utils.data.DataLoader(token_batches(rank), batch_size=None))
    return callback, record.losses, {call.storage_dtype for call in calls}


def fabric_run(precision: str, devices: int = 1, strategy=None):
    """(callback, losses, traced storage dtypes) of the same STEPS steps in a Fabric loop."""
    callback = SRUFabricPrecision()
    fabric = Fabric(
        accelerator="cpu",
        devices=devices,
        strategy=strategy or ("ddp" if devices > 1 else "auto"),
        precision=precision,
        callbacks=[callback],
    )
    fabric.launch()
    model = language_model()
    # The Trainer converts the module before configure_optimizers; so does this loop, so that
    # the optimizer (its float16 eps included) is built for the same weights.
    model = fabric.strategy.precision.convert_module(model)
    model, optimizer = fabric.setup(model, model.configure_optimizers()["optimizer"])
    losses, carried = [], None
    with trace_storage_dtypes() as calls:
        for inputs, targets in token_batches(fabric.global_rank):
            inputs, targets = fabric.to_device((inputs, targets))
            logits, state = model(inputs, carried)
            carried = state.detach()
            # As the model's training_step: the loss in float32 whatever the compute dtype.
            loss = F.cross_entropy(logits.float().reshape(-1, VOCAB), targets.reshape(-1))
            fabric.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            losses.append(loss.item())
    return callback, losses, {call.storage_dtype for call in calls}


@contextlib.contextmanager
def expected_warnings(precision: str):
    if precision == "16-mixed":
        with pytest.warns(UserWarning, match="Using `precision='bf16-mixed'` instead"):
            yield
    else:
        yield


# --------------------------------------------------------------------------------------------
# one process
@pytest.mark.parametrize("precision", sorted(STORAGE_ON_CPU))
def test_fabric_setup_reports_what_the_trainer_callback_reports(precision):
    """Construction only (no fit): the callback's own setup and report against Fabric's hook."""
    from helpers.tiny_trainer import tiny_trainer  # imported here: this file also runs as a script

    with expected_warnings(precision):
        trainer = tiny_trainer(precision=precision)
    trainer_callback = SRUPrecisionCallback()
    trainer_callback.setup(trainer, language_model(), "fit")
    trainer_report = trainer_callback.format_report(detect_regime(trainer))
    fabric_callback = SRUFabricPrecision()
    with expected_warnings(precision):
        fabric = Fabric(accelerator="cpu", devices=1, precision=precision, callbacks=[fabric_callback])
    fabric.setup(language_model())  # Fabric calls the callback's on_after_setup here
    assert fabric_callback.regime.storage_dtype("auto") == STORAGE_ON_CPU[precision]
    assert fabric_callback.report == trainer_report


@pytest.mark.slow
@pytest.mark.parametrize("precision", sorted(STORAGE_ON_CPU))
def test_fabric_and_trainer_pick_the_same_storage_print_the_same_report_and_train_alike(precision):
    with expected_warnings(precision):
        trainer_callback, trainer_losses, trainer_traced = trainer_run(precision)
    with expected_warnings(precision):
        fabric_callback, fabric_losses, fabric_traced = fabric_run(precision)

    storage = STORAGE_ON_CPU[precision]
    assert trainer_callback.regime.storage_dtype("auto") == fabric_callback.regime.storage_dtype("auto") == storage
    assert trainer_traced == fabric_traced == {storage}  # what was reported is what ran
    assert fabric_callback.report == trainer_callback.report
    assert fabric_callback.layers == ["net.rnn.rnn_lst.0", "net.rnn.rnn_lst.1"]
    assert len(fabric_losses) == len(trainer_losses) == STEPS
    # The same weights, batches, autocast and optimizer: the same arithmetic, the same losses.
    assert fabric_losses == trainer_losses


def test_the_report_goes_through_lightnings_rank_zero_logger(caplog, capsys):
    import logging

    name = "lightning.pytorch.utilities.rank_zero"  # where the Trainer callback's report goes too
    logger = logging.getLogger(name)
    logger.addHandler(caplog.handler)  # Lightning's logger may not propagate to the root
    try:
        with caplog.at_level(logging.INFO, logger=name):
            callback, _, _ = fabric_run("bf16-mixed")
    finally:
        logger.removeHandler(caplog.handler)
    messages = {r.getMessage() for r in caplog.records}
    assert callback.report in messages
    assert "storage bfloat16 | accumulation float32" in callback.report


def test_setup_module_calls_no_hook_so_apply_precision_does_it():
    callback = SRUFabricPrecision()
    fabric = Fabric(accelerator="cpu", devices=1, precision="bf16-true", callbacks=[callback])
    model = fabric.setup_module(language_model())
    assert callback.regime is None  # Fabric called no hook in setup_module
    applied = apply_precision(fabric, model, policy="fp32", verbose=False)
    assert applied.regime.storage_dtype("fp32") == F32
    assert applied.layers == ["net.rnn.rnn_lst.0", "net.rnn.rnn_lst.1"]
    assert {cell.recurrence_policy for cell in model.module.net.rnn.rnn_lst} == {"fp32"}
    assert "policy 'fp32'" in applied.report and "storage float32" in applied.report


def test_a_model_without_sru_layers_is_named_in_a_warning():
    fabric = Fabric(accelerator="cpu", devices=1, callbacks=[SRUFabricPrecision(verbose=False)])
    with pytest.warns(UserWarning, match="SRUFabricPrecision: Linear holds no SRU layer"):
        fabric.setup(torch.nn.Linear(2, 2))


def test_a_bad_policy_is_refused_naming_the_argument():
    with pytest.raises(ValueError, match="`policy` must be one of"):
        SRUFabricPrecision("bf16")


# --------------------------------------------------------------------------------------------
# Fabric's plugins and strategies, read by the Trainer's rule
def test_the_rule_accepts_both_lightning_class_trees():
    # Only the base Precision is shared; the regime plugins exist twice, unrelated.
    from lightning.pytorch.plugins import precision as trainer_plugins

    assert not issubclass(trainer_plugins.MixedPrecision, MixedPrecision)
    for name in ("MixedPrecision", "HalfPrecision", "DoublePrecision", "FSDPPrecision", "DeepSpeedPrecision"):
        assert len(set(lightning_classes("precision", name))) == 2
    with pytest.raises(ValueError, match="`kind` must be one of"):
        lightning_classes("plugins", "Precision")


@pytest.mark.parametrize(
    "plugin, name, weights, autocast, storage",
    [
        (Precision(), "32-true", F32, None, F32),
        (DoublePrecision(), "64-true", F64, None, F64),
        (MixedPrecision("bf16-mixed", "cpu"), "bf16-mixed", F32, BF16, BF16),
        (HalfPrecision("16-true"), "16-true", F16, None, F16),
        (HalfPrecision("bf16-true"), "bf16-true", BF16, None, BF16),
    ],
    ids=lambda value: value if isinstance(value, str) else None,
)
def test_fabric_plugins_map_as_the_trainers_do(plugin, name, weights, autocast, storage):
    regime = detect_regime(plugin)
    assert (regime.name, regime.param_dtype, regime.autocast_dtype, regime.storage_dtype("auto")) == (
        name,
        weights,
        autocast,
        storage,
    )
    assert regime.source == f"{type(plugin).__name__}(precision={name!r})"


@pytest.mark.parametrize(
    "precision, name, weights, autocast",
    [
        ("32-true", "fsdp-float32", F32, None),
        ("bf16-mixed", "fsdp-bf16-mixed", BF16, BF16),
        ("16-mixed", "fsdp-16-mixed", F16, F16),
        ("bf16-true", "fsdp-bfloat16", BF16, None),
    ],
)
def test_fsdp_precision_objects_of_both_trees_map_alike(precision, name, weights, autocast):
    from lightning.pytorch.plugins.precision import FSDPPrecision as TrainerFSDPPrecision

    fabric_regime, trainer_regime = (
        detect_regime(FSDPPrecision(precision)),
        detect_regime(TrainerFSDPPrecision(precision)),
    )
    assert fabric_regime == trainer_regime
    assert (fabric_regime.name, fabric_regime.param_dtype, fabric_regime.autocast_dtype) == (name, weights, autocast)
    assert fabric_regime.storage_dtype("auto") == (autocast or weights)


@pytest.mark.parametrize(
    "precision, name, storage",
    [("32-true", "deepspeed-fp32", F32), ("16-mixed", "deepspeed-fp16", F16), ("bf16-mixed", "deepspeed-bf16", BF16)],
)
def test_deepspeed_precision_objects_of_both_trees_map_alike(precision, name, storage):
    from lightning.pytorch.plugins.precision import DeepSpeedPrecision as TrainerDeepSpeedPrecision

    fabric_regime = detect_regime(DeepSpeedPrecision(precision))
    assert fabric_regime == detect_regime(TrainerDeepSpeedPrecision(precision))
    assert (fabric_regime.name, fabric_regime.storage_dtype("auto")) == (name, storage)


def test_fabric_strategies_are_read_like_the_trainers():
    from lightning.fabric.strategies import DeepSpeedStrategy, FSDPStrategy
    from torch.distributed.fsdp import MixedPrecision as FSDPMixedPrecision

    deepspeed = DeepSpeedStrategy(config={"bf16": {"enabled": True}}, precision=DeepSpeedPrecision("32-true"))
    assert detect_regime(deepspeed).name == "deepspeed-bf16"
    fsdp = FSDPStrategy(mixed_precision=FSDPMixedPrecision(param_dtype=F16), precision=FSDPPrecision("32-true"))
    regime = detect_regime(fsdp)
    assert (regime.param_dtype, regime.storage_dtype("auto"), regime.device_type) == (F16, F16, "cuda")


# --------------------------------------------------------------------------------------------
# two DDP processes
def ddp_fit(kind: str, precision: str, out: Path) -> None:
    """One process of a 2-process DDP fit (`kind` "trainer" or "fabric"); writes its results."""
    rank = int(os.environ.get("LOCAL_RANK", "0"))  # set for the processes Lightning starts
    if kind == "trainer":
        callback, losses, traced = trainer_run(precision, devices=2, rank=rank)
    else:
        callback, losses, traced = fabric_run(precision, devices=2)
    result = {"report": callback.report, "storage": sorted(map(str, traced)), "losses": losses}
    Path(f"{out}.rank{rank}.json").write_text(json.dumps(result))


def run_ddp_fit(kind: str, precision: str, tmp_path: Path) -> list[dict]:
    from helpers import distributed_fits

    out = tmp_path / f"{kind}-{precision}"
    command = [sys.executable, str(Path(__file__).resolve()), kind, precision, str(out)]
    ended = distributed_fits.finish(distributed_fits.start(out, command=command), timeout=240)
    assert ended.returncode == 0, ended.stdout[-3000:]
    return [json.loads(Path(f"{out}.rank{rank}.json").read_text()) for rank in range(2)]


@pytest.mark.slow
@pytest.mark.parametrize("precision, storage", [("32-true", "torch.float32"), ("bf16-mixed", "torch.bfloat16")])
def test_two_ddp_processes_pick_the_same_storage_and_losses_under_trainer_and_fabric(precision, storage, tmp_path):
    trainer_ranks = run_ddp_fit("trainer", precision, tmp_path)
    fabric_ranks = run_ddp_fit("fabric", precision, tmp_path)
    for trainer_rank, fabric_rank in zip(trainer_ranks, fabric_ranks):
        assert trainer_rank["storage"] == fabric_rank["storage"] == [storage]
        assert trainer_rank["report"] == fabric_rank["report"]
        assert "on cpu" in fabric_rank["report"]
        assert len(fabric_rank["losses"]) == STEPS
        assert fabric_rank["losses"] == trainer_rank["losses"]
    assert fabric_ranks[0]["losses"] != fabric_ranks[1]["losses"]  # each process read its own streams


# --------------------------------------------------------------------------------------------
# the example
TINY_EXAMPLE = ["--batch-size", "4", "--seq-len", "16", "--embedding-dim", "8", "--hidden-size", "16"]


def run_example(tmp_path: Path, name: str, *arguments: str) -> dict[int, str]:
    """{step: printed loss} of one run of examples/fabric_loop.py in `tmp_path`."""
    from helpers import distributed_fits

    command = [sys.executable, str(ROOT / "examples" / "fabric_loop.py"), *TINY_EXAMPLE, *arguments]
    process = distributed_fits.start(tmp_path / name, command=command)
    ended = distributed_fits.finish(process, timeout=240)
    assert ended.returncode == 0, ended.stdout[-3000:]
    assert "SRU recurrence precision (policy 'auto')" in ended.stdout
    return {int(step): loss for step, loss in re.findall(r"^step (\d+) loss (\S+)", ended.stdout, re.M)}


@pytest.mark.slow
@pytest.mark.parametrize("devices, precision", [("1", "32-true"), ("2", "bf16-mixed")])
def test_the_fabric_example_resumes_from_its_checkpoint_with_the_uninterrupted_losses(devices, precision, tmp_path):
    settings = ["--devices", devices, "--precision", precision, "--checkpoint-dir", str(tmp_path / "checkpoints")]
    uninterrupted = run_example(tmp_path, "uninterrupted", *settings, "--max-steps", "6", "--save-every", "3")
    checkpoint = tmp_path / "checkpoints" / "step-000003.ckpt"
    assert checkpoint.is_file()
    resumed = run_example(tmp_path, "resumed", *settings, "--max-steps", "6", "--resume", str(checkpoint))
    assert sorted(uninterrupted) == [1, 2, 3, 4, 5, 6]
    assert sorted(resumed) == [4, 5, 6]
    assert resumed == {step: uninterrupted[step] for step in (4, 5, 6)}


def test_the_fabric_examples_resume_takes_a_folder_and_refuses_other_settings_in_one_line(tmp_path):
    import importlib.util

    spec = importlib.util.spec_from_file_location("fabric_loop", ROOT / "examples" / "fabric_loop.py")
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    folder = tmp_path / "checkpoints"
    folder.mkdir()
    settings = {"batch_size": 4, "seq_len": 16, "embedding_dim": 8, "hidden_size": 16, "num_layers": 2}
    for step in (3, 12):
        torch.save({"model": {}, "step": step, "settings": settings}, folder / f"step-{step:06d}.ckpt")
    args = example.parse_args([*TINY_EXAMPLE, "--resume", str(folder)])
    args.resume = example.newest_checkpoint(args.resume)
    assert args.resume == folder / "step-000012.ckpt"  # a folder resumes its newest step
    example.check_settings(args)  # the checkpoint's own settings: nothing to say
    other = example.parse_args([*TINY_EXAMPLE, "--hidden-size", "32", "--resume", str(args.resume)])
    with pytest.raises(
        SystemExit, match=r"--hidden-size 32 differs from the 16 that .* was trained with; resume with --hidden-size 16"
    ):
        example.check_settings(other)
    for given, says in ((tmp_path / "none", "which does not exist"), (tmp_path, "which holds none")):
        with pytest.raises(SystemExit) as refused:
            example.newest_checkpoint(given)
        assert f"--resume must be a checkpoint of this script or its folder, got {given}, {says}" in str(refused.value)


def test_the_fabric_examples_resume_refuses_a_trainer_checkpoint_before_the_precision_report(tmp_path, capsys, caplog):
    import importlib.util

    spec = importlib.util.spec_from_file_location("fabric_loop", ROOT / "examples" / "fabric_loop.py")
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    trainer_checkpoint = tmp_path / "last.ckpt"  # the keys a Trainer (the CLI's fit) saves
    torch.save({"pytorch-lightning_version": "2.5.0", "state_dict": {}, "global_step": 3}, trainer_checkpoint)
    not_a_checkpoint = tmp_path / "notes.ckpt"
    not_a_checkpoint.write_text("not a checkpoint")
    cases = {
        trainer_checkpoint: "a checkpoint of a Trainer run (python -m sru_lightning fit): pass a step-NNNNNN.ckpt",
        not_a_checkpoint: "which torch cannot read as a checkpoint",
        tmp_path / "nowhere": "which does not exist",
    }
    for given, says in cases.items():
        with pytest.raises(SystemExit) as refused:
            example.main([*TINY_EXAMPLE, "--max-steps", "1", "--resume", str(given)])
        message = str(refused.value)
        assert f"--resume must be a checkpoint of this script or its folder, got {given}, {says}" in message
        assert "\n" not in message
        if given == trainer_checkpoint:
            assert message.endswith(f"or continue that run with python -m sru_lightning fit ckpt_path={given}")
    printed = capsys.readouterr()
    assert "SRU recurrence precision" not in printed.out + printed.err + caplog.text  # refused before Fabric reports


if __name__ == "__main__":
    ddp_fit(sys.argv[1], sys.argv[2], Path(sys.argv[3]))
