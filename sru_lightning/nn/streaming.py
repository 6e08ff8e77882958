"""Streaming: a sequence read chunk by chunk, the state carried from each call to the next.

``stream_step(module, chunk, state)`` is the one place where a recurrent model reads on from
a carried state: the layers (:class:`SRU`, :class:`SRUCell`, :class:`SRUpp`), the language
model (whose ``step`` and so ``generate`` go through it), a ``torch.compile``-d module and an
exported model alike. Any split of a sequence into chunks then gives the output and final
state of one call over the whole sequence:

* float32: within 1e-6 (relative, :func:`sru_lightning.ops.testing.relative_error`); SRU
  layers came out bitwise equal here, SRU++ differs by the attention's summation order over keys;
* half storage (bfloat16/float16): the kernel keeps ``c`` in float32 from step to step but
  returns it in the storage dtype, so each chunk boundary rounds the carried ``c`` once (at most
  half a storage step per value). The result is the one pass whose ``c`` is rounded to storage
  at the boundaries: within one storage step (``finfo(storage).eps`` times the output's largest
  magnitude) of the unchunked half result, which is itself 1-5 such steps from float64.

A bidirectional layer is refused: its backward direction reads each chunk from the chunk's own
end, so chunks cannot continue one another (a ``c0`` given to one call of it is fine).

The state is what the module returns: ``c`` for SRU layers; for :class:`SRUpp` the flat tuple
``(c, memory_0, ..., memory_{n-1})``, each layer's earlier inputs, which the next chunk attends
to through a causal mask over memory + chunk. The memory keeps every earlier input unless
``memory_length`` bounds it; the chunked result equals one causal pass while the memory holds
all tokens before the chunk (a bounded memory gives each chunk a window instead).
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable
from typing import Any

import torch
from torch import Tensor, nn

from .cell import SRUCell
from .srupp import SRUpp
from .stack import SRU

__all__ = ["causal_attention_mask", "refuse_bidirectional", "srupp_stream_step", "stream_chunks", "stream_step"]


def _unwrapped(module: Any) -> Any:
    """The module itself under a ``torch.compile`` wrapper (its calls still run compiled)."""
    if isinstance(module, nn.Module):  # not getattr: nn.Module's miss raises, which costs per token
        return module._modules.get("_orig_mod", module)
    return module


# Modules found free of bidirectional layers: a decoding step calls the check once per token,
# and walking a model's modules costs about a tenth of an eager step. A layer's direction is
# fixed when it is built (its weights' shapes depend on it), so a verdict stays true.
_UNIDIRECTIONAL: weakref.WeakSet = weakref.WeakSet()


def refuse_bidirectional(module: Any, caller: str = "stream_step") -> None:
    """Raise ``ValueError`` when `module` is, or holds, a layer with ``bidirectional=True``."""
    base = _unwrapped(module)
    if isinstance(base, nn.Module):
        if base in _UNIDIRECTIONAL:
            return
        # The layers (and nn.LSTM/GRU) keep `bidirectional` as a plain attribute; reading
        # __dict__ spares nn.Module.__getattr__'s AttributeError on every other module.
        found = [(name, layer) for name, layer in base.named_modules() if vars(layer).get("bidirectional") is True]
    else:
        found = [("", base)] if getattr(base, "bidirectional", False) is True else []
    if not found:
        if isinstance(base, nn.Module):
            _UNIDIRECTIONAL.add(base)
        return
    name, layer = found[0]
    where = f"layer {name!r}" if name else "the module"
    raise ValueError(
        f"{caller}: {where} ({type(layer).__name__}) has `bidirectional` True; streaming needs "
        "bidirectional=False (the backward direction reads each chunk from its own end, so chunks "
        "cannot continue one another; call it once on the whole sequence), got bidirectional=True"
    )


def causal_attention_mask(memory_length: int, length: int, device=None) -> Tensor:
    """Additive (length, memory_length + length) mask: token t sees the memory and tokens 0..t."""
    mask = torch.full((length, memory_length + length), float("-inf"), device=device)
    return torch.triu(mask, diagonal=memory_length + 1)


def srupp_stream_step(
    rnn: nn.Module, x: Tensor, state: tuple | None = None, memory_length: int | None = None
) -> tuple[Tensor, tuple]:
    """:class:`SRUpp` `rnn` (possibly compiled) over the chunk `x` from `state` (None or
    ``(c, *memory)``), causal over memory + chunk; returns (output, ``(c, *memory)``) with the
    memory extended by this chunk's inputs and trimmed to `memory_length` steps (None: all;
    0: none carried, the state is ``(c,)``)."""
    base = _unwrapped(rnn)
    c0, memory = (None, None) if state is None else (state[0], list(state[1:]) or None)
    time_dim = 1 if base.batch_first else 0
    memory_steps = 0 if memory is None else memory[0].shape[time_dim]
    mask = causal_attention_mask(memory_steps, x.shape[time_dim], x.device)
    output, c, bank = rnn(x, c0, attn_mask=mask, memory=memory)
    if memory_length == 0:
        return output, (c,)
    kept = base.extend_memory(memory, bank["saved_inputs"], max_length=memory_length)
    return output, (c, *kept)


def stream_step(module: Any, chunk: Any, state: Any = None, *, memory_length: int | None = None) -> tuple[Any, Any]:
    """Read `chunk` on from `state` (None: the start); return (output, the state to carry).

    `module` is an SRU layer or stack, an :class:`SRUpp` (state ``(c, *memory)``, see
    :func:`srupp_stream_step`; `memory_length` bounds its memory), or any model called as
    ``module(chunk, state) -> (output, state)`` (the language model, an exported one), possibly
    ``torch.compile``-d. A module holding a bidirectional layer is refused.
    """
    refuse_bidirectional(module)
    if isinstance(_unwrapped(module), SRUpp):
        return srupp_stream_step(module, chunk, state, memory_length)
    if memory_length is not None:
        raise ValueError(
            f"stream_step: `memory_length` applies to SRUpp layers only, got memory_length={memory_length} "
            f"for {type(_unwrapped(module)).__name__}"
        )
    return module(chunk, state)


def stream_chunks(
    module: Any,
    chunks: Iterable[Tensor],
    state: Any = None,
    *,
    time_dim: int | None = None,
    memory_length: int | None = None,
) -> tuple[Tensor, Any]:
    """:func:`stream_step` over each chunk in turn; returns (the outputs joined along time, final
    state). `time_dim` defaults to 1 for a ``batch_first`` module, else 0."""
    base = _unwrapped(module)
    batch_first = getattr(base, "batch_first", False)
    if time_dim is None:
        time_dim = 1 if batch_first else 0
    outputs = []
    for index, chunk in enumerate(chunks):
        _check_chunk(base, index, chunk, time_dim, batch_first)
        output, state = stream_step(module, chunk, state, memory_length=memory_length)
        if outputs and not _joinable(outputs[0], output, time_dim):
            raise ValueError(
                f"stream_chunks: chunk {index} gives an output of shape {tuple(output.shape)}, which does not "
                f"continue chunk 0's {tuple(outputs[0].shape)} along time_dim={time_dim}: every chunk must have "
                "the same batch and feature sizes, only its length may differ"
            )
        outputs.append(output)
    if not outputs:
        raise ValueError("stream_chunks: `chunks` must hold at least one chunk, got none")
    return torch.cat(outputs, time_dim), state


def _check_chunk(base: Any, index: int, chunk: Any, time_dim: int, batch_first: bool) -> None:
    """A chunk has a time axis: an SRU layer's is 3-D (a 2-D input is one step of no length to
    join along), any other module's has at least `time_dim` + 1 dimensions."""
    dims = getattr(chunk, "dim", lambda: None)()
    if isinstance(base, (SRU, SRUCell, SRUpp)):
        if dims == 3:
            return
        layout = "(B, L, input_size) with batch_first=True" if batch_first else "(L, B, input_size)"
        expected = f"3-D {layout}"
    elif dims is not None and dims > time_dim:
        return
    else:
        expected = f"a tensor with a time axis at time_dim={time_dim}"
        if batch_first:
            expected += " ((B, L) tokens for a language model)"
    got = f"shape {tuple(chunk.shape)}" if dims is not None else type(chunk).__name__
    raise ValueError(f"stream_chunks: chunk {index} of `chunks` must be {expected}, got {got}")


def _joinable(first: Tensor, other: Tensor, time_dim: int) -> bool:
    """Whether `other` can follow `first` along `time_dim`."""
    if first.dim() != other.dim() or time_dim >= first.dim():
        return False
    return all(a == b for d, (a, b) in enumerate(zip(first.shape, other.shape)) if d != time_dim)
