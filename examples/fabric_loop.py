"""Train the SRU language model with Lightning Fabric: a loop written by hand, on the text shipped
with every Python (`pydoc_data.topics`), with checkpoints that resume exactly.

`SRUFabricPrecision` in `Fabric(callbacks=[...])` sets the recurrence's storage dtype for the
precision Fabric runs in, as `SRUPrecisionCallback` does for a Trainer, when `fabric.setup`
calls its `on_after_setup` hook, and logs the same report.

    python examples/fabric_loop.py --max-steps 20
    python examples/fabric_loop.py --devices 2 --max-steps 20 --precision bf16-mixed
    python examples/fabric_loop.py --max-steps 40 --resume fabric_checkpoints/step-000020.ckpt
    python examples/fabric_loop.py --max-steps 60 --resume fabric_checkpoints   # its newest step

A resumed run continues from the checkpoint's step with the same weights, optimizer state,
data position, carried recurrent state (each process's own) and dropout masks, so its losses
are those of the run that was not interrupted.
"""

from __future__ import annotations

import argparse
import itertools
import math
from pathlib import Path

import torch
import torch.nn.functional as F
from lightning.fabric import Fabric

from sru_lightning.callbacks import SRUFabricPrecision
from sru_lightning.data import ContiguousStreams, PydocDataModule
from sru_lightning.models import SRULanguageModel
from sru_lightning.nn import LanguageNet

PRECISIONS = ("32-true", "64-true", "16-mixed", "bf16-mixed", "16-true", "bf16-true")
#: The settings a checkpoint is saved with and a resumed run must repeat: the model's shape and
#: the data streams' layout.
KEPT_SETTINGS = ("batch_size", "seq_len", "embedding_dim", "hidden_size", "num_layers")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--devices", type=int, default=1, help="CPU processes (DDP when more than one)")
    parser.add_argument("--precision", choices=PRECISIONS, default="32-true")
    parser.add_argument("--policy", choices=("auto", "fp32", "half"), default="auto", help="recurrence policy")
    parser.add_argument("--max-steps", type=int, default=20, help="train until this optimizer step")
    parser.add_argument("--batch-size", type=int, default=16, help="streams per process")
    parser.add_argument("--seq-len", type=int, default=64)
    parser.add_argument("--embedding-dim", type=int, default=64)
    parser.add_argument("--hidden-size", type=int, default=128)
    parser.add_argument("--num-layers", type=int, default=2)
    parser.add_argument("--dropout", type=float, default=0.1)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--checkpoint-dir", type=Path, default=Path("fabric_checkpoints"))
    parser.add_argument("--save-every", type=int, default=0, help="also save every N steps (0: only at the end)")
    parser.add_argument(
        "--resume", type=Path, default=None, help="a checkpoint this script wrote, or its folder (the newest step)"
    )
    args = parser.parse_args(argv)
    for name in ("devices", "max_steps", "batch_size", "seq_len", "embedding_dim", "hidden_size", "num_layers"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be a positive integer, got {getattr(args, name)}")
    if args.save_every < 0:
        parser.error(f"--save-every must be 0 or a positive integer, got {args.save_every}")
    return args


def newest_checkpoint(given: Path) -> Path:
    """`--resume` as a file: the file itself, or the highest step-NNNNNN.ckpt of a folder."""
    problem = None
    if given.is_dir():
        saved = sorted(given.glob("step-*.ckpt"))
        if saved:
            return saved[-1]  # zero-padded steps: the last name is the highest step
        problem = "which holds none"
    elif not given.is_file():
        problem = "which does not exist"
    if problem:
        raise SystemExit(
            f"fabric_loop.py: --resume must be a checkpoint of this script or its folder, got {given}, {problem}"
        )
    return given


def check_settings(args: argparse.Namespace) -> None:
    """A resumed run repeats the checkpoint's model and data settings: one line naming the
    first flag that differs, rather than a size mismatch deep inside the load. A file that is
    not a checkpoint of this script (a Trainer's, from `python -m sru_lightning fit`) is named."""
    refused = f"fabric_loop.py: --resume must be a checkpoint of this script or its folder, got {args.resume}"
    try:
        checkpoint = torch.load(args.resume, map_location="cpu", weights_only=True)
    except Exception as error:  # not a file torch.save wrote, or one holding more than plain data
        raise SystemExit(f"{refused}, which torch cannot read as a checkpoint ({type(error).__name__})") from None
    if not isinstance(checkpoint, dict) or "model" not in checkpoint:
        if isinstance(checkpoint, dict) and "pytorch-lightning_version" in checkpoint:
            raise SystemExit(
                f"{refused}, a checkpoint of a Trainer run (python -m sru_lightning fit): pass a step-NNNNNN.ckpt "
                f"this script saved in --checkpoint-dir, or continue that run with "
                f"python -m sru_lightning fit ckpt_path={args.resume}"
            )
        raise SystemExit(f"{refused}, which holds no 'model' state")
    saved = checkpoint.get("settings", {})
    for name in KEPT_SETTINGS:
        if name in saved and saved[name] != getattr(args, name):
            flag = "--" + name.replace("_", "-")
            raise SystemExit(
                f"fabric_loop.py: {flag} {getattr(args, name)} differs from the {saved[name]} that {args.resume} "
                f"was trained with; resume with {flag} {saved[name]}"
            )


def per_rank(fabric: Fabric, tensor: torch.Tensor) -> torch.Tensor:
    """(world_size, ...) on the CPU: every process's `tensor`, indexed by rank."""
    gathered = fabric.all_gather(tensor)
    # One process returns the tensor itself, several stack theirs along a new first dimension.
    return (gathered if fabric.world_size > 1 else gathered.unsqueeze(0)).cpu()


def save(fabric: Fabric, args: argparse.Namespace, step: int, model, optimizer, carried: torch.Tensor) -> Path:
    path = args.checkpoint_dir / f"step-{step:06d}.ckpt"
    state = {
        "model": model,
        "optimizer": optimizer,
        "step": step,
        "world_size": fabric.world_size,
        # Each process carries its own streams' state; all of them go into the one file.
        "carried": per_rank(fabric, carried),
        "settings": {name: getattr(args, name) for name in KEPT_SETTINGS},
    }
    fabric.save(path, state)
    return path


def main(argv: list[str] | None = None) -> list[float]:
    args = parse_args(argv)
    if args.resume is not None:  # checked before Fabric starts and reports: a refusal is the first line
        args.resume = newest_checkpoint(args.resume)
        check_settings(args)
    fabric = Fabric(
        accelerator="cpu",
        devices=args.devices,
        strategy="ddp" if args.devices > 1 else "auto",
        precision=args.precision,
        callbacks=[SRUFabricPrecision(args.policy)],
    )
    fabric.launch()  # with several devices, starts the other processes (this script again)
    fabric.seed_everything(args.seed)  # the same initial weights in every process

    corpus = PydocDataModule(batch_size=args.batch_size, seq_len=args.seq_len).corpus
    # The streams hand each process its own rows and keep them in order (the recurrent state
    # is carried from one window to the next), so no sampler is put in front of them.
    streams = ContiguousStreams(
        corpus.train, args.batch_size, args.seq_len, rank=fabric.global_rank, world_size=fabric.world_size
    )
    # Built in the precision's dtype (16-true: float16), so the optimizer that
    # configure_optimizers builds sees the weights it will update.
    with fabric.init_module():
        net = LanguageNet(
            vocab_size=corpus.vocab_size,
            embedding_dim=args.embedding_dim,
            hidden_size=args.hidden_size,
            num_layers=args.num_layers,
            dropout=args.dropout,
        )
        model = SRULanguageModel(net, optimizer={"_target_": "torch.optim.Adam", "lr": args.lr})
    optimizer = model.configure_optimizers()["optimizer"]
    model, optimizer = fabric.setup(model, optimizer)  # SRUFabricPrecision applies the policy here

    step, carried = 0, None
    if args.resume is not None:
        state = {"model": model, "optimizer": optimizer, "step": 0, "world_size": 0, "carried": None}
        fabric.load(args.resume, state)
        if state["world_size"] != fabric.world_size:
            raise SystemExit(
                f"fabric_loop.py: --resume {args.resume} was written by {state['world_size']} process(es), "
                f"this run has --devices {fabric.world_size}; resume with the same number"
            )
        step = state["step"]
        carried = state["carried"][fabric.global_rank].to(fabric.device)
        fabric.print(f"resumed from {args.resume} at step {step}")

    losses = []
    windows = len(streams)
    while step < args.max_steps:
        epoch_position = step % windows
        if epoch_position == 0:
            carried = None  # a new pass over the streams starts from a zero state
        for inputs, targets in itertools.islice(iter(streams), epoch_position, None):
            if step >= args.max_steps:
                break
            # Seeded by step and rank: a resumed run draws the dropout masks of the run it continues.
            torch.manual_seed(args.seed + 1 + step * fabric.world_size + fabric.global_rank)
            inputs, targets = fabric.to_device((inputs, targets))
            logits, state = model(inputs, carried)
            carried = state.detach()
            # Softmax in float32 whatever the compute dtype, as the model's training_step does.
            loss = F.cross_entropy(logits.float().reshape(-1, logits.size(-1)), targets.reshape(-1))
            fabric.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            step += 1
            mean = fabric.all_reduce(loss.detach(), reduce_op="mean").item()
            losses.append(mean)
            fabric.print(f"step {step} loss {mean:.9g} bpc {mean / math.log(2):.4f}")
            if args.save_every and step % args.save_every == 0 and step < args.max_steps:
                fabric.print(f"saved {save(fabric, args, step, model, optimizer, carried)}")
    if carried is not None:
        fabric.print(f"saved {save(fabric, args, step, model, optimizer, carried)}")
    return losses


if __name__ == "__main__":
    main()
