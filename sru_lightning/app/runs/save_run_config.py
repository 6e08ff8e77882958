"""What every checkpoint of a run carries: the format version, the run's configuration as it
trained, its identity and its owner (:class:`SaveRunConfig`).

The settings that produced a checkpoint's weights travel with them, so a checkpoint named by
run directory, by file, or as a copy elsewhere is evaluated and resumed with the same settings
(:mod:`.starting_point` reads them back).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from lightning.pytorch.callbacks import Callback

from sru_lightning.models.checkpoint_format import stamp_format

from .checkpoints import RUN_CONFIG_KEY, RUN_ID_KEY, RUN_OWNER_KEY

__all__ = ["SaveRunConfig", "plain_config"]

#: Commands' top-level settings that say what to do, not how the run trains.
COMMAND_SETTINGS = ("ckpt_path", "resume_dir", "optimized_metric")


class SaveRunConfig(Callback):
    """Writes the format version, the run's configuration, its identity (:mod:`.identity`) and its
    owner into every checkpoint it saves (under :data:`.checkpoints.RUN_CONFIG_KEY`,
    :data:`~.checkpoints.RUN_ID_KEY` and :data:`~.checkpoints.RUN_OWNER_KEY`).

    The configuration is stored unresolved, as plain values, so the checkpoint stays loadable
    with `weights_only=True` and a moved run's paths are not baked in.
    """

    def __init__(
        self, config: Mapping[str, Any], owner: Mapping[str, str] | None = None, run_id: str | None = None
    ) -> None:
        super().__init__()
        self.config = dict(config)
        self.owner = dict(owner or {})
        self.run_id = run_id

    def on_save_checkpoint(self, trainer, pl_module, checkpoint: dict[str, Any]) -> None:
        stamp_format(checkpoint)
        checkpoint[RUN_CONFIG_KEY] = self.config
        if self.run_id:
            checkpoint[RUN_ID_KEY] = self.run_id
        if self.owner:
            checkpoint[RUN_OWNER_KEY] = self.owner


def plain_config(cfg) -> dict[str, Any]:
    """The run's config without Hydra's own node and the command settings, as plain values."""
    from omegaconf import OmegaConf

    container = OmegaConf.to_container(cfg, resolve=False)
    for key in ("hydra", *COMMAND_SETTINGS):
        container.pop(key, None)
    return container
