"""The HTTP face of the scheduler: an OpenAI-style ``POST /v1/completions`` (whole or streamed as
server-sent events) and ``GET /health``, on FastAPI (served by uvicorn).

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

#: Seconds a whole (not streamed) completion waits between checks that its client is still there.
DISCONNECT_POLL_S = 0.5


class Outbox:
    """Pieces emitted on the scheduler thread, delivered to their streams' queues on the event loop."""

    def __init__(self) -> None:
        self.loop: asyncio.AbstractEventLoop | None = None
        self._items: list[tuple[asyncio.Queue, str, str | None]] = []
        self._lock = threading.Lock()

    def emitter(self, queue: asyncio.Queue):
        def emit(text: str, finish_reason: str | None) -> None:
            with self._lock:
                self._items.append((queue, text, finish_reason))

        return emit

    def flush(self) -> None:
        with self._lock:
            items, self._items = self._items, []
        if items and self.loop is not None and not self.loop.is_closed():
            self.loop.call_soon_threadsafe(_deliver, items)


def _deliver(items: list[tuple[asyncio.Queue, str, str | None]]) -> None:
    for queue, text, finish_reason in items:
        queue.put_nowait((text, finish_reason))


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

    @app.post("/v1/completions")
    async def completions(request: Request):
        try:
            parsed = parse_completion_request(await request.body(), scheduler.codec, max_tokens_cap)
        except RequestError as error:
            return refuse(error.status, error.message, error.param, error.kind)
        queue: asyncio.Queue = asyncio.Queue()
        try:
            stream = scheduler.submit(parsed, outbox.emitter(queue))
        except SchedulerFull as error:
            return refuse(503, str(error), kind="server_busy", headers={"Retry-After": "1"})
        except SchedulerClosed as error:
            return refuse(503, str(error), kind="server_shutting_down")
        identity = f"cmpl-{uuid.uuid4().hex}"
        head = {"id": identity, "object": "text_completion", "created": int(time.time()), "model": model_name}
        if parsed.stream:
            events = _events(stream, queue, head)
            return StreamingResponse(events, media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
        return await _whole(request, stream, queue, head, refuse)

    return app


def _usage(request: CompletionRequest, generated: int) -> dict[str, int]:
    prompt = len(request.prompt_ids)
    return {"prompt_tokens": prompt, "completion_tokens": generated, "total_tokens": prompt + generated}


def _choice(text: str, finish_reason: str | None) -> dict[str, Any]:
    return {"text": text, "index": 0, "logprobs": None, "finish_reason": finish_reason}


async def _events(stream: Stream, queue: asyncio.Queue, head: dict[str, Any]) -> AsyncIterator[str]:
    """`data: {chunk}` per token (one chunk per token, several written at once when they queued
    up), the last with its finish_reason and the usage, then `data: [DONE]`. Leaving early (the
    client went away) cancels the stream: its slot is free at the scheduler's next step."""
    # A token's chunk differs from the stream's others only in its text: the rest is written once.
    middle = json.dumps({**head, "choices": [_choice("", None)]}, ensure_ascii=False)
    before, after = middle.split('"text": ""', 1)
    try:
        while True:
            pieces = [await queue.get()]
            while not queue.empty():
                pieces.append(queue.get_nowait())
            lines, finished = [], False
            for text, finish_reason in pieces:
                if finish_reason == "error":
                    lines.append(_sse(error_body(f"generation failed: {text}", "server_error")))
                    finished = True
                    break
                if finish_reason is None:
                    lines.append(f'data: {before}"text": {json.dumps(text, ensure_ascii=False)}{after}\n\n')
                    continue
                chunk = {**head, "choices": [_choice(text, finish_reason)]}
                chunk["usage"] = _usage(stream.request, stream.generated)
                finished = True
                lines.append(_sse(chunk))
            if finished:
                lines.append("data: [DONE]\n\n")
            yield "".join(lines)
            if finished:
                return
    finally:
        stream.cancel()


def _sse(payload: dict[str, Any]) -> str:
    return f"data: {json.dumps(payload, ensure_ascii=False)}\n\n"


async def _whole(request, stream: Stream, queue: asyncio.Queue, head: dict[str, Any], refuse):
    """The completion in one JSON response; a client that leaves while it waits cancels it."""
    from fastapi.responses import JSONResponse

    texts: list[str] = []
    try:
        while True:
            try:
                text, finish_reason = await asyncio.wait_for(queue.get(), DISCONNECT_POLL_S)
            except asyncio.TimeoutError:
                if await request.is_disconnected():
                    return refuse(499, "the client closed the connection")
                continue
            if finish_reason == "error":
                return refuse(500, f"generation failed: {text}", kind="server_error")
            texts.append(text)
            if finish_reason is not None:
                body = {**head, "choices": [_choice("".join(texts), finish_reason)]}
                body["usage"] = _usage(stream.request, stream.generated)
                return JSONResponse(body)
    finally:
        stream.cancel()
