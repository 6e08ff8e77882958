"""The training fits of ``gpu-check``: each runs in its own process, one at a time, and
reports its losses, the recurrence's storage dtype and backend, its time and its peak GPU
memory; the judging of those reports runs (and is tested) anywhere."""

from __future__ import annotations

import json
import math
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

import torch

from sru_lightning.diagnostics.checks import FAIL, PASS, Check
from sru_lightning.diagnostics.kernel_parity import STORAGE_DTYPES

RESULT_PREFIX = "GPU_CHECK_RESULT "


# -- fits (each in its own process: DeepSpeed and CUDA state never leak between them) ----------
@dataclass
class FitSpec:
    name: str
    precision: str
    strategy: str = "auto"
    expected_storage: str | None = None  # "fp16" / "bf16" / "fp32"
    steps: int = 40
    batch: int = 16
    seq_len: int = 64
    hidden: int = 256
    layers: int = 2
    adam_eps: float = 1e-8
    peak_memory: bool = False
    accelerator: str = "gpu"  # "cpu" runs the same worker without a GPU (the worker's own test)


FITS = (
    FitSpec("fit 16-mixed", "16-mixed", expected_storage="fp16"),
    FitSpec("fit bf16-mixed", "bf16-mixed", expected_storage="bf16"),
    # fp16 weights need an Adam eps that fp16 can represent
    FitSpec("fit 16-true", "16-true", expected_storage="fp16", adam_eps=1e-4),
)
DEEPSPEED_FITS = (
    FitSpec("fit DeepSpeed ZeRO-2 fp16", "16-mixed", strategy="deepspeed_stage_2", expected_storage="fp16"),
    FitSpec("fit DeepSpeed ZeRO-2 bf16", "bf16-mixed", strategy="deepspeed_stage_2", expected_storage="bf16"),
)
# Activation-heavy shapes, so the memory comparison measures what 16-mixed saves.
MEMORY_FITS = (
    FitSpec("memory 32-true", "32-true", steps=3, batch=64, seq_len=256, hidden=1024, layers=4, peak_memory=True),
    FitSpec("memory 16-mixed", "16-mixed", steps=3, batch=64, seq_len=256, hidden=1024, layers=4, peak_memory=True),
)


def fit_worker(spec: FitSpec) -> dict:
    """Train the language model for ``spec.steps`` steps on this process's GPU; report what happened.

    ``storage`` and ``backends`` describe the recurrence calls on the fit's device.
    """
    import lightning.pytorch as pl

    from sru_lightning.callbacks import SRUPrecisionCallback
    from sru_lightning.data import PydocDataModule
    from sru_lightning.models import SRULanguageModel
    from sru_lightning.nn import LanguageNet
    from sru_lightning.ops import trace_storage_dtypes

    class RecordLoss(pl.Callback):
        def __init__(self):
            self.losses = []

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            self.losses.append(float(outputs["loss"]))

    pl.seed_everything(0, verbose=False)
    data = PydocDataModule(batch_size=spec.batch, seq_len=spec.seq_len)
    net = LanguageNet(
        vocab_size=data.vocab_size,
        embedding_dim=min(spec.hidden, 256),
        hidden_size=spec.hidden,
        num_layers=spec.layers,
        dropout=0.0,
    )
    model = SRULanguageModel(
        net,
        optimizer={"_target_": "torch.optim.AdamW", "lr": 3e-3, "eps": spec.adam_eps},
    )
    recorder = RecordLoss()
    strategy = spec.strategy
    if strategy.startswith("deepspeed_stage_"):
        from lightning.pytorch.strategies import DeepSpeedStrategy

        # The data module's loader yields whole batches (batch_size=None), so Lightning cannot
        # read DeepSpeed's micro-batch size from it; say it.
        strategy = DeepSpeedStrategy(stage=int(strategy.rsplit("_", 1)[1]), logging_batch_size_per_gpu=spec.batch)
    trainer = pl.Trainer(
        accelerator=spec.accelerator,
        devices=1,
        precision=spec.precision,
        strategy=strategy,
        max_steps=spec.steps,
        limit_val_batches=0,
        num_sanity_val_steps=0,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[SRUPrecisionCallback(verbose=False), recorder],
    )
    on_gpu = spec.accelerator == "gpu"
    device_type = "cuda" if on_gpu else "cpu"
    if on_gpu:
        torch.cuda.reset_peak_memory_stats()
    started = time.perf_counter()
    with trace_storage_dtypes() as calls:
        trainer.fit(model, datamodule=data)
    if on_gpu:
        torch.cuda.synchronize()
    dtype_names = {dtype: name for name, dtype in STORAGE_DTYPES.items()}
    ours = [call for call in calls if call.device_type == device_type]
    return {
        "losses": recorder.losses,
        "seconds": time.perf_counter() - started,
        "peak_bytes": torch.cuda.max_memory_allocated() if on_gpu else 0,
        "storage": sorted({dtype_names.get(c.storage_dtype, str(c.storage_dtype)) for c in ours}),
        "backends": sorted({c.backend for c in ours}),
    }


def judge_fit(spec: FitSpec, report: dict) -> Check:
    """PASS when the loss stayed finite and fell, and the recurrence ran in the expected dtype on the GPU."""
    losses = report.get("losses", [])
    problems = []
    if len(losses) < min(spec.steps, 10):
        problems.append(f"only {len(losses)} of {spec.steps} steps ran")
    if not all(math.isfinite(loss) for loss in losses):
        problems.append("non-finite loss")
    window = max(1, min(5, len(losses) // 4))
    first, last = (
        (statistics.fmean(losses[:window]), statistics.fmean(losses[-window:])) if losses else (math.nan, math.nan)
    )
    if not spec.peak_memory and not last < first:
        problems.append("loss did not fall")
    if report.get("backends") != ["cpp"]:
        problems.append(f"recurrence backend on the device {report.get('backends')}, expected ['cpp']")
    if spec.expected_storage and report.get("storage") != [spec.expected_storage]:
        problems.append(f"recurrence stored {report.get('storage')}, expected ['{spec.expected_storage}']")
    detail = (
        f"loss {first:.3f} -> {last:.3f} in {len(losses)} steps, recurrence {report.get('storage')} "
        f"on cuda, peak {report.get('peak_bytes', 0) / 2**30:.2f} GiB, {report.get('seconds', 0):.1f} s"
    )
    return Check(spec.name, FAIL if problems else PASS, detail + ("; " + "; ".join(problems) if problems else ""))


def launch_fit(spec: FitSpec) -> subprocess.Popen:
    command = [sys.executable, "-m", "sru_lightning.diagnostics.gpu_check", "--fit-worker", json.dumps(spec.__dict__)]
    # Output goes to a file, not a pipe: workers running side by side never block on a full pipe.
    log = tempfile.TemporaryFile(mode="w+")
    process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, text=True)
    process.log = log
    return process


def collect_fit(spec: FitSpec, process: subprocess.Popen, timeout_s: float) -> tuple[Check, dict]:
    try:
        process.wait(timeout=max(timeout_s, 1.0))
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
        return Check(spec.name, FAIL, "did not finish within the time budget (gpu-check's `budget`)"), {}
    process.log.seek(0)
    output = process.log.read()
    process.log.close()
    for line in reversed(output.splitlines()):
        if line.startswith(RESULT_PREFIX):
            report = json.loads(line[len(RESULT_PREFIX) :])
            return judge_fit(spec, report), report
    tail = " | ".join(line for line in output.splitlines()[-6:] if line.strip())
    return Check(spec.name, FAIL, f"worker exited with status {process.returncode}: {tail}"), {}


def judge_memory(reports: dict) -> Check:
    full, mixed = reports.get("memory 32-true", {}), reports.get("memory 16-mixed", {})
    if not full.get("peak_bytes") or not mixed.get("peak_bytes"):
        return Check("memory 16-mixed / 32-true", FAIL, "a memory fit did not report its peak")
    ratio = mixed["peak_bytes"] / full["peak_bytes"]
    detail = (
        f"peak {mixed['peak_bytes'] / 2**30:.2f} GiB vs {full['peak_bytes'] / 2**30:.2f} GiB = {ratio:.2f} "
        "(LM, B=64 L=256 D=1024 x4 layers)"
    )
    return Check("memory 16-mixed / 32-true", PASS if ratio < 1.0 else FAIL, detail)
