"""Train and evaluate `SRULanguageModel` with Lightning's own `LightningCLI` (jsonargparse), no Hydra.

The data module is any `LanguageModelDataModule` (default: `PydocDataModule`, the English prose
shipped with Python, as `python -m sru_lightning fit` uses); the model's vocabulary size and
token unit are taken from it. Every argument of the model, its network (`--model.net`, default
`sru_lightning.nn.LanguageNet`), the data module, the Trainer and its callbacks is a flag or a
YAML key:

    python examples/lightning_cli.py fit --model.net.hidden_size 256 --trainer.precision bf16-mixed \\
        --trainer.callbacks+=sru_lightning.callbacks.SRUPrecisionCallback
    python examples/lightning_cli.py fit --print_config > config.yaml
    python examples/lightning_cli.py fit --config config.yaml
    python examples/lightning_cli.py validate --config config.yaml --ckpt_path <file.ckpt>
    python examples/lightning_cli.py fit --data sru_lightning.data.TextDataModule --data.path my.txt

`--model.compile true` hands the Trainer `torch.compile(model)`, as the Hydra CLI does.
"""

from __future__ import annotations

from lightning.pytorch.cli import LightningArgumentParser, LightningCLI

from sru_lightning.data import LanguageModelDataModule, PydocDataModule
from sru_lightning.models import SRULanguageModel
from sru_lightning.models.language_model import DEFAULT_OPTIMIZER


class LanguageModelCLI(LightningCLI):
    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        # The model's vocabulary and metric names follow the data, as in the Hydra CLI; a
        # data module knows them only once it is built (it reads its text on first use).
        parser.link_arguments("data.vocab_size", "model.net.init_args.vocab_size", apply_on="instantiate")
        parser.link_arguments("data.token_unit", "model.token_unit", apply_on="instantiate")
        parser.set_defaults({"data": {"class_path": f"{PydocDataModule.__module__}.{PydocDataModule.__name__}"}})
        parser.set_defaults({"model.net": {"class_path": "sru_lightning.nn.LanguageNet"}})
        # The model's own default optimizer, spelled out: `--model.optimizer.lr 0.1` changes its
        # learning rate (a mapping without `_target_` would name no optimizer to build).
        parser.set_defaults({"model.optimizer": dict(DEFAULT_OPTIMIZER)})

    def instantiate_classes(self) -> None:
        try:
            super().instantiate_classes()
        except (ValueError, TypeError) as error:
            # A value the model, the data module or the Trainer refuses (`--model.net.rnn gru`): its
            # message names the setting; one line, as for a value the parser itself refuses.
            self.parser.error(str(error))
        if getattr(self.datamodule, "packs_documents", False) and not self.model.accepts_document_boundaries:
            self.parser.error(
                f"--data {type(self.datamodule).__name__} packs documents with their boundaries, which "
                f"--model.net.rnn {self.model.net.rnn_type} cannot keep apart: use --model.net.rnn sru or srupp"
            )
        # `model.compile` is honoured here too: the Trainer gets torch.compile(model), which
        # Lightning unwraps, so checkpoints keep the model's own parameter names.
        self.model = self.model.for_trainer()


def main(args: list[str] | None = None) -> None:
    LanguageModelCLI(
        SRULanguageModel,
        LanguageModelDataModule,
        subclass_mode_data=True,
        # A rerun in the same folder (fit, then validate) replaces the saved config.yaml.
        save_config_kwargs={"overwrite": True},
        args=args,
    )


if __name__ == "__main__":
    main()
