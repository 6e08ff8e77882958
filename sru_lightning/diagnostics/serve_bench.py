"""Load benchmark of the completions server (`python -m sru_lightning bench serve`).

Starts `serve` on a free loopback port, then keeps 1, 8 and 64 streaming clients busy for
``seconds`` each (every client sends a new request when its stream ends) and prints, per
level, the tokens per second all clients received together, the ratio to the single stream,
the failed requests (not 200, or a stream cut before ``data: [DONE]``) and the server process's
resident memory at the end of the level. The clients run in this process on one event loop with
plain sockets, so they cost the machine little; on a shared machine the figures are noisy.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from dataclasses import dataclass, field

from sru_lightning.app.key_value import setting
from sru_lightning.diagnostics.tables import count_setting, threads_setting

LEVELS = (1, 8, 64)
#: What the server should reach (docs/serving.md).
GOAL_SPEEDUP = 8.0  # tokens/s at 64 streams over one stream
GOAL_RSS_GROWTH = 0.05  # RSS at 64 streams over RSS at 8


@dataclass
class ServeBenchConfig:
    model: str = setting("last", "an export folder, a run directory, a .ckpt file or last")
    seconds: int = count_setting(30, "seconds per level")
    tokens: int = count_setting(256, "max_tokens of each request")
    threads: int = threads_setting(1, "the server's torch intra-op threads")


@dataclass
class LevelResult:
    streams: int
    seconds: float
    tokens: int = 0
    completed: int = 0
    failed: int = 0
    rss_bytes: int = 0
    failures: list[str] = field(default_factory=list)

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0


class ServerRefused(Exception):
    """`serve` refused its settings (exit status 2): its one-line error, which names the setting."""


def start_server(config: ServeBenchConfig, max_streams: int) -> tuple[subprocess.Popen, int]:
    """The started server and its port; ServerRefused with the server's own line when it refuses
    its settings (a model it cannot load), RuntimeError when it fails otherwise."""
    from sru_lightning.app.serve import READY_PREFIX

    command = [sys.executable, "-m", "sru_lightning", "serve", f"model={config.model}", "port=0"]
    command += [f"max_streams={max_streams}", f"max_tokens_cap={config.tokens}", f"threads={config.threads}"]
    process = subprocess.Popen(command, stderr=subprocess.PIPE, text=True)
    lines = []
    for line in process.stderr:
        lines.append(line)
        if READY_PREFIX in line:
            port = int(line.split(READY_PREFIX)[1].split()[0].rsplit(":", 1)[1])
            return process, port
    process.wait()
    said = [line.rstrip() for line in lines if line.strip()]
    if process.returncode == 2 and said:
        raise ServerRefused(said[-1])
    raise RuntimeError("the server did not start:\n" + "".join(lines[-10:]))


def resident_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


async def _one_request(port: int, body: bytes, result: LevelResult, index: int) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        head = (
            f"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
        ).encode()
        writer.write(head + body)
        await writer.drain()
        status_line = await reader.readline()
        if b" 200 " not in status_line:
            result.failed += 1
            result.failures.append(f"client {index}: {status_line.decode(errors='replace').strip()}")
            return
        tail, done = b"", False
        while True:
            data = await reader.read(65536)
            if not data:
                break
            joined = tail + data
            result.tokens += joined.count(b"data: {") - tail.count(b"data: {")
            done = done or b"data: [DONE]" in joined
            tail = joined[-16:]
        if done:
            result.completed += 1
        else:
            result.failed += 1
            result.failures.append(f"client {index}: the stream ended before data: [DONE]")
    finally:
        writer.close()


async def _client(port: int, index: int, config: ServeBenchConfig, result: LevelResult) -> None:
    request = 0
    while True:
        body = {"prompt": "The ", "max_tokens": config.tokens, "temperature": 0.8, "seed": index * 100003 + request}
        request += 1
        try:
            await _one_request(port, json.dumps({**body, "stream": True}).encode(), result, index)
        except (OSError, asyncio.IncompleteReadError) as error:
            result.failed += 1
            result.failures.append(f"client {index}: {type(error).__name__}: {error}")


async def _level(port: int, pid: int, streams: int, config: ServeBenchConfig) -> LevelResult:
    result = LevelResult(streams, float(config.seconds))
    started = time.perf_counter()
    tasks = [asyncio.create_task(_client(port, index, config, result)) for index in range(streams)]
    await asyncio.sleep(config.seconds)
    result.seconds = time.perf_counter() - started
    tokens = result.tokens  # what arrived in the window; the streams cut below are no failures
    result.rss_bytes = resident_bytes(pid)
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    result.tokens = tokens
    await asyncio.sleep(0.5)  # the server frees the cut streams' slots at its next step
    return result


def run_serve_benchmark(config: ServeBenchConfig) -> list[LevelResult]:
    process, port = start_server(config, max(LEVELS))
    try:
        return [asyncio.run(_level(port, process.pid, streams, config)) for streams in LEVELS]
    finally:
        process.terminate()
        process.wait(timeout=120)


def format_table(config: ServeBenchConfig, results: list[LevelResult]) -> str:
    from sru_lightning.diagnostics.tables import fixed_width_lines

    single = results[0].tokens_per_second or float("nan")
    rows = [
        [
            str(r.streams),
            f"{r.tokens_per_second:,.0f}",
            f"{r.tokens_per_second / single:.1f}x",
            str(r.completed),
            str(r.failed),
            f"{r.rss_bytes / 2**20:.1f}",
        ]
        for r in results
    ]
    columns = [("streams", ">8"), ("tokens/s", ">11"), ("vs 1 stream", ">13"), ("completed", ">11")]
    columns += [("failed", ">8"), ("server RSS MiB", ">16")]
    lines = [
        f"serve: model={config.model}, {config.seconds} s per level, max_tokens={config.tokens}, "
        f"server threads={config.threads}; clients in this process (a shared machine: noisy)",
        *fixed_width_lines(columns, rows),
    ]
    by_streams = {r.streams: r for r in results}
    if 8 in by_streams and 64 in by_streams:
        speedup = by_streams[64].tokens_per_second / single
        growth = by_streams[64].rss_bytes / max(by_streams[8].rss_bytes, 1) - 1
        failed = sum(r.failed for r in results)
        lines += [
            f"goal: 64 streams >= {GOAL_SPEEDUP:.0f}x one stream: {speedup:.1f}x "
            f"({'met' if speedup >= GOAL_SPEEDUP else 'not met'})",
            f"goal: RSS at 64 streams within {GOAL_RSS_GROWTH:.0%} of RSS at 8: {growth:+.1%} "
            f"({'met' if abs(growth) <= GOAL_RSS_GROWTH else 'not met'})",
            f"goal: no failed request: {failed} failed ({'met' if failed == 0 else 'not met'})",
        ]
    for r in results:
        lines += [f"  {failure}" for failure in r.failures[:5]]
    return "\n".join(lines)
