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
#: OpenAI's bounds: at most 4 stop strings, at most 5 alternatives per token in `logprobs`.
MAX_STOP_STRINGS = 4
MAX_LOGPROBS = 5
#: Fields read from a request. `model` and `user` are accepted and not used (one model is served);
#: the rest are honoured or, at a value this server cannot honour, refused naming it. A field
#: set to null is read as absent (OpenAI's clients send nulls for what the caller left out).
FIELDS = (
    "prompt",
    "max_tokens",
    "temperature",
    "top_k",
    "top_p",
    "n",
    "stop",
    "seed",
    "stream",
    "stream_options",
    "logprobs",
    "echo",
    "frequency_penalty",
    "presence_penalty",
    "best_of",
    "logit_bias",
    "suffix",
    "model",
    "user",
)


class RequestError(Exception):
    """A request the server refuses: `status` (4xx/5xx), a one-line `message`, the `param` at fault."""

    def __init__(self, status: int, message: str, param: str | None = None, kind: str = "invalid_request_error"):
        super().__init__(message)
        self.status, self.message, self.param, self.kind = status, message, param, kind


def error_body(message: str, kind: str = "invalid_request_error", param: str | None = None) -> dict[str, Any]:
    """OpenAI's error shape: {"error": {"message", "type", "param", "code"}}."""
    return {"error": {"message": message, "type": kind, "param": param, "code": None}}


@dataclass(frozen=True)
class StreamRequest:
    """One choice of a completion: the stream the scheduler generates. `index` is its place among
    the response's choices (prompt by prompt, `n` each); `seed` is the request's plus the choice's
    number within its prompt, so choice 0 draws what a request with n=1 draws."""

    prompt: str
    prompt_ids: list[int]
    max_tokens: int
    temperature: float
    top_k: int
    seed: int
    top_p: float = 1.0
    stop: tuple[str, ...] = ()
    logprobs: int | None = None
    index: int = 0


@dataclass(frozen=True)
class CompletionRequest:
    """A checked request: its prompts (each as text and ids) and the settings every choice shares."""

    prompts: tuple[str, ...]
    prompt_ids: tuple[list[int], ...]
    max_tokens: int
    temperature: float
    top_k: int
    seed: int
    stream: bool
    top_p: float = 1.0
    n: int = 1
    stop: tuple[str, ...] = ()
    logprobs: int | None = None
    echo: bool = False
    include_usage: bool = False

    def streams(self) -> list[StreamRequest]:
        """One stream per choice: every prompt `n` times, in the order of the response's choices."""
        return [
            StreamRequest(
                prompt=prompt,
                prompt_ids=ids,
                max_tokens=self.max_tokens,
                temperature=self.temperature,
                top_k=self.top_k,
                seed=(self.seed + choice) % 2**63,
                top_p=self.top_p,
                stop=self.stop,
                logprobs=self.logprobs,
                index=number * self.n + choice,
            )
            for number, (prompt, ids) in enumerate(zip(self.prompts, self.prompt_ids))
            for choice in range(self.n)
        ]


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


def _number(body: dict, name: str, default: float) -> float:
    value = body.get(name, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise RequestError(400, f"`{name}` must be a finite number, got {_shown(value)}", name)
    return float(value)


def _boolean(body: dict, name: str) -> bool:
    value = body.get(name, False)
    if not isinstance(value, bool):
        raise RequestError(400, f"`{name}` must be true or false, got {_shown(value)}", name)
    return value


def _prompts(body: dict, codec) -> tuple[tuple[str, ...], tuple[list[int], ...]]:
    """The prompts as (texts, ids): a string, a list of strings, a list of token ids, or a list
    of lists of token ids (OpenAI's four forms)."""
    if "prompt" not in body:
        raise RequestError(400, "`prompt` is required (the text to continue)", "prompt")
    prompt = body["prompt"]
    if isinstance(prompt, str) or (isinstance(prompt, list) and prompt and _is_ids(prompt)):
        prompts = [prompt]
    elif isinstance(prompt, list) and prompt and all(isinstance(p, str) or _is_ids(p) for p in prompt):
        prompts = prompt
    else:
        raise RequestError(
            400,
            "`prompt` must be a string, a list of strings, a list of token ids or a list of lists of token ids, "
            f"got {_shown(prompt)}",
            "prompt",
        )
    texts, ids = [], []
    for item in prompts:
        if isinstance(item, str):
            item_ids = _encoded(item, codec)
            texts.append(item)
        else:
            item_ids = _checked_ids(item, codec)
            texts.append(codec.decode(item_ids))
        ids.append(item_ids)
    return tuple(texts), tuple(ids)


def _is_ids(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(i, int) and not isinstance(i, bool) for i in value)


def _encoded(prompt: str, codec) -> list[int]:
    if prompt == "":
        raise RequestError(400, "`prompt` must hold at least one token, got ''", "prompt")
    try:
        prompt_ids = codec.encode(prompt)
    except ValueError as error:
        raise RequestError(400, f"`prompt` cannot be read by this model: {error}", "prompt") from None
    if not prompt_ids:
        raise RequestError(400, f"`prompt` must hold at least one token, got {_shown(prompt)}", "prompt")
    return prompt_ids


def _checked_ids(ids: list[int], codec) -> list[int]:
    if not ids:
        raise RequestError(400, "`prompt` must hold at least one token, got []", "prompt")
    outside = [i for i in ids if not 0 <= i < codec.vocab_size]
    if outside:
        raise RequestError(
            400, f"`prompt` token ids must be from 0 to {codec.vocab_size - 1}, got {_shown(outside[:5])}", "prompt"
        )
    return list(ids)


def _stop(body: dict) -> tuple[str, ...]:
    stop = body.get("stop", [])
    stops = [stop] if isinstance(stop, str) else stop
    if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops):
        raise RequestError(400, f"`stop` must be a non-empty string or a list of them, got {_shown(stop)}", "stop")
    if len(stops) > MAX_STOP_STRINGS:
        raise RequestError(400, f"`stop` must hold at most {MAX_STOP_STRINGS} strings, got {len(stops)}", "stop")
    return tuple(dict.fromkeys(stops))


def _refuse_what_cannot_be_honoured(body: dict, n: int) -> None:
    """The OpenAI fields this server accepts only at their neutral value, refused otherwise."""
    for name in ("frequency_penalty", "presence_penalty"):
        if _number(body, name, 0.0) != 0:
            message = f"`{name}` must be 0 (this server applies no penalties), got {body[name]}"
            raise RequestError(400, message, name)
    if _integer(body, "best_of", n, 1) != n:
        message = f"`best_of` must equal `n` ({n}): every choice is returned, none ranked; got {body['best_of']}"
        raise RequestError(400, message, "best_of")
    bias = body.get("logit_bias", {})
    if not isinstance(bias, dict) or bias:
        raise RequestError(400, f"`logit_bias` must be empty (not supported), got {_shown(bias)}", "logit_bias")
    suffix = body.get("suffix", "")
    if suffix != "":
        message = f"`suffix` must be empty (the model continues text left to right only), got {_shown(suffix)}"
        raise RequestError(400, message, "suffix")


def parse_completion_request(
    raw: bytes, codec, max_tokens_cap: int, max_streams: int | None = None
) -> CompletionRequest:
    """The request in `raw` (a JSON body), its prompts encoded by `codec`; raises RequestError.
    `max_streams` bounds the streams one request may open (prompts times `n`)."""
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
    body = {name: value for name, value in body.items() if value is not None}
    prompts, prompt_ids = _prompts(body, codec)
    max_tokens = _integer(body, "max_tokens", min(DEFAULT_MAX_TOKENS, max_tokens_cap), 1, max_tokens_cap)
    temperature = _number(body, "temperature", DEFAULT_TEMPERATURE)
    if temperature < 0:
        message = f"`temperature` must be a finite number >= 0 (0 = greedy), got {temperature}"
        raise RequestError(400, message, "temperature")
    top_k = _integer(body, "top_k", 0, 0)
    top_p = _number(body, "top_p", 1.0)
    if not 0 < top_p <= 1:
        raise RequestError(400, f"`top_p` must be a number in (0, 1] (1 = every token), got {top_p}", "top_p")
    seed = body.get("seed")
    seed = secrets.randbits(63) if seed is None else _integer(body, "seed", 0, 0, 2**63 - 1)
    stream = _boolean(body, "stream")
    options = body.get("stream_options", {})
    if not isinstance(options, dict) or not set(options) <= {"include_usage"}:
        message = f"`stream_options` must be an object with at most `include_usage`, got {_shown(options)}"
        raise RequestError(400, message, "stream_options")
    include_usage = _boolean(options, "include_usage") if "include_usage" in options else False
    n = _integer(body, "n", 1, 1)
    if max_streams is not None and n * len(prompts) > max_streams:
        message = (
            f"`n` times the prompts ({n} x {len(prompts)}) must be at most max_streams={max_streams}, "
            f"got {n * len(prompts)}"
        )
        raise RequestError(400, message, "n")
    logprobs = body.get("logprobs")
    if logprobs is not None:
        logprobs = _integer(body, "logprobs", 0, 0, MAX_LOGPROBS)
    echo = _boolean(body, "echo")
    if echo and logprobs is not None:
        message = "`echo` must be false with `logprobs` (the prompt's log probabilities are not computed), got true"
        raise RequestError(400, message, "echo")
    _refuse_what_cannot_be_honoured(body, n)
    for name in ("model", "user"):
        if name in body and not isinstance(body[name], str):
            raise RequestError(400, f"`{name}` must be a string, got {_shown(body[name])}", name)
    return CompletionRequest(
        prompts=prompts,
        prompt_ids=prompt_ids,
        max_tokens=max_tokens,
        temperature=temperature,
        top_k=top_k,
        seed=seed,
        stream=stream,
        top_p=top_p,
        n=n,
        stop=_stop(body),
        logprobs=logprobs,
        echo=echo,
        include_usage=include_usage,
    )
