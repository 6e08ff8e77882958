"""An OpenAI-style completion request read from its JSON body and checked field by field.

Every problem is a :class:`RequestError` carrying the HTTP status and one line naming the field,
what it takes and what it got; :func:`error_body` gives it the OpenAI error shape.
"""

from __future__ import annotations

import json
import math
import secrets
from dataclasses import dataclass
from typing import Any

#: max_tokens of a request that names none (as OpenAI's completions endpoint).
DEFAULT_MAX_TOKENS = 16
#: temperature of a request that names none (as OpenAI's completions endpoint).
DEFAULT_TEMPERATURE = 1.0
#: Fields read from a request; `model` and `user` are accepted and not used (one model is served).
FIELDS = ("prompt", "max_tokens", "temperature", "top_k", "seed", "stream", "model", "user", "n")


class RequestError(Exception):
    """A request the server refuses: `status` (4xx/5xx), a one-line `message`, the `param` at fault."""

    def __init__(self, status: int, message: str, param: str | None = None, kind: str = "invalid_request_error"):
        super().__init__(message)
        self.status, self.message, self.param, self.kind = status, message, param, kind


def error_body(message: str, kind: str = "invalid_request_error", param: str | None = None) -> dict[str, Any]:
    """OpenAI's error shape: {"error": {"message", "type", "param", "code"}}."""
    return {"error": {"message": message, "type": kind, "param": param, "code": None}}


@dataclass(frozen=True)
class CompletionRequest:
    prompt: str
    prompt_ids: list[int]
    max_tokens: int
    temperature: float
    top_k: int
    seed: int
    stream: bool


def _shown(value: Any) -> str:
    text = json.dumps(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _integer(body: dict, name: str, default: int, low: int, high: int | None = None) -> int:
    value = body.get(name, default)
    if isinstance(value, bool) or not isinstance(value, int):
        raise RequestError(400, f"`{name}` must be an integer, got {_shown(value)}", name)
    if value < low or (high is not None and value > high):
        bound = f"from {low} to {high}" if high is not None else f">= {low}"
        raise RequestError(400, f"`{name}` must be an integer {bound}, got {value}", name)
    return value


def parse_completion_request(raw: bytes, codec, max_tokens_cap: int) -> CompletionRequest:
    """The request in `raw` (a JSON body), its prompt encoded by `codec`; raises RequestError."""
    try:
        body = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise RequestError(400, f"the body must be a JSON object, got malformed JSON ({error})") from None
    if not isinstance(body, dict):
        raise RequestError(400, f"the body must be a JSON object, got a JSON {type(body).__name__}")
    unknown = sorted(set(body) - set(FIELDS))
    if unknown:
        raise RequestError(
            400, f"unsupported field(s) {', '.join(map(repr, unknown))}; fields: {', '.join(FIELDS)}", unknown[0]
        )
    if "prompt" not in body:
        raise RequestError(400, "`prompt` is required (the text to continue)", "prompt")
    prompt = body["prompt"]
    if not isinstance(prompt, str):
        raise RequestError(400, f"`prompt` must be a string, got {_shown(prompt)}", "prompt")
    if prompt == "":
        raise RequestError(400, "`prompt` must hold at least one token, got ''", "prompt")
    try:
        prompt_ids = codec.encode(prompt)
    except ValueError as error:
        raise RequestError(400, f"`prompt` cannot be read by this model: {error}", "prompt") from None
    if not prompt_ids:
        raise RequestError(400, f"`prompt` must hold at least one token, got {_shown(prompt)}", "prompt")
    max_tokens = _integer(body, "max_tokens", min(DEFAULT_MAX_TOKENS, max_tokens_cap), 1, max_tokens_cap)
    temperature = body.get("temperature", DEFAULT_TEMPERATURE)
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)):
        raise RequestError(400, f"`temperature` must be a number, got {_shown(temperature)}", "temperature")
    if not (math.isfinite(temperature) and temperature >= 0):
        message = f"`temperature` must be a finite number >= 0 (0 = greedy), got {temperature}"
        raise RequestError(400, message, "temperature")
    top_k = _integer(body, "top_k", 0, 0)
    seed = body.get("seed")
    seed = secrets.randbits(63) if seed is None else _integer(body, "seed", 0, 0, 2**63 - 1)
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise RequestError(400, f"`stream` must be true or false, got {_shown(stream)}", "stream")
    _integer(body, "n", 1, 1, 1)
    for name in ("model", "user"):
        if name in body and not isinstance(body[name], str):
            raise RequestError(400, f"`{name}` must be a string, got {_shown(body[name])}", name)
    return CompletionRequest(prompt, prompt_ids, max_tokens, float(temperature), top_k, seed, stream)
