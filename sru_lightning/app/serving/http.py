"""The HTTP face of the scheduler: an OpenAI-style ``POST /v1/completions`` (whole or streamed as
server-sent events; one stream per choice, every prompt `n` times), ``GET /v1/models`` and
``GET /health``, on FastAPI (served by uvicorn).

Tokens cross from the scheduler thread to the event loop once per scheduler round: `emit` only
collects, and the scheduler's `after_step` hands the round's pieces to the loop in one call, so a
batch of 64 streams costs one wake-up of the loop per step, not 64.
"""

# No `from __future__ import annotations`: FastAPI reads the handlers' annotations (Request), imported
# inside build_app to keep `import sru_lightning` light, and a string annotation would not resolve.
import asyncio
import json
import threading
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from .requests import CompletionRequest, RequestError, error_body, parse_completion_request
from .scheduler import Scheduler, SchedulerClosed, SchedulerFull, Stream

#: What a choice's stream hands the event loop: (choice index, text, finish_reason, logprobs).
Piece = tuple[int, str, str | None, list[dict[str, Any]] | None]

#: Seconds a whole (not streamed) completion waits between checks that its client is still there.
DISCONNECT_POLL_S = 0.5


class Outbox:
    """Pieces emitted on the scheduler thread, delivered to their streams' queues on the event loop."""

    def __init__(self) -> None:
        self.loop: asyncio.AbstractEventLoop | None = None
        self._items: list[tuple[asyncio.Queue, Piece]] = []
        self._lock = threading.Lock()

    def emitter(self, queue: asyncio.Queue, index: int = 0):
        """The `emit` of choice `index`, whose pieces go to `queue`."""

        def emit(text: str, finish_reason: str | None, logprobs: list[dict[str, Any]] | None = None) -> None:
            with self._lock:
                self._items.append((queue, (index, text, finish_reason, logprobs)))

        return emit

    def flush(self) -> None:
        with self._lock:
            items, self._items = self._items, []
        if items and self.loop is not None and not self.loop.is_closed():
            self.loop.call_soon_threadsafe(_deliver, items)


def _deliver(items: list[tuple[asyncio.Queue, Piece]]) -> None:
    for queue, piece in items:
        queue.put_nowait(piece)


def build_app(scheduler: Scheduler, outbox: Outbox, model_name: str, max_tokens_cap: int):
    """The FastAPI application serving `scheduler`, whose `after_step` is `outbox.flush`."""
    from fastapi import FastAPI, Request
    from fastapi.responses import JSONResponse, StreamingResponse
    from starlette.exceptions import HTTPException as StarletteHTTPException

    @asynccontextmanager
    async def lifespan(app):
        outbox.loop = asyncio.get_running_loop()
        scheduler.start()
        yield
        # uvicorn has waited for every open response: the streams are finished; stop the loop thread
        await asyncio.to_thread(scheduler.close)

    app = FastAPI(title="sru_lightning completions", lifespan=lifespan, docs_url=None, redoc_url=None)

    def refuse(status: int, message: str, param: str | None = None, kind: str = "invalid_request_error", headers=None):
        return JSONResponse(error_body(message, kind, param), status_code=status, headers=headers)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, error: StarletteHTTPException):
        return refuse(error.status_code, f"{request.method} {request.url.path}: {error.detail}")

    @app.get("/health")
    async def health():
        stats = scheduler.stats()
        status = "draining" if stats["draining"] else "ok"
        code = 503 if stats["draining"] else 200
        return JSONResponse({"status": status, "model": model_name, **stats}, status_code=code)

    created = int(time.time())
    model_card = {"id": model_name, "object": "model", "created": created, "owned_by": "sru_lightning"}

    @app.get("/v1/models")
    async def models():
        return JSONResponse({"object": "list", "data": [model_card]})

    @app.get("/v1/models/{name:path}")
    async def model(name: str):
        if name != model_name:
            return refuse(404, f"`model` {name!r} is not served here; this server serves {model_name!r}", "model")
        return JSONResponse(model_card)

    @app.post("/v1/completions")
    async def completions(request: Request):
        try:
            parsed = parse_completion_request(
                await request.body(), scheduler.codec, max_tokens_cap, scheduler.max_streams
            )
        except RequestError as error:
            return refuse(error.status, error.message, error.param, error.kind)
        queue: asyncio.Queue = asyncio.Queue()
        requests = parsed.streams()
        try:
            streams = scheduler.submit_all(requests, [outbox.emitter(queue, each.index) for each in requests])
        except SchedulerFull as error:
            return refuse(503, str(error), kind="server_busy", headers={"Retry-After": "1"})
        except SchedulerClosed as error:
            return refuse(503, str(error), kind="server_shutting_down")
        identity = f"cmpl-{uuid.uuid4().hex}"
        head = {"id": identity, "object": "text_completion", "created": int(time.time()), "model": model_name}
        if parsed.stream:
            events = _events(parsed, streams, queue, head)
            return StreamingResponse(events, media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
        return await _whole(request, parsed, streams, queue, head, refuse)

    return app


def _usage(request: CompletionRequest, streams: list[Stream]) -> dict[str, int]:
    prompt = sum(len(ids) for ids in request.prompt_ids)  # each prompt once, whatever `n`
    generated = sum(stream.generated for stream in streams)
    return {"prompt_tokens": prompt, "completion_tokens": generated, "total_tokens": prompt + generated}


def _choice(index: int, text: str, finish_reason: str | None, logprobs: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"text": text, "index": index, "logprobs": logprobs, "finish_reason": finish_reason}


def _logprobs(entries: list[dict[str, Any]], offset: int) -> dict[str, Any]:
    """OpenAI's completions `logprobs` of `entries` (one per token); `text_offset`: where each
    token's text starts in the choice's text, counted from `offset`."""
    offsets = []
    for entry in entries:
        offsets.append(offset)
        offset += len(entry["token"])
    return {
        "tokens": [entry["token"] for entry in entries],
        "token_logprobs": [entry["logprob"] for entry in entries],
        "top_logprobs": [entry["top_logprobs"] for entry in entries],
        "text_offset": offsets,
    }


async def _events(
    request: CompletionRequest, streams: list[Stream], queue: asyncio.Queue, head: dict[str, Any]
) -> AsyncIterator[str]:
    """`data: {chunk}` per token of each choice (several written at once when they queued up),
    each choice's last with its finish_reason; the last of all carries the usage (or, asked with
    `stream_options.include_usage`, a chunk of its own with no choices), then `data: [DONE]`.
    Leaving early (the client went away) cancels the streams: their slots are free at the
    scheduler's next step."""
    # A token's chunk differs from its choice's others only in its text: the rest is written once.
    templates: dict[int, tuple[str, str]] = {}

    def plain(index: int, text: str) -> str:
        if index not in templates:
            middle = json.dumps({**head, "choices": [_choice(index, "", None)]}, ensure_ascii=False)
            before, after = middle.split('"text": ""', 1)
            templates[index] = before, after
        before, after = templates[index]
        return f'data: {before}"text": {json.dumps(text, ensure_ascii=False)}{after}\n\n'

    offsets = {stream.request.index: 0 for stream in streams}
    open_choices = len(streams)
    try:
        if request.echo:
            yield "".join(plain(stream.request.index, stream.request.prompt) for stream in streams)
        while True:
            pieces = [await queue.get()]
            while not queue.empty():
                pieces.append(queue.get_nowait())
            lines, finished = [], False
            for index, text, finish_reason, entries in pieces:
                if finish_reason == "error":
                    lines.append(_sse(error_body(f"generation failed: {text}", "server_error")))
                    finished = True
                    break
                if finish_reason is None and entries is None:
                    lines.append(plain(index, text))
                    continue
                logprobs = None
                if entries is not None:
                    logprobs = _logprobs(entries, offsets[index])
                    offsets[index] += sum(len(entry["token"]) for entry in entries)
                chunk = {**head, "choices": [_choice(index, text, finish_reason, logprobs)]}
                if finish_reason is not None:
                    open_choices -= 1
                    if open_choices == 0:
                        finished = True
                        if request.include_usage:
                            lines.append(_sse(chunk))
                            chunk = {**head, "choices": [], "usage": _usage(request, streams)}
                        else:
                            chunk["usage"] = _usage(request, streams)
                lines.append(_sse(chunk))
                if finished:
                    break
            if finished:
                lines.append("data: [DONE]\n\n")
            yield "".join(lines)
            if finished:
                return
    finally:
        for stream in streams:
            stream.cancel()


def _sse(payload: dict[str, Any]) -> str:
    return f"data: {json.dumps(payload, ensure_ascii=False)}\n\n"


async def _whole(request, parsed: CompletionRequest, streams: list[Stream], queue: asyncio.Queue, head, refuse):
    """The completion in one JSON response, its choices in order; a client that leaves while it
    waits cancels it."""
    from fastapi.responses import JSONResponse

    texts: dict[int, list[str]] = {stream.request.index: [] for stream in streams}
    entries: dict[int, list[dict[str, Any]]] = {index: [] for index in texts}
    finish_reasons: dict[int, str] = {}
    try:
        while len(finish_reasons) < len(streams):
            try:
                index, text, finish_reason, logprobs = await asyncio.wait_for(queue.get(), DISCONNECT_POLL_S)
            except asyncio.TimeoutError:
                if await request.is_disconnected():
                    return refuse(499, "the client closed the connection")
                continue
            if finish_reason == "error":
                return refuse(500, f"generation failed: {text}", kind="server_error")
            texts[index].append(text)
            entries[index] += logprobs or []
            if finish_reason is not None:
                finish_reasons[index] = finish_reason
        prompts = {stream.request.index: stream.request.prompt for stream in streams}
        choices = []
        for index in sorted(texts):
            echoed = prompts[index] if parsed.echo else ""
            logprobs = _logprobs(entries[index], 0) if parsed.logprobs is not None else None
            choices.append(_choice(index, echoed + "".join(texts[index]), finish_reasons[index], logprobs))
        return JSONResponse({**head, "choices": choices, "usage": _usage(parsed, streams)})
    finally:
        for stream in streams:
            stream.cancel()
