"""Speed parts of ``gpu-check``: the recurrence kernels' achieved memory bandwidth, and SRU
against cuDNN ``nn.LSTM`` (and the ``sru`` package) at a few sizes.

The recurrence does a few flops per byte, so its kernels are judged by bandwidth: bytes
they must move (each input read once, each output written once) over their time. The byte
counts are plain arithmetic, tested on the CPU; the timing needs a GPU.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

import torch

# (L, B, D): first sequence 256, batch 64, width 1024, the size at which gpu-check's `bench` part
# requires SRU's fwd+bwd to beat cuDNN LSTM; then smaller ones, where launch overhead shows.
BENCH_SIZES = ((256, 64, 1024), (256, 32, 512), (64, 16, 256))
BANDWIDTH_SIZES = ((256, 64, 1024), (128, 32, 4096))


@dataclass(frozen=True)
class RecurrenceTraffic:
    """Bytes of the tensors one call of each kernel reads and writes (vector weight_c, c0
    given, no masks): the least any implementation moves, each tensor once."""

    forward: int
    backward: int


def recurrence_traffic(
    length: int, batch: int, hidden: int, k: int, element_bytes: int, bidirectional: bool = False
) -> RecurrenceTraffic:
    """Forward reads U (and x when k == 3), weight_c, bias, c0 and writes h, c_all, c_last;
    backward reads grad_h, grad_c_last, U, x, weight_c, bias, c0, c_all and writes grad_U,
    grad_x, grad_weight_c, grad_bias, grad_c0."""
    width = (2 if bidirectional else 1) * hidden
    cells = length * batch * width  # one (t, column) each
    skip = 1 if k == 3 else 0
    vectors = 2 * width  # weight_c and bias are (2, dirs, D) each
    states = batch * width  # c0, c_last, grad_c_last, grad_c0
    forward = cells * (k + skip + 2) + 2 * vectors + 2 * states
    backward = cells * (2 + 2 * (k + skip)) + 4 * vectors + 3 * states
    return RecurrenceTraffic(forward * element_bytes, backward * element_bytes)


def gigabytes_per_second(bytes_moved: int, milliseconds: float) -> float:
    return bytes_moved / (milliseconds * 1e-3) / 1e9


def cuda_median_ms(step, repeats: int = 20, warmup: int = 5) -> float:
    """Median wall time of ``step()`` on the GPU, measured with CUDA events."""
    for _ in range(warmup):
        step()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        step()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def measure_bandwidth(dtype: torch.dtype, length: int, batch: int, hidden: int, k: int = 3) -> dict:
    """Time the two recurrence kernels alone on CUDA; their bytes, milliseconds and GB/s."""
    from sru_lightning.ops import op  # noqa: F401  (registers the ops)

    device = "cuda"
    U = torch.randn(length, batch, k * hidden, device=device, dtype=dtype)
    x = torch.randn(length, batch, hidden, device=device, dtype=dtype) if k == 3 else None
    weight_c = torch.randn(2 * hidden, device=device, dtype=dtype) * 0.5
    bias = torch.zeros(2 * hidden, device=device, dtype=dtype)
    c0 = torch.zeros(batch, hidden, device=device, dtype=dtype)
    recurrence = torch.ops.sru_lightning
    arguments = (U, x, weight_c, bias, c0, None, 1.0, None, None, None, None, False, True)
    h, c_last, c_all = recurrence.recurrence_forward(*arguments, True)
    grad_h, grad_c = torch.randn_like(h), torch.randn_like(c_last)
    forward_ms = cuda_median_ms(lambda: recurrence.recurrence_forward(*arguments, True))
    backward_ms = cuda_median_ms(
        lambda: recurrence.recurrence_backward(
            grad_h, grad_c, None, U, x, weight_c, bias, c0, None, 1.0, None, None, None, None, c_all, False, True
        )
    )
    traffic = recurrence_traffic(length, batch, hidden, k, U.element_size())
    return {
        "forward_ms": forward_ms,
        "backward_ms": backward_ms,
        "forward_gbps": gigabytes_per_second(traffic.forward, forward_ms),
        "backward_gbps": gigabytes_per_second(traffic.backward, backward_ms),
    }


def describe_bandwidth(results: dict) -> str:
    """One line per size: ``L=.. B=.. D=..: forward X GB/s (t ms), backward Y GB/s (t ms)``."""
    return "; ".join(
        f"L={length} B={batch} D={hidden}: forward {r['forward_gbps']:.0f} GB/s ({r['forward_ms']:.3f} ms), "
        f"backward {r['backward_gbps']:.0f} GB/s ({r['backward_ms']:.3f} ms)"
        for (length, batch, hidden), r in results.items()
    )


def benchmark_models(dtype: torch.dtype, hidden: int, layers: int) -> tuple[dict, list[str]]:
    from torch import nn

    from sru_lightning.nn import SRU

    models, notes = {"SRU": SRU(hidden, hidden, num_layers=layers), "cuDNN LSTM": nn.LSTM(hidden, hidden, layers)}
    try:
        import sru as sru_package

        models["sru package"] = sru_package.SRU(hidden, hidden, num_layers=layers)
    except Exception as error:  # not installed, or its own CUDA build failed
        notes.append(f"sru package left out ({type(error).__name__}: {str(error)[:80]})")
    return {name: model.to(device="cuda", dtype=dtype) for name, model in models.items()}, notes


def time_models(dtype: torch.dtype, length: int, batch: int, hidden: int, layers: int = 2) -> tuple[dict, dict, list]:
    """Median fwd+bwd and inference milliseconds of each model at one size."""
    models, notes = benchmark_models(dtype, hidden, layers)
    x = torch.randn(length, batch, hidden, device="cuda", dtype=dtype, requires_grad=True)
    train_ms, inference_ms = {}, {}
    for name, model in list(models.items()):

        def train_step(model=model):
            output = model(x)[0]
            output.float().sum().backward()

        def inference_step(model=model):
            with torch.no_grad():
                model(x)

        try:
            train_ms[name] = cuda_median_ms(train_step)
            inference_ms[name] = cuda_median_ms(inference_step)
        except Exception as error:
            if name == "SRU":
                raise
            notes.append(f"{name} failed ({type(error).__name__}: {str(error)[:80]})")
    return train_ms, inference_ms, notes


def describe_models(size: tuple, train_ms: dict, inference_ms: dict) -> str:
    """``L=.. B=.. D=..: SRU a/b ms (r x LSTM), ...`` (fwd+bwd / inference)."""
    length, batch, hidden = size
    lstm = train_ms["cuDNN LSTM"]
    rows = [
        f"{name} {train_ms[name]:.2f}/{inference_ms[name]:.2f} ms ({train_ms[name] / lstm:.2f}x LSTM)"
        for name in train_ms
    ]
    return f"L={length} B={batch} D={hidden}: " + ", ".join(rows)
