"""`python -m sru_lightning serve` as a real process on a loopback port: greedy text equals
`generate`'s, alone and batched with other streams; a seed gives the same text whatever else is in
the batch; bad requests get their 4xx and the server serves on; a client that leaves frees its
slot; max_streams refuses one more with 503; SIGTERM finishes the open streams and exits 0; the
`openai` package's client reads it, with the fields OpenAI clients send."""

from __future__ import annotations

import http.client
import io
import json
import os
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from helpers.tiny_run import TINY_RUN

from sru_lightning.app.serve import READY_PREFIX

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    run = tmp_path_factory.mktemp("serve") / "run"
    fit = subprocess.run(
        [sys.executable, "-m", "sru_lightning", "fit", *TINY_RUN, "logger=none", f"hydra.run.dir={run}"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert fit.returncode == 0, fit.stderr[-3000:]
    return run


class Server:
    """A `serve` process; `port` read from its ready line."""

    def __init__(self, run_dir: Path, *settings: str) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "sru_lightning", "serve", f"model={run_dir}", "port=0", *settings],
            stderr=subprocess.PIPE,
            text=True,
        )
        self.lines: list[str] = []
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            line = self.process.stderr.readline()
            if not line:
                break
            self.lines.append(line)
            if READY_PREFIX in line:
                self.port = int(line.split(READY_PREFIX)[1].split()[0].rsplit(":", 1)[1])
                threading.Thread(target=self._drain_stderr, daemon=True).start()
                return
        self.process.kill()
        raise AssertionError("the server never said it was ready:\n" + "".join(self.lines))

    def _drain_stderr(self) -> None:
        for line in self.process.stderr:
            self.lines.append(line)

    def connection(self) -> http.client.HTTPConnection:
        return http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)

    def post(self, body) -> tuple[int, dict]:
        connection = self.connection()
        raw = body if isinstance(body, bytes) else json.dumps(body).encode()
        connection.request("POST", "/v1/completions", raw, {"Content-Type": "application/json"})
        response = connection.getresponse()
        payload = json.loads(response.read())
        connection.close()
        return response.status, payload

    def health(self) -> dict:
        connection = self.connection()
        connection.request("GET", "/health")
        payload = json.loads(connection.getresponse().read())
        connection.close()
        return payload

    def open_stream(self, body: dict) -> tuple[http.client.HTTPConnection, http.client.HTTPResponse]:
        connection = self.connection()
        connection.request("POST", "/v1/completions", json.dumps({**body, "stream": True}).encode())
        return connection, connection.getresponse()

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout=120)


def read_events(response: http.client.HTTPResponse, limit: int | None = None) -> list:
    """The `data:` payloads of a streamed response (parsed chunks, and "[DONE]")."""
    events = []
    while limit is None or len(events) < limit:
        line = response.readline()
        if not line:
            break
        if line.startswith(b"data: "):
            data = line[6:].strip().decode()
            events.append(data if data == "[DONE]" else json.loads(data))
            if data == "[DONE]":
                break
    return events


@pytest.fixture(scope="module")
def server(run_dir):
    started = Server(run_dir, "max_tokens_cap=1000000")
    yield started
    assert started.stop() == 0, "".join(started.lines[-20:])


def generate_text(run_dir: Path, prompt: str, length: int, temperature: float, seed: int = 0) -> str:
    """What `generate` writes after the prompt, run in this process by its own functions."""
    from sru_lightning.app.decoding import generate_text
    from sru_lightning.app.runs.trained_model import load_trained

    _, _, model, codec = load_trained(str(run_dir), "outputs")
    out = io.StringIO()
    generate_text(model, codec, out, prompt=prompt, length=length, temperature=temperature, seed=seed)
    return out.getvalue()[len(prompt) :]


PROMPTS = ["The ", "a", "import os\n", "class A", "def f(x):", "  return", "# note", "if x"]


def test_greedy_text_equals_generate_alone_and_in_a_batch(server, run_dir):
    expected = {prompt: generate_text(run_dir, prompt, 60, 0.0) for prompt in PROMPTS}
    status, alone = server.post({"prompt": "The ", "max_tokens": 60, "temperature": 0})
    assert status == 200
    assert alone["object"] == "text_completion" and alone["id"].startswith("cmpl-")
    assert alone["choices"][0]["text"] == expected["The "]
    assert alone["choices"][0]["finish_reason"] == "length"
    assert alone["usage"] == {"prompt_tokens": 4, "completion_tokens": 60, "total_tokens": 64}

    def streamed(prompt: str) -> str:
        connection, response = server.open_stream({"prompt": prompt, "max_tokens": 60, "temperature": 0})
        events = read_events(response)
        connection.close()
        assert events[-1] == "[DONE]" and events[-2]["choices"][0]["finish_reason"] == "length"
        assert len(events) == 61  # one chunk per token
        return "".join(event["choices"][0]["text"] for event in events[:-1])

    with ThreadPoolExecutor(len(PROMPTS)) as pool:
        texts = dict(zip(PROMPTS, pool.map(streamed, PROMPTS)))
    assert texts == expected
    assert server.health()["steps"] > 0


def test_a_seed_gives_generates_sample_whatever_else_is_in_the_batch(server, run_dir):
    expected = generate_text(run_dir, "The ", 50, 0.8, seed=7)
    body = {"prompt": "The ", "max_tokens": 50, "temperature": 0.8, "seed": 7}
    assert server.post(body)[1]["choices"][0]["text"] == expected
    bodies = [body] + [{**body, "seed": seed, "prompt": "a"} for seed in range(7)]
    with ThreadPoolExecutor(len(bodies)) as pool:
        results = list(pool.map(server.post, bodies))
    assert results[0][1]["choices"][0]["text"] == expected
    assert len({result[1]["choices"][0]["text"] for result in results[1:]}) > 1  # seeds do differ


BAD_BODIES = [
    (b'{"prompt": ""}', "`prompt` must hold at least one token"),
    ('{"prompt": "\u2603"}'.encode(), "`prompt` cannot be read by this model"),
    (b'{"prompt": "a", "max_tokens": 0}', "`max_tokens` must be an integer from 1 to 1000000, got 0"),
    (b'{"prompt": "a", "max_tokens": -1}', "`max_tokens` must be an integer from 1 to 1000000, got -1"),
    (b'{"prompt": "a", "max_tokens": 1000001}', "got 1000001"),
    (b'{"prompt": "a",', "the body must be a JSON object, got malformed JSON"),
    (b'{"prompt": [["a"]]}', "`prompt` must be a string, a list of strings, a list of token ids or a list of"),
    (b'{"prompt": "a", "frequency_penalty": 0.5}', "`frequency_penalty` must be 0 (this server applies no penal"),
    (b'{"prompt": "a", "temperature": "0"}', "`temperature` must be a finite number"),
]


@pytest.mark.parametrize("body,message", BAD_BODIES, ids=[message[:30] for _, message in BAD_BODIES])
def test_a_bad_request_gets_a_400_and_the_next_good_one_is_served(server, body, message):
    status, payload = server.post(body)
    assert status == 400
    assert message in payload["error"]["message"] and payload["error"]["type"] == "invalid_request_error"
    status, good = server.post({"prompt": "a", "max_tokens": 3})
    assert status == 200 and good["usage"]["completion_tokens"] == 3


def wait_for_open_streams(server: Server, count: int, seconds: float = 30) -> dict:
    deadline = time.monotonic() + seconds
    while True:
        health = server.health()
        if health["open_streams"] == count or time.monotonic() > deadline:
            return health
        time.sleep(0.05)


def test_a_client_that_leaves_mid_stream_frees_its_slot(server):
    assert wait_for_open_streams(server, 0)["open_streams"] == 0
    connection, response = server.open_stream({"prompt": "The ", "max_tokens": 1000000})
    assert len(read_events(response, limit=3)) == 3
    assert server.health()["open_streams"] == 1
    tokens_before = server.health()["tokens"]
    connection.sock.shutdown(2)
    connection.close()
    health = wait_for_open_streams(server, 0)
    assert health["open_streams"] == 0 and health["batched_streams"] == 0
    assert health["tokens"] - tokens_before < 1000000  # it stopped long before its max_tokens


def test_max_streams_refuses_one_more_and_sigterm_finishes_the_open_streams(run_dir):
    server = Server(run_dir, "max_streams=2", "max_tokens_cap=100000")
    try:
        streams = [server.open_stream({"prompt": "The ", "max_tokens": 20000, "seed": i}) for i in range(2)]
        assert all(len(read_events(response, limit=1)) == 1 for _, response in streams)
        status, refused = server.post({"prompt": "a", "max_tokens": 2})
        assert status == 503 and "max_streams" in refused["error"]["message"]
        server.process.send_signal(signal.SIGTERM)
        for connection, response in streams:
            events = read_events(response)
            connection.close()
            assert events[-1] == "[DONE]"
            last = events[-2]
            assert last["usage"]["completion_tokens"] == 20000 and last["choices"][0]["finish_reason"] == "length"
        assert server.process.wait(timeout=120) == 0
        assert any("stopped after" in line for line in server.lines)
    finally:
        if server.process.poll() is None:
            server.process.kill()
            server.process.wait()


def test_an_export_folder_serves_generates_greedy_text(run_dir, tmp_path):
    pytest.importorskip("onnxruntime", reason="export folders of format=onnx run on onnxruntime")
    folder = tmp_path / "exported"
    export = subprocess.run(
        [sys.executable, "-m", "sru_lightning", "export", f"ckpt_path={run_dir}", "format=onnx", f"out={folder}"],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
    )
    assert export.returncode == 0, export.stderr[-3000:]
    expected = generate_text(run_dir, "The ", 40, 0.0)
    server = Server(folder)
    try:
        with ThreadPoolExecutor(4) as pool:
            results = list(pool.map(server.post, [{"prompt": "The ", "max_tokens": 40, "temperature": 0}] * 4))
        assert [result[1]["choices"][0]["text"] for result in results] == [expected] * 4
    finally:
        assert server.stop() == 0


# -- the `openai` package's client -----------------------------------------------------------------


@pytest.fixture(scope="module")
def client(server):
    openai = pytest.importorskip("openai", reason="the OpenAI client tests need the `hf` extra")
    return openai.OpenAI(base_url=f"http://127.0.0.1:{server.port}/v1", api_key="unused", max_retries=0, timeout=120)


def test_the_openai_client_lists_the_model_and_completes(client, run_dir):
    (model,) = client.models.list().data
    assert model.id == run_dir.name and client.models.retrieve(run_dir.name).id == run_dir.name
    completion = client.completions.create(model=model.id, prompt="The ", max_tokens=30, temperature=0)
    assert completion.choices[0].text == generate_text(run_dir, "The ", 30, 0.0)
    assert completion.usage.completion_tokens == 30


def test_stop_ends_the_text_before_the_stop_string(client, run_dir):
    greedy = generate_text(run_dir, "The ", 60, 0.0)
    stop = greedy[20:22]  # a piece of the text it will write: the text ends where it first appears
    completion = client.completions.create(model="m", prompt="The ", max_tokens=60, temperature=0, stop=[stop, "@@@"])
    (choice,) = completion.choices
    assert (choice.text, choice.finish_reason) == (greedy[: greedy.find(stop)], "stop")
    streamed = client.completions.create(model="m", prompt="The ", max_tokens=60, temperature=0, stop=stop, stream=True)
    chunks = list(streamed)
    assert "".join(chunk.choices[0].text for chunk in chunks) == choice.text
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_list_prompts_and_n_choices_are_streams_of_one_batch(client, run_dir, server):
    prompts = ["The ", "a"]
    steps_before = server.health()["steps"]
    completion = client.completions.create(model="m", prompt=prompts, n=3, max_tokens=40, temperature=0.9, seed=5)
    choices = sorted(completion.choices, key=lambda choice: choice.index)
    assert [choice.index for choice in choices] == list(range(6))
    # choice c of each prompt draws with seed + c: `generate`'s sample for that seed
    expected = [generate_text(run_dir, prompt, 40, 0.9, seed=5 + c) for prompt in prompts for c in range(3)]
    assert [choice.text for choice in choices] == expected
    assert completion.usage.prompt_tokens == 5 and completion.usage.completion_tokens == 6 * 40
    assert server.health()["steps"] - steps_before < 6 * 40  # the six streams stepped together
    stream = client.completions.create(
        model="m", prompt=prompts, n=3, max_tokens=40, temperature=0.9, seed=5, stream=True
    )
    texts = ["" for _ in range(6)]
    for chunk in stream:
        for choice in chunk.choices:
            texts[choice.index] += choice.text
    assert texts == expected


def test_logprobs_and_top_p(client, run_dir):
    completion = client.completions.create(model="m", prompt="The ", max_tokens=20, temperature=0, logprobs=2)
    (choice,) = completion.choices
    logprobs = choice.logprobs
    assert "".join(logprobs.tokens) == choice.text
    assert len(logprobs.token_logprobs) == 20 and all(value <= 0 for value in logprobs.token_logprobs)
    for token, value, top in zip(logprobs.tokens, logprobs.token_logprobs, logprobs.top_logprobs):
        assert 1 <= len(top) <= 2 and max(top.values()) == pytest.approx(value)  # greedy: the likeliest
        assert top.get(token, value) == pytest.approx(value)
    # a nucleus so small that it holds the likeliest token alone: greedy text at any temperature
    nucleus = client.completions.create(model="m", prompt="The ", max_tokens=20, temperature=1.5, top_p=1e-6)
    assert nucleus.choices[0].text == choice.text


def test_a_field_it_cannot_honour_is_refused_naming_it(client):
    import openai

    with pytest.raises(openai.BadRequestError, match=r"`presence_penalty` must be 0 .*got 0\.5"):
        client.completions.create(model="m", prompt="a", max_tokens=2, presence_penalty=0.5)
    neutral = client.completions.create(model="m", prompt="a", max_tokens=2, presence_penalty=0, frequency_penalty=0)
    assert neutral.usage.completion_tokens == 2
