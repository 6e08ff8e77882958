"""Real 2-process fits under every distributed engine, on CPU processes (gloo).

`fit trainer=<engine> trainer.accelerator=cpu trainer.devices=2` runs through the command
line with a probe callback (tests/helpers/engine_probe.py) that records, per rank, the
per-step losses, the storage dtypes the recurrence kernels really ran in, the regime the
precision callback reported, and the local vs full size of an SRU layer's weight between
steps. Compared with the DDP run of the same config:

* 32-true: every rank's per-step losses within 1e-5 relative of DDP's (the engines reduce
  gradients in another order, so not bit for bit);
* bf16: finite, and within BF16_TOLERANCE (2e-3, one bf16 rounding: 2^-9) of the float32
  DDP losses per step (measured: about 1e-4 over these steps; the loss itself is float32);
* the report names the storage dtype the kernels traced, on the device they ran on;
* ZeRO-3, FSDP and FSDP2 hold only their shard of a layer's weight between steps.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import preloaded

REPO = Path(__file__).resolve().parents[2]
HELPERS = Path(__file__).resolve().parents[1] / "helpers"
MAX_STEPS = 6
FP32_TOLERANCE = 1e-5
BF16_TOLERANCE = 2e-3

TINY_DISTRIBUTED_FIT = [
    "data.seq_len=16",
    "data.batch_size=4",
    "model.net.embedding_dim=16",
    "model.net.hidden_size=32",
    "model.net.num_layers=2",
    "model.net.dropout=0",
    "model.lr_scheduler=null",
    "model.optimizer.lr=0.01",
    f"trainer.max_steps={MAX_STEPS}",
    "trainer.limit_val_batches=1",
    "trainer.accelerator=cpu",
    "trainer.devices=2",
    "logger=none",
    "~callbacks.rich_progress_bar",
    "seed=11",
]

ENGINES = ["deepspeed_stage_2", "deepspeed_stage_3", "fsdp", "fsdp2"]
SHARDED = {"deepspeed_stage_3", "fsdp", "fsdp2"}


def _environment() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), str(HELPERS), env.get("PYTHONPATH")]))
    env["OMP_NUM_THREADS"] = "1"
    return env


def run_fit(run_dir: Path, *overrides: str, timeout: int = 400) -> subprocess.CompletedProcess:
    command = [
        sys.executable,
        "-m",
        "sru_lightning",
        "fit",
        f"hydra.run.dir={run_dir}",
        *TINY_DISTRIBUTED_FIT,
        *overrides,
    ]
    return preloaded.run(
        command,
        cwd=run_dir.parent,
        env=_environment(),
        capture_output=True,
        text=True,
        timeout=timeout,
        preload_children=True,
    )


@functools.cache
def probed_fit(trainer: str, precision: str, root: str) -> tuple[dict, dict]:
    """Both ranks' probe records of one fit (cached: several tests read the same fit)."""
    run_dir = Path(root) / f"{trainer}-{precision}"
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    probe = run_dir.parent / f"{run_dir.name}-probe"
    completed = run_fit(
        run_dir,
        f"trainer={trainer}",
        f"trainer.precision={precision}",
        "+callbacks.probe._target_=engine_probe.EngineProbe",
        f"+callbacks.probe.out={probe}",
    )
    assert completed.returncode == 0, completed.stdout[-3000:] + completed.stderr[-3000:]
    ranks = tuple(json.loads((probe / f"rank{rank}.json").read_text()) for rank in (0, 1))
    return ranks


@pytest.fixture(scope="module")
def fits_root(tmp_path_factory) -> str:
    return str(tmp_path_factory.mktemp("engines"))


def _assert_losses_close(got: list[float], expected: list[float], tolerance: float, what: str) -> None:
    assert len(got) == len(expected) == MAX_STEPS, (what, got, expected)
    for step, (value, reference) in enumerate(zip(got, expected)):
        assert abs(value - reference) <= tolerance * abs(reference), (
            f"{what}: step {step} loss {value!r} vs DDP {reference!r} (tolerance {tolerance} relative)"
        )


class EngineChecks:
    """What every engine passes; one subclass per engine. The file's fits stay on one test
    worker (--dist loadfile): DeepSpeed's engines rendezvous on one default port."""

    engine: str

    @pytest.mark.slow
    def test_float32_matches_ddp_step_for_step(self, fits_root):
        engine = self.engine
        reference = probed_fit("ddp_cpu", "32-true", fits_root)
        ranks = probed_fit(engine, "32-true", fits_root)
        for rank, (record, expected) in enumerate(zip(ranks, reference)):
            assert record["world_size"] == 2
            _assert_losses_close(record["losses"], expected["losses"], FP32_TOLERANCE, f"{engine} rank {rank}")
            assert record["traced"] and all(entry.endswith(":float32") for entry in record["traced"]), record["traced"]
            assert record["reported_storage"] == "float32" and record["reported_device"] == "cpu"
        # the two ranks saw different data: the comparison is of two real shards of the batch
        assert ranks[0]["losses"] != ranks[1]["losses"]

    @pytest.mark.slow
    def test_bf16_trains_close_to_float32(self, fits_root):
        engine = self.engine
        reference = probed_fit("ddp_cpu", "32-true", fits_root)
        ranks = probed_fit(engine, "bf16-mixed", fits_root)
        for rank, (record, expected) in enumerate(zip(ranks, reference)):
            assert record["finite"], record["losses"]
            _assert_losses_close(record["losses"], expected["losses"], BF16_TOLERANCE, f"{engine} bf16 rank {rank}")
            # the report is what ran: every kernel call stored bf16, and the report says so
            assert record["traced"] and all(entry.endswith(":bfloat16") for entry in record["traced"]), record["traced"]
            assert record["reported_storage"] == "bfloat16" and record["reported_device"] == "cpu"

    @pytest.mark.slow
    def test_checkpoint_resumes_to_the_uninterrupted_losses(self, fits_root, tmp_path):
        """Stop after 3 of 6 steps, resume from the run directory under the same engine: the
        resumed steps' losses equal the uninterrupted run's on both ranks (constant learning rate,
        so the schedule does not depend on where the run stopped). The uninterrupted run is the
        float32 fit the other tests of this engine read."""
        engine = self.engine
        whole = probed_fit(engine, "32-true", fits_root)
        first = tmp_path / "parts" / "run"
        first.parent.mkdir()
        probe = tmp_path / "parts" / "probe"
        common = [
            f"trainer={engine}",
            "trainer.precision=32-true",
            "+callbacks.probe._target_=engine_probe.EngineProbe",
            f"+callbacks.probe.out={probe}",
        ]
        completed = run_fit(first, *common, "trainer.max_steps=3")
        assert completed.returncode == 0, completed.stderr[-3000:]
        completed = run_fit(first, *common, f"ckpt_path={first}")
        assert completed.returncode == 0, completed.stderr[-3000:]
        for rank in (0, 1):
            resumed = json.loads((probe / f"rank{rank}.json").read_text())["losses"]
            assert resumed == whole[rank]["losses"][3:], (engine, rank, resumed, whole[rank]["losses"])


class ShardingEngineChecks(EngineChecks):
    """What an engine that shards parameters passes besides."""

    @pytest.mark.slow
    def test_holds_only_its_shard_between_steps(self, fits_root):
        engine = self.engine
        ranks = probed_fit(engine, "32-true", fits_root)
        for record in ranks:
            assert len(record["shard_sizes"]) == MAX_STEPS
            for local, full in record["shard_sizes"]:
                assert 0 < full and local <= (full + 1) // 2 + 64, (engine, local, full)


class TestDeepSpeedStage2(EngineChecks):
    engine = "deepspeed_stage_2"

    @pytest.mark.slow
    def test_holds_the_whole_model_between_steps(self, fits_root):
        """ZeRO-2 shards optimizer state and gradients only: the measure the sharding engines
        are checked with sees every parameter whole here."""
        ranks = probed_fit(self.engine, "32-true", fits_root)
        assert all(local == full for local, full in ranks[0]["shard_sizes"])


class TestDeepSpeedStage3(ShardingEngineChecks):
    engine = "deepspeed_stage_3"


class TestFSDP(ShardingEngineChecks):
    engine = "fsdp"


class TestFSDP2(ShardingEngineChecks):
    engine = "fsdp2"


def test_every_engine_config_has_its_checks():
    classes = (TestDeepSpeedStage2, TestDeepSpeedStage3, TestFSDP, TestFSDP2)
    assert sorted(cls.engine for cls in classes) == sorted(ENGINES)
    assert {cls.engine for cls in classes if issubclass(cls, ShardingEngineChecks)} == SHARDED


def test_a_deepspeed_folder_is_refused_where_it_cannot_be_read(tmp_path):
    from omegaconf import OmegaConf

    from sru_lightning.app.runs.checkpoints import CheckpointError, check_engine_reads

    folder = tmp_path / "last.ckpt" / "checkpoint"
    folder.mkdir(parents=True)
    (folder / "zero_pp_rank_0_mp_rank_00_model_states.pt").write_bytes(b"")
    ddp = OmegaConf.create({"trainer": {"strategy": {"_target_": "lightning.pytorch.strategies.DDPStrategy"}}})
    deepspeed = OmegaConf.create({"trainer": {"strategy": {"_target_": "sru_lightning.strategies.DeepSpeedStrategy"}}})
    with pytest.raises(CheckpointError, match="DeepSpeed checkpoint folder .* consolidate"):
        check_engine_reads(ddp, "fit", folder.parent)
    with pytest.raises(CheckpointError, match="`validate` cannot read"):
        check_engine_reads(deepspeed, "validate", folder.parent)
    check_engine_reads(deepspeed, "fit", folder.parent)  # DeepSpeed resumes its own folders
    single = tmp_path / "single.ckpt"
    single.write_bytes(b"")
    with pytest.raises(CheckpointError, match="one-file checkpoint.*trainer=ddp_cpu"):
        check_engine_reads(deepspeed, "fit", single)
    check_engine_reads(ddp, "fit", single)


def _fp16_supported_by_deepspeed_here() -> bool:
    from deepspeed.accelerator import get_accelerator

    return bool(get_accelerator().is_fp16_supported())


@pytest.mark.slow
def test_deepspeed_fp16_on_a_cpu_without_fp16_is_one_line_and_exit_2(tmp_path):
    if torch_cuda_available() or _fp16_supported_by_deepspeed_here():
        pytest.skip("this machine's DeepSpeed accelerator runs fp16: nothing to refuse")
    completed = run_fit(tmp_path / "run", "trainer=deepspeed_stage_2", "trainer.precision=16-mixed")
    assert completed.returncode == 2, completed.stderr[-2000:]
    errors = [line for line in completed.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1 and "DeepSpeed cannot train in fp16" in errors[0] and "bf16-mixed" in errors[0]
    assert "Traceback" not in completed.stderr
    assert not (tmp_path / "run").exists()  # a refused run leaves no directory behind


def test_a_gpu_engine_config_without_a_gpu_says_how_to_run_on_cpu(tmp_path, monkeypatch, capsys):
    if torch_cuda_available():
        pytest.skip("a CUDA GPU is present: trainer=fsdp runs as configured")
    from sru_lightning.app import cli

    monkeypatch.chdir(tmp_path)  # the command line, run in this process: it is refused before any fit starts
    assert cli.main(["fit", "trainer=fsdp2", f"hydra.run.dir={tmp_path / 'run'}"]) == 2
    assert "add trainer.accelerator=cpu trainer.devices=2" in capsys.readouterr().err
    # NCCL DDP has no CPU form: its advice is the gloo config
    assert cli.main(["fit", "trainer=ddp", f"hydra.run.dir={tmp_path / 'ddp'}"]) == 2
    err = capsys.readouterr().err
    assert "use trainer=ddp_cpu" in err and "trainer.accelerator=cpu" not in err


def torch_cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


@pytest.mark.parametrize("precision", ["16-mixed", "bf16-mixed", "32-true"])
def test_the_clipping_fsdp_precision_takes_every_fsdp_precision(precision):
    from lightning.pytorch.plugins.precision import FSDPPrecision

    from sru_lightning.strategies.fsdp import ShardedClippingFSDPPrecision

    plugin = FSDPPrecision(precision)
    converted = ShardedClippingFSDPPrecision.from_plugin(plugin)
    assert converted.precision == precision and converted.scaler is plugin.scaler
    assert (converted.scaler is not None) == (precision == "16-mixed")


def _fake_deepspeed_folder(root, stage: int, processes: int):
    import torch

    from sru_lightning.models.checkpoint_format import FORMAT_KEY, FORMAT_VERSION

    folder = root / "last.ckpt" / "checkpoint"
    folder.mkdir(parents=True)
    name = "zero_pp_rank_0_mp_rank_00_model_states.pt" if stage == 3 else "mp_rank_00_model_states.pt"
    torch.save(
        {
            "global_step": 4,
            "dp_world_size": processes,
            "ds_config": {"zero_optimization": {"stage": stage}},
            FORMAT_KEY: FORMAT_VERSION,
        },
        folder / name,
    )
    for rank in range(processes):
        (folder / f"zero_pp_rank_{rank}_mp_rank_00_optim_states.pt").write_bytes(b"")
    return folder.parent


@pytest.mark.parametrize(
    ("stage", "processes", "trainer", "expected"),
    [
        (3, 2, {"stage": 2, "devices": 2}, "was written by DeepSpeed ZeRO-3, and this fit runs ZeRO-2"),
        (2, 2, {"stage": 3, "devices": 2}, "ZeRO-2, and this fit runs ZeRO-3"),
        (2, 2, {"stage": 2, "devices": 3}, "holds the shards of 2 DeepSpeed processes, and this fit runs 3"),
        (2, 2, {"stage": 2, "devices": 2}, None),
    ],
)
def test_a_deepspeed_folder_resumes_only_under_its_own_layout(tmp_path, stage, processes, trainer, expected):
    from omegaconf import OmegaConf

    from sru_lightning.app.runs.checkpoints import CheckpointError, check_engine_reads

    folder = _fake_deepspeed_folder(tmp_path, stage, processes)
    cfg = OmegaConf.create(
        {
            "trainer": {
                "devices": trainer["devices"],
                "num_nodes": 1,
                "strategy": {"_target_": "sru_lightning.strategies.DeepSpeedStrategy", "stage": trainer["stage"]},
            }
        }
    )
    if expected is None:
        check_engine_reads(cfg, "fit", folder)
        return
    with pytest.raises(CheckpointError, match=expected):
        check_engine_reads(cfg, "fit", folder)
