"""The model of a run: the network of `model.net` (its vocabulary the data's), the LightningModule
that trains it, and the checks that it fits the data and the checkpoint it starts from."""

from __future__ import annotations

from typing import Any

from sru_lightning.app.usage import UsageError

from .checkpoints import check_fits_model
from .folder import RunFolder
from .init_from import InitialWeights, put_initial_weights, without_init_from
from .interfaces import KeepsDocumentsApart, PacksDocuments, TokenUnitData, provides
from .refusals import checkpoint_setting, instantiate_setting
from .starting_point import StartingPoint

__all__ = ["build_model"]


def build_model(
    cfg, command: str, datamodule, vocab_size: int, start: StartingPoint, initial: InitialWeights | None = None
):
    """The LightningModule of `cfg.model` for `datamodule`, its network started from `initial`
    weights (`model.init_from`) if given; a model that cannot train or evaluate on that data, or
    start from that checkpoint, is refused in one line."""
    token_unit = datamodule.token_unit if provides(datamodule, TokenUnitData) else None
    model = _instantiate(without_init_from(cfg.model), command, vocab_size, token_unit)
    if initial is not None:
        put_initial_weights(model.net, initial)
    packs = provides(datamodule, PacksDocuments) and datamodule.packs_documents
    if packs and provides(model, KeepsDocumentsApart) and not model.accepts_document_boundaries:
        raise UsageError(
            f"data ({cfg.data.get('_target_')}) packs documents with their boundaries, which "
            f"model.net.rnn={getattr(model.net, 'rnn_type', None)!r} cannot keep apart: use model=sru or model=srupp"
        )
    if command == "fit" and start.checkpoint is not None:
        with checkpoint_setting():
            check_fits_model(start.loaded, model)
    net_vocabulary = getattr(getattr(model, "net", None), "vocab_size", vocab_size)
    if net_vocabulary != vocab_size:
        raise UsageError(
            f"the checkpoint {start.checkpoint!r} was trained with a vocabulary of {net_vocabulary} tokens, but "
            f"the data ({cfg.data.get('_target_')}) has {vocab_size}; evaluate it on the data it was "
            f"trained on (see data: in its run directory's {RunFolder.HYDRA_DIR}/{RunFolder.CONFIG_FILE})"
        )
    return model


def _instantiate(model_config, command: str, vocab_size: int, token_unit: str | None):
    """The network from `model.net` (its vocabulary the data's, unless an evaluated checkpoint's
    config names the one it was trained with), then the LightningModule that trains it."""
    from omegaconf import OmegaConf

    net_config = model_config.get("net")
    if not OmegaConf.is_dict(net_config):
        raise UsageError(
            f"`model.net` must be a mapping whose `_target_` names the network (e.g. sru_lightning.nn.LanguageNet), "
            f"got {net_config!r}"
        )
    if "_target_" not in net_config:  # a checkpoint's saved arguments of the default network
        net_config = OmegaConf.merge({"_target_": "sru_lightning.nn.LanguageNet"}, net_config)
    net_kwargs = {} if "vocab_size" in net_config and command != "fit" else {"vocab_size": vocab_size}
    net = instantiate_setting(net_config, **net_kwargs)
    model_kwargs: dict[str, Any] = {"net": net}
    if token_unit is not None:  # the data decides what a token is, and so the metric names
        model_kwargs["token_unit"] = token_unit
    return instantiate_setting(model_config, **model_kwargs)
