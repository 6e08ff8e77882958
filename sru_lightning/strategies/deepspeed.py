"""Lightning's DeepSpeedStrategy, able to run on CPU processes as well as on CUDA GPUs."""

from __future__ import annotations

import argparse
import contextlib
import errno
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from lightning.pytorch.accelerators import CPUAccelerator
from lightning.pytorch.strategies import DDPStrategy
from lightning.pytorch.strategies import DeepSpeedStrategy as LightningDeepSpeedStrategy
from lightning.pytorch.utilities import rank_zero_info
from lightning.pytorch.utilities.exceptions import MisconfigurationException

from sru_lightning._atomic import PARTIAL_SUFFIX, discard, put_in_place
from sru_lightning._lightning_compat import init_deepspeed_distributed

from .checkpoint_io import CheckpointWriteError

__all__ = ["DeepSpeedStrategy", "HardwareRefusesDtype", "cpu_device_rank", "refuse_unsupported_fp16"]


class HardwareRefusesDtype(MisconfigurationException):
    """The engine cannot run the requested dtype on this hardware."""


class DeepSpeedStrategy(LightningDeepSpeedStrategy):
    """``lightning.pytorch.strategies.DeepSpeedStrategy`` that also runs on CPU.

    On CUDA it is Lightning's class unchanged. With ``accelerator="cpu"`` it skips the three
    places where Lightning assumes a GPU: the CUDA-only check of ``setup_environment``, the
    device-index check of ``setup_distributed`` (CPU devices have no index) and the
    ``device_rank`` handed to ``deepspeed.initialize`` (the process's local rank instead of a
    GPU index). DeepSpeed itself selects its CPU accelerator and gloo.
    """

    @property
    def _on_cpu(self) -> bool:
        return isinstance(self.accelerator, CPUAccelerator)

    @property
    def precision_plugin(self):
        return LightningDeepSpeedStrategy.precision_plugin.fget(self)

    @precision_plugin.setter
    def precision_plugin(self, plugin) -> None:
        LightningDeepSpeedStrategy.precision_plugin.fset(self, plugin)
        # The Trainer attaches the accelerator, then the precision: refuse a dtype the
        # hardware cannot run right there, while the Trainer is being built.
        if plugin is not None and self.accelerator is not None and self._on_cpu:
            self._refuse_unsupported_dtype()

    def setup_environment(self) -> None:
        if not self._on_cpu:
            return super().setup_environment()
        self._refuse_unsupported_dtype()
        # DeepSpeedStrategy's own check accepts CUDA only; the rest is DDP's.
        return DDPStrategy.setup_environment(self)

    def setup_distributed(self) -> None:
        if not self._on_cpu:
            return super().setup_distributed()
        from lightning.fabric.utilities.seed import reset_seed

        reset_seed()
        self.set_world_ranks()
        init_deepspeed_distributed(self)

    def _refuse_unsupported_dtype(self) -> None:
        refuse_unsupported_fp16(self.precision_plugin.precision, self.config)

    def save_checkpoint(self, checkpoint: dict, filepath: Any, storage_options: Any | None = None) -> None:
        """A checkpoint folder that is whole or absent, as :class:`~.checkpoint_io.AtomicCheckpointIO`
        makes checkpoint files.

        Every rank writes its part into ``<folder>.partial``; once all have, rank 0 puts it in
        place of ``<folder>`` (replacing an earlier one, as `last.ckpt` is replaced). A rank whose
        write fails (a full disk) removes the partial folder and raises
        :class:`~.checkpoint_io.CheckpointWriteError` naming the folder, so no half-written shard
        is left under a checkpoint's real name. Remote paths are left to Lightning's writer.
        """
        target = str(self.broadcast(str(filepath)))
        if "://" in target:
            super().save_checkpoint(checkpoint, target, storage_options)
            return
        partial = target + PARTIAL_SUFFIX
        if self.is_global_zero:
            discard(partial)  # left by a process killed while writing
        self.barrier("sru_lightning_checkpoint_partial_cleared")
        try:
            super().save_checkpoint(checkpoint, partial, storage_options)
        except (OSError, RuntimeError) as error:
            discard(partial)
            raise CheckpointWriteError(target, _write_failure(error, partial)) from error
        except BaseException:
            discard(partial)
            raise
        self.barrier("sru_lightning_checkpoint_written")
        if self.is_global_zero:
            put_in_place(partial, target)
        self.barrier("sru_lightning_checkpoint_in_place")

    def init_deepspeed(self) -> None:
        # The engine is made here, for training and for inference alike.
        with cpu_device_rank(self.local_rank if self._on_cpu else None):
            super().init_deepspeed()
        if self._on_cpu:
            rank_zero_info(
                f"DeepSpeed ZeRO stage {self.config.get('zero_optimization', {}).get('stage')} on CPU (gloo)"
            )


@contextlib.contextmanager
def cpu_device_rank(local_rank: int | None) -> Iterator[None]:
    """Lightning (Trainer and Fabric alike) passes ``device_rank=root_device.index`` to
    ``deepspeed.initialize``; a CPU device has no index (None), which DeepSpeed cannot compare.
    Pass the process's local rank, which DeepSpeed's CPU accelerator maps to its one device,
    within this context only. ``local_rank`` None (not on CPU) changes nothing."""
    if local_rank is None:
        yield
        return
    import deepspeed

    initialize = deepspeed.initialize

    def initialize_on_cpu(*args: Any, **kwargs: Any):
        namespace = kwargs.get("args")
        if namespace is not None and getattr(namespace, "device_rank", 0) is None:
            kwargs["args"] = argparse.Namespace(**{**vars(namespace), "device_rank": local_rank})
        return initialize(*args, **kwargs)

    deepspeed.initialize = initialize_on_cpu
    try:
        yield
    finally:
        deepspeed.initialize = initialize


def refuse_unsupported_fp16(precision: str, config: Any, setting: str = "trainer.precision") -> None:
    """fp16 on a CPU whose DeepSpeed accelerator has no fp16 kernels fails deep inside the
    engine; say it in one sentence (naming ``setting``, the user's precision setting) before any
    process group starts. Whether the CPU has them
    depends on the machine (AVX-512 FP16 / AMX): DeepSpeed's accelerator is asked, never assumed."""
    wants_fp16 = precision in ("16-mixed", "16-true") or _enabled(config, "fp16")
    if not wants_fp16:
        return
    from deepspeed.accelerator import get_accelerator

    accelerator = get_accelerator()
    if accelerator.is_fp16_supported():
        return
    raise HardwareRefusesDtype(
        f"DeepSpeed cannot train in fp16 on this {accelerator.device_name()} (its accelerator "
        f"{type(accelerator).__name__} has no fp16 support); use {setting}=bf16-mixed or 32-true "
        "here, or fp16 on a CUDA GPU"
    )


def _enabled(config: Any, key: str) -> bool:
    section = config.get(key) if isinstance(config, dict) else None
    return isinstance(section, dict) and bool(section.get("enabled", False))


def _write_failure(error: BaseException, partial: str) -> OSError:
    """The OSError behind a failed DeepSpeed save. torch's file writer reports a short write (a
    full disk) as a RuntimeError about stream positions; the disk's free space tells which."""
    if isinstance(error, OSError):
        return error
    try:
        full = shutil.disk_usage(Path(partial).parent).free < (1 << 20)
    except OSError:
        full = False
    if full:
        return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    return OSError(errno.EIO, f"the checkpoint writer failed: {str(error).strip().splitlines()[-1]}")
