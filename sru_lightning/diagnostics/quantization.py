"""Does int8 pay on CPU? `python -m sru_lightning.diagnostics.quantization ckpt_path=<run> [threads=1]`

Compares a trained language model in float32 with its int8 copy
(:func:`sru_lightning.export.quantize.quantize_input_projections`): validation bits per token on
the run's own data (carried state, as `validate` does), and the time of a sequence pass
(L=128, B=32) and of a decoding step (B=1), interleaved in one process, best of N.
"""

from __future__ import annotations

import math
import sys
import time

import torch
import torch.nn.functional as F


def validation_bits(model, loader) -> float:
    nats, tokens, state = 0.0, 0, None
    with torch.inference_mode():
        for inputs, targets in loader:
            if state is not None and (state[0] if isinstance(state, tuple) else state).shape[1] != inputs.shape[0]:
                state = None
            logits, state = model(inputs, state)
            nats += float(F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), reduction="sum"))
            tokens += targets.numel()
    return nats / tokens / math.log(2)


def _sequence_seconds(model, tokens) -> float:
    with torch.inference_mode():
        started = time.perf_counter()
        model(tokens)
        return time.perf_counter() - started


def _step_seconds(model, steps: int = 100) -> float:
    token = torch.tensor([3])
    with torch.inference_mode():
        _, state = model.net.step(token)
        started = time.perf_counter()
        for _ in range(steps):
            _, state = model.net.step(token, state)
        return (time.perf_counter() - started) / steps


def main(argv=None) -> int:
    from pathlib import Path

    from hydra.utils import instantiate
    from omegaconf import OmegaConf

    from sru_lightning.app.runs.trained_model import build_model, read_checkpoint
    from sru_lightning.export.quantize import quantize_input_projections

    settings = dict(argument.split("=", 1) for argument in (sys.argv[1:] if argv is None else argv))
    threads, repeats = int(settings.get("threads", 1)), int(settings.get("repeats", 7))
    torch.set_num_threads(threads)
    path, checkpoint = read_checkpoint(settings.get("ckpt_path", "last"), settings.get("resume_dir", "outputs"))
    models = {"float32": build_model(checkpoint, path)}
    models["int8 (projections + decoder)"] = quantize_input_projections(models["float32"])
    datamodule = instantiate(OmegaConf.load(Path(path).resolve().parent.parent / ".hydra" / "config.yaml").data)
    datamodule.setup("validate")
    bits = {name: validation_bits(model, datamodule.val_dataloader()) for name, model in models.items()}
    tokens = torch.randint(0, models["float32"].net.vocab_size, (32, 128))
    times = {name: ([], []) for name in models}
    for _ in range(repeats):
        for name, model in models.items():
            times[name][0].append(_sequence_seconds(model, tokens))
            times[name][1].append(_step_seconds(model))
    base_sequence, base_step = min(times["float32"][0]), min(times["float32"][1])
    kind = models["float32"].net.rnn_type
    print(f"int8 dynamic quantisation of {path} ({kind}), threads={threads}, best of {repeats}")
    print(f"{'model':<30}{'val bits':>10}{'seq ms':>9}{'x fp32':>8}{'step us':>9}{'x fp32':>8}")
    for name in models:
        sequence, step = min(times[name][0]), min(times[name][1])
        print(
            f"{name:<30}{bits[name]:>10.4f}{sequence * 1e3:>9.2f}{sequence / base_sequence:>8.2f}"
            f"{step * 1e6:>9.0f}{step / base_step:>8.2f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
