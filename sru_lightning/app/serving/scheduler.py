"""One thread owns the model and advances every open stream by one token per model call.

A stream is one choice of a completion (a request with several prompts or `n` > 1 opens one
stream each, stepped together): its prompt is read in one forward of its own (the prompt pass of
``generate``), then it joins the batch. Each step stacks the last token of every stream in the
batch, runs ``model.step(tokens, state)`` once on the batched recurrent state, samples each row
with the stream's own ``torch.Generator`` (:mod:`sru_lightning.app.decoding`, as ``generate``
does), and hands the text to the stream's consumer. A stream leaves the batch when it has its
``max_tokens``, when its text reaches one of its stop strings, or when its consumer cancels it
(a client that went away): its rows are dropped from the state before the next step. The
recurrent state of a stream is a few KB (SRU's ``c``, LSTM's ``(h, c)``).

The state's batch axis is found once by probing the model with batches of 1 and 2, so the same
code serves a checkpoint's model and an export folder. Streams whose states differ in shape
(SRU++ attention memories of different lengths) are stepped in separate groups, one model call
per group; SRU and LSTM models always form one group.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from sru_lightning.app.decoding import sample, sample_rows

from .requests import StreamRequest
from .stops import StopText

#: What a stream hands its consumer per token: text, finish_reason (None until the last: "length",
#: "stop", or "error" with the reason as text), and the token's log probabilities when asked.
Emit = Callable[[str, str | None, list[dict[str, Any]] | None], None]


class SchedulerFull(Exception):
    """`max_streams` streams are open; the request is refused (HTTP 503)."""


class SchedulerClosed(Exception):
    """The server is draining (SIGTERM): no new stream is taken (HTTP 503)."""


@dataclass(eq=False)
class Stream:
    """One open choice of a completion. `emit(text, finish_reason, logprobs)` is called on the
    scheduler thread for each token (see :data:`Emit`); `logprobs` lists, when the request asked
    for them, each token sampled since the last call: {"token", "logprob", "top_logprobs"}."""

    request: StreamRequest
    emit: Emit
    cancelled: bool = False
    done: bool = False  # left the scheduler (its slot is free)
    generated: int = 0
    token: torch.Tensor | None = None  # the last sampled token, fed to the next step
    generator: torch.Generator | None = None
    write: Any = None  # the codec's incremental decoder
    stop: StopText = field(default_factory=StopText)
    pending_logprobs: list[dict[str, Any]] = field(default_factory=list)
    created: float = field(default_factory=time.time)

    def cancel(self) -> None:
        """Leave the batch at the next step (safe from any thread)."""
        self.cancelled = True


class StateLayout:
    """How a model's recurrent state is built: a tensor, a tuple or a list of tensors, each with a
    batch axis. Kept as a flat list inside the scheduler."""

    def __init__(self, model) -> None:
        with torch.inference_mode():
            one = self._probe(model, 1)
            two = self._probe(model, 2)
        self.container = type(one)
        ones, twos = self.flat(one), self.flat(two)
        self.batch_dims = []
        for index, (a, b) in enumerate(zip(ones, twos)):
            differing = [d for d, (x, y) in enumerate(zip(a.shape, b.shape)) if x != y]
            if len(differing) != 1 or a.shape[differing[0]] != 1:
                raise ValueError(
                    f"cannot find the batch axis of state tensor {index}: shape {tuple(a.shape)} at batch 1, "
                    f"{tuple(b.shape)} at batch 2"
                )
            self.batch_dims.append(differing[0])

    @staticmethod
    def _probe(model, batch: int):
        device = getattr(model, "device", torch.device("cpu"))
        return model.step(torch.zeros(batch, 1, dtype=torch.long, device=device))[1]

    @staticmethod
    def flat(state) -> list[torch.Tensor]:
        return [state] if isinstance(state, torch.Tensor) else list(state)

    def build(self, tensors: list[torch.Tensor]):
        if self.container is torch.Tensor or issubclass(self.container, torch.Tensor):
            return tensors[0]
        return self.container(tensors)

    def signature(self, tensors: list[torch.Tensor]) -> tuple:
        """What must agree for two states to be stepped together: every shape but the batch axis."""
        return tuple(
            (tensor.dtype, tensor.shape[:dim] + tensor.shape[dim + 1 :])
            for tensor, dim in zip(tensors, self.batch_dims)
        )

    def join(self, first: list[torch.Tensor], second: list[torch.Tensor]) -> list[torch.Tensor]:
        return [torch.cat((a, b), dim) for a, b, dim in zip(first, second, self.batch_dims)]

    def keep(self, tensors: list[torch.Tensor], rows: list[int]) -> list[torch.Tensor]:
        index = torch.tensor(rows, dtype=torch.long, device=tensors[0].device)
        return [tensor.index_select(dim, index) for tensor, dim in zip(tensors, self.batch_dims)]


@dataclass(eq=False)
class _Group:
    streams: list[Stream]
    state: list[torch.Tensor]


class Scheduler:
    """The loop thread. `submit` (any thread) opens a stream; `close` drains and stops."""

    def __init__(self, model, codec, max_streams: int, after_step: Callable[[], None] | None = None) -> None:
        """`after_step` runs on the loop thread after each round (prompts read, batch stepped): the
        consumer hands what `emit` collected to its clients in one go there."""
        self.model, self.codec, self.max_streams = model, codec, max_streams
        self.after_step = after_step or (lambda: None)
        self.device = getattr(model, "device", torch.device("cpu"))
        self.layout = StateLayout(model)
        self._lock = threading.Condition()
        self._pending: list[Stream] = []
        self._groups: list[_Group] = []
        self._open = 0  # pending + in the batch
        self._closing = False
        self.steps = 0  # batched model calls so far
        self.tokens = 0  # tokens handed out so far
        self._thread = threading.Thread(target=self._loop, name="serve-scheduler", daemon=True)

    # -- any thread ------------------------------------------------------------------------
    def start(self) -> Scheduler:
        self._thread.start()
        return self

    def submit(self, request: StreamRequest, emit: Emit) -> Stream:
        return self.submit_all([request], [emit])[0]

    def submit_all(self, requests: list[StreamRequest], emits: list[Emit]) -> list[Stream]:
        """Open a stream per request, all or none (SchedulerFull when they do not all fit)."""
        streams = [Stream(request, emit, stop=StopText(request.stop)) for request, emit in zip(requests, emits)]
        with self._lock:
            if self._closing:
                raise SchedulerClosed("the server is shutting down and takes no new request")
            if self._open + len(streams) > self.max_streams:
                busy = f"{self._open} of {self.max_streams} streams (max_streams) are busy"
                raise SchedulerFull(f"{busy} and this request needs {len(streams)}; retry shortly")
            self._open += len(streams)
            self._pending.extend(streams)
            self._lock.notify()
        return streams

    def stats(self) -> dict[str, Any]:
        with self._lock:
            batched = sum(len(group.streams) for group in self._groups)
            return {
                "open_streams": self._open,
                "batched_streams": batched,
                "waiting_streams": len(self._pending),
                "max_streams": self.max_streams,
                "steps": self.steps,
                "tokens": self.tokens,
                "draining": self._closing,
            }

    def close(self, timeout: float | None = None) -> None:
        """Take no new stream, finish the open ones, stop the thread."""
        with self._lock:
            self._closing = True
            self._lock.notify()
        if self._thread.is_alive():
            self._thread.join(timeout)

    # -- the scheduler thread ------------------------------------------------------------------
    def _loop(self) -> None:
        with torch.inference_mode():
            while True:
                with self._lock:
                    while not self._pending and not self._groups and not self._closing:
                        self._lock.wait()
                    if self._closing and not self._pending and not self._groups:
                        return
                    joining, self._pending = self._pending, []
                try:
                    for stream in joining:
                        self._admit(stream)
                    self._drop_cancelled()
                    for group in list(self._groups):
                        self._step(group)
                    self._merge_groups()
                except Exception as error:  # a fault of the loop itself: end the open streams, serve on
                    open_streams = [*joining, *(stream for group in self._groups for stream in group.streams)]
                    self._fail([stream for stream in dict.fromkeys(open_streams) if not stream.done], error)
                    self._groups = []
                self.after_step()

    def _admit(self, stream: Stream) -> None:
        """Read the prompt in one forward, sample the first token and join the batch."""
        request = stream.request
        if stream.cancelled:
            self._release([stream])
            return
        try:
            logits, state = self.model.step(torch.tensor([request.prompt_ids], device=self.device))
        except Exception as error:  # the model failed on this prompt: tell this client, serve on
            self._fail([stream], error)
            return
        stream.generator = torch.Generator(device=self.device).manual_seed(request.seed)
        stream.write = self.codec.decoder(after=request.prompt)
        token = sample(logits, request.temperature, request.top_k, stream.generator, request.top_p)
        if self._hand_out(stream, token, logits[0]):
            self._release([stream])
            return
        state = self.layout.flat(state)
        signature = self.layout.signature(state)
        for group in self._groups:
            if self.layout.signature(group.state) == signature:
                group.streams.append(stream)
                group.state = self.layout.join(group.state, state)
                return
        self._groups.append(_Group([stream], state))

    def _hand_out(self, stream: Stream, token: torch.Tensor, logits: torch.Tensor) -> bool:
        """Give the stream its sampled token (`logits` (vocab,): what it was drawn from); True
        when that was its last: `max_tokens` reached, or a stop string found in the text."""
        stream.token = token.reshape(1)
        stream.generated += 1
        self.tokens += 1
        if stream.request.logprobs is not None:
            stream.pending_logprobs.append(self._logprobs(int(token), logits, stream.request.logprobs))
        last = stream.generated >= stream.request.max_tokens
        piece = stream.write(int(token)) + (stream.write.flush() if last else "")
        text, stopped = stream.stop.feed(piece)
        if last and not stopped:
            text += stream.stop.flush()
        finish_reason = "stop" if stopped else "length" if last else None
        if text or finish_reason is not None:
            logprobs = stream.pending_logprobs if stream.request.logprobs is not None else None
            stream.pending_logprobs = []
            stream.emit(text, finish_reason, logprobs)
        return finish_reason is not None

    def _logprobs(self, token: int, logits: torch.Tensor, alternatives: int) -> dict[str, Any]:
        """The token's log probability under the model (temperature 1, nothing cut), and the
        `alternatives` likeliest tokens' ({text: log probability})."""
        log_probabilities = torch.log_softmax(logits.float(), dim=-1)
        top: dict[str, float] = {}
        if alternatives:
            values, indices = log_probabilities.topk(min(alternatives, log_probabilities.numel()))
            for value, index in zip(values.tolist(), indices.tolist()):
                top.setdefault(self.codec.decode([index]), value)
        return {"token": self.codec.decode([token]), "logprob": float(log_probabilities[token]), "top_logprobs": top}

    def _drop_cancelled(self) -> None:
        for group in self._groups:
            if any(stream.cancelled for stream in group.streams):
                self._keep(group, [row for row, stream in enumerate(group.streams) if not stream.cancelled])
        self._groups = [group for group in self._groups if group.streams]

    def _keep(self, group: _Group, rows: list[int]) -> None:
        kept = set(rows)
        self._release([stream for row, stream in enumerate(group.streams) if row not in kept])
        group.streams = [group.streams[row] for row in rows]
        group.state = self.layout.keep(group.state, rows) if rows else []

    def _step(self, group: _Group) -> None:
        tokens = torch.cat([stream.token for stream in group.streams])
        try:
            logits, state = self.model.step(tokens, self.layout.build(group.state))
        except Exception as error:  # the batch's streams end with the reason; the server serves on
            self._fail(group.streams, error)
            self._groups.remove(group)
            return
        self.steps += 1
        group.state = self.layout.flat(state)
        finished = self._sample_rows(group.streams, logits)
        if finished:
            self._keep(group, [row for row in range(len(group.streams)) if row not in finished])
            if not group.streams:
                self._groups.remove(group)

    def _sample_rows(self, streams: list[Stream], logits: torch.Tensor) -> set[int]:
        """Each row's next token, as `generate`'s own sampling draws it (`sample_rows`: each row
        with its stream's generator, the rest batched)."""
        tokens = sample_rows(
            logits,
            [stream.request.temperature for stream in streams],
            [stream.request.top_k for stream in streams],
            [stream.generator for stream in streams],
            [stream.request.top_p for stream in streams],
        )
        return {row for row, stream in enumerate(streams) if self._hand_out(stream, tokens[row], logits[row])}

    def _merge_groups(self) -> None:
        """Groups whose states came to agree in shape (a bounded SRU++ memory filled up) step as one."""
        if len(self._groups) < 2:
            return
        merged: dict[tuple, _Group] = {}
        for group in self._groups:
            signature = self.layout.signature(group.state)
            if signature in merged:
                into = merged[signature]
                into.streams += group.streams
                into.state = self.layout.join(into.state, group.state)
            else:
                merged[signature] = group
        self._groups = list(merged.values())

    def _fail(self, streams: list[Stream], error: BaseException) -> None:
        reason = (str(error).strip().splitlines() or [type(error).__name__])[0]
        for stream in streams:
            stream.emit(f"{type(error).__name__}: {reason}", "error", None)
        self._release(streams)

    def _release(self, streams: list[Stream]) -> None:
        leaving = [stream for stream in streams if not stream.done]
        for stream in leaving:
            stream.done = True
        if leaving:
            with self._lock:
                self._open -= len(leaving)
