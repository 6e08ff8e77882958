"""`serve`'s request reading: every bad field is one 400 naming it; a good request keeps its values;
bad `serve` settings are one named usage error."""

from __future__ import annotations

import json

import pytest

from sru_lightning.app import cli
from sru_lightning.app.serving.requests import RequestError, error_body, parse_completion_request
from sru_lightning.data import TokenCodec

CODEC = TokenCodec("char", list("abc "))


def parse(body, cap: int = 100, max_streams: int | None = 8):
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    return parse_completion_request(raw, CODEC, cap, max_streams)


@pytest.mark.parametrize(
    "body,param,message",
    [
        (b"{bad", None, "the body must be a JSON object, got malformed JSON"),
        ([1, 2], None, "the body must be a JSON object, got a JSON list"),
        ({}, "prompt", "`prompt` is required"),
        ({"prompt": ""}, "prompt", "`prompt` must hold at least one token, got ''"),
        ({"prompt": 5}, "prompt", "`prompt` must be a string, a list of strings, a list of token ids or a list"),
        ({"prompt": []}, "prompt", "`prompt` must be a string, a list of strings, a list of token ids"),
        ({"prompt": ["ab", 3]}, "prompt", "`prompt` must be a string, a list of strings, a list of token ids"),
        ({"prompt": [0, 4]}, "prompt", "`prompt` token ids must be from 0 to 3, got [4]"),
        ({"prompt": ["a", ""]}, "prompt", "`prompt` must hold at least one token, got ''"),
        ({"prompt": "abz"}, "prompt", "`prompt` cannot be read by this model: characters 'z' are not in"),
        ({"prompt": "a", "max_tokens": 0}, "max_tokens", "`max_tokens` must be an integer from 1 to 100, got 0"),
        ({"prompt": "a", "max_tokens": -3}, "max_tokens", "`max_tokens` must be an integer from 1 to 100, got -3"),
        ({"prompt": "a", "max_tokens": 101}, "max_tokens", "`max_tokens` must be an integer from 1 to 100, got 101"),
        ({"prompt": "a", "max_tokens": "5"}, "max_tokens", '`max_tokens` must be an integer, got "5"'),
        ({"prompt": "a", "max_tokens": True}, "max_tokens", "`max_tokens` must be an integer, got true"),
        ({"prompt": "a", "temperature": "hot"}, "temperature", '`temperature` must be a finite number, got "hot"'),
        ({"prompt": "a", "temperature": -1}, "temperature", "`temperature` must be a finite number >= 0"),
        ({"prompt": "a", "seed": 1.5}, "seed", "`seed` must be an integer, got 1.5"),
        ({"prompt": "a", "stream": "yes"}, "stream", '`stream` must be true or false, got "yes"'),
        ({"prompt": "a", "n": 0}, "n", "`n` must be an integer >= 1, got 0"),
        ({"prompt": ["a", "b"], "n": 5}, "n", "`n` times the prompts (5 x 2) must be at most max_streams=8, got 10"),
        ({"prompt": "a", "stop": ""}, "stop", '`stop` must be a non-empty string or a list of them, got ""'),
        ({"prompt": "a", "stop": ["a", 1]}, "stop", "`stop` must be a non-empty string or a list of them"),
        ({"prompt": "a", "stop": list("abcde")}, "stop", "`stop` must hold at most 4 strings, got 5"),
        ({"prompt": "a", "top_p": 0}, "top_p", "`top_p` must be a number in (0, 1] (1 = every token), got 0.0"),
        ({"prompt": "a", "top_p": 1.5}, "top_p", "`top_p` must be a number in (0, 1] (1 = every token), got 1.5"),
        ({"prompt": "a", "logprobs": 6}, "logprobs", "`logprobs` must be an integer from 0 to 5, got 6"),
        ({"prompt": "a", "logprobs": 1, "echo": True}, "echo", "`echo` must be false with `logprobs`"),
        ({"prompt": "a", "frequency_penalty": 0.5}, "frequency_penalty", "`frequency_penalty` must be 0 (this"),
        ({"prompt": "a", "presence_penalty": -1}, "presence_penalty", "`presence_penalty` must be 0 (this server"),
        ({"prompt": "a", "best_of": 3}, "best_of", "`best_of` must equal `n` (1): every choice is returned, none"),
        ({"prompt": "a", "logit_bias": {"1": 5}}, "logit_bias", "`logit_bias` must be empty (not supported), got"),
        ({"prompt": "a", "suffix": "c"}, "suffix", "`suffix` must be empty (the model continues text left to right"),
        ({"prompt": "a", "stream_options": {"x": 1}}, "stream_options", "`stream_options` must be an object with"),
        ({"prompt": "a", "functions": []}, "functions", "unsupported field(s) 'functions'"),
    ],
)
def test_each_bad_field_is_a_400_naming_it(body, param, message):
    with pytest.raises(RequestError) as raised:
        parse(body)
    error = raised.value
    assert error.status == 400 and error.param == param
    assert message in error.message and "\n" not in error.message
    shape = error_body(error.message, error.kind, error.param)
    assert shape == {"error": {"message": error.message, "type": "invalid_request_error", "param": param, "code": None}}


def test_a_good_request_keeps_its_values_and_defaults_follow_openai():
    request = parse({"prompt": "ab c", "max_tokens": 7, "temperature": 0, "seed": 3, "stream": True, "model": "x"})
    assert (request.prompt_ids, request.max_tokens, request.temperature, request.seed, request.stream) == (
        ([0, 1, 3, 2],),
        7,
        0.0,
        3,
        True,
    )
    default = parse({"prompt": "a"})
    assert (default.max_tokens, default.temperature, default.top_k, default.stream) == (16, 1.0, 0, False)
    assert parse({"prompt": "a"}, cap=4).max_tokens == 4  # the default never exceeds the cap


def test_what_openai_clients_send_is_read_and_null_is_absent():
    # the fields an OpenAI client library fills in for a plain call, at their neutral values
    sent = {"prompt": "ab", "n": 1, "best_of": 1, "echo": False, "frequency_penalty": 0, "presence_penalty": 0.0}
    sent |= {"logit_bias": {}, "logprobs": None, "stop": None, "suffix": None, "top_p": 1, "user": "u", "seed": None}
    sent |= {"max_tokens": None, "temperature": None, "stream_options": None}
    request = parse(sent)
    assert (request.max_tokens, request.temperature, request.top_p, request.stop, request.logprobs) == (
        16,
        1.0,
        1.0,
        (),
        None,
    )


def test_prompts_and_n_make_one_stream_per_choice_in_the_order_of_the_choices():
    request = parse({"prompt": ["ab", [3, 0]], "n": 2, "seed": 10, "stop": ["c", "c", "a "], "top_p": 0.5})
    streams = request.streams()
    assert [(s.index, s.prompt, s.prompt_ids, s.seed) for s in streams] == [
        (0, "ab", [0, 1], 10),
        (1, "ab", [0, 1], 11),
        (2, " a", [3, 0], 10),
        (3, " a", [3, 0], 11),
    ]
    assert {(s.stop, s.top_p) for s in streams} == {(("c", "a "), 0.5)}
    assert parse({"prompt": "a", "stop": "."}).stop == (".",)
    assert parse({"prompt": "a", "logprobs": 0}).streams()[0].logprobs == 0


@pytest.mark.parametrize(
    "argument,message",
    [
        ("max_streams=0", "`max_streams` must be a positive integer (open completions at once), got 0"),
        ("port=70000", "`port` must be from 0 (a free port) to 65535, got 70000"),
        ("max_tokens_cap=-1", "`max_tokens_cap` must be a positive integer, got -1"),
        ("prot=1", "unknown setting 'prot' (did you mean 'port'?)"),
        ("model=/no/such.ckpt", "`model` must be a checkpoint file, a run directory or 'last', got '/no/such.ckpt'"),
    ],
)
def test_bad_settings_get_one_named_error_and_exit_2(argument, message, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert cli.main(["serve", argument]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_serve_is_listed_and_explains_its_settings(capsys):
    assert cli.main(["--help"]) == 0
    assert "  serve" in capsys.readouterr().out
    assert cli.main(["serve", "--help"]) == 0
    out = capsys.readouterr().out
    assert "max_streams=64" in out and "max_tokens_cap=2048" in out and "POST /v1/completions" in out


def test_serve_without_its_web_packages_names_the_extra(monkeypatch, capsys):
    import importlib.util

    from sru_lightning.app import serve

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "uvicorn" else real(name, *a))
    assert serve.main(["model=/nonexistent"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.endswith("serve needs uvicorn, which is not installed: pip install 'sru_lightning[serve]'"), err
