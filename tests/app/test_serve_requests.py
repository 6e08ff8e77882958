"""`serve`'s request reading: every bad field is one 400 naming it; a good request keeps its values;
bad `serve` settings are one named usage error."""

from __future__ import annotations

import json

import pytest

from sru_lightning.app import cli
from sru_lightning.app.serving.requests import RequestError, error_body, parse_completion_request
from sru_lightning.data import TokenCodec

CODEC = TokenCodec("char", list("abc "))


def parse(body, cap: int = 100):
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    return parse_completion_request(raw, CODEC, cap)


@pytest.mark.parametrize(
    "body,param,message",
    [
        (b"{bad", None, "the body must be a JSON object, got malformed JSON"),
        ([1, 2], None, "the body must be a JSON object, got a JSON list"),
        ({}, "prompt", "`prompt` is required"),
        ({"prompt": ""}, "prompt", "`prompt` must hold at least one token, got ''"),
        ({"prompt": 5}, "prompt", "`prompt` must be a string, got 5"),
        ({"prompt": "abz"}, "prompt", "`prompt` cannot be read by this model: characters 'z' are not in"),
        ({"prompt": "a", "max_tokens": 0}, "max_tokens", "`max_tokens` must be an integer from 1 to 100, got 0"),
        ({"prompt": "a", "max_tokens": -3}, "max_tokens", "`max_tokens` must be an integer from 1 to 100, got -3"),
        ({"prompt": "a", "max_tokens": 101}, "max_tokens", "`max_tokens` must be an integer from 1 to 100, got 101"),
        ({"prompt": "a", "max_tokens": "5"}, "max_tokens", '`max_tokens` must be an integer, got "5"'),
        ({"prompt": "a", "max_tokens": True}, "max_tokens", "`max_tokens` must be an integer, got true"),
        ({"prompt": "a", "temperature": "hot"}, "temperature", '`temperature` must be a number, got "hot"'),
        ({"prompt": "a", "temperature": -1}, "temperature", "`temperature` must be a finite number >= 0"),
        ({"prompt": "a", "seed": 1.5}, "seed", "`seed` must be an integer, got 1.5"),
        ({"prompt": "a", "stream": "yes"}, "stream", '`stream` must be true or false, got "yes"'),
        ({"prompt": "a", "n": 2}, "n", "`n` must be an integer from 1 to 1, got 2"),
        ({"prompt": "a", "stop": "."}, "stop", "unsupported field(s) 'stop'"),
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
        [0, 1, 3, 2],
        7,
        0.0,
        3,
        True,
    )
    default = parse({"prompt": "a"})
    assert (default.max_tokens, default.temperature, default.top_k, default.stream) == (16, 1.0, 0, False)
    assert parse({"prompt": "a"}, cap=4).max_tokens == 4  # the default never exceeds the cap


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
