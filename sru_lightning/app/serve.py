"""`python -m sru_lightning serve model=<export folder | run dir | .ckpt | last> port=8000`: an
OpenAI-style completions server whose open streams advance together, one batched recurrent step
per token (docs/serving.md).

The model is loaded the way `generate` loads it (a checkpoint or run through
:func:`~sru_lightning.app.runs.trained_model.load_trained`, an export folder through
:func:`~sru_lightning.export.generate_backend.load_for_generation`), so greedy text equals
`generate`'s. SIGTERM (or Ctrl+C) stops taking connections, finishes the open streams and exits 0.
"""

from __future__ import annotations

import signal
import socket
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from sru_lightning.app.key_value import setting, wants_help
from sru_lightning.app.usage import UsageError, command_prog, print_error

PROG = command_prog("serve")
#: The line printed once the server accepts connections; tools read the address from it.
READY_PREFIX = "serving on http://"


@dataclass
class ServeSettings:
    """The command's settings (`key=value` on the command line)."""

    model: str = setting(
        "last", 'an export folder, a run directory, a .ckpt file, or "last" (newest run under resume_dir)'
    )
    host: str = setting("127.0.0.1", "address to listen on (0.0.0.0: every interface)")
    port: int = setting(8000, "0 = a free port (printed when ready)")
    max_streams: int = setting(64, "open completions at once; one more is refused with 503 and Retry-After")
    max_tokens_cap: int = setting(2048, "the largest max_tokens a request may ask for")
    device: str = setting("cpu", "cpu or cuda (a checkpoint's model; export folders run on the cpu)")
    backend: str = setting("", "for an export folder: onnxruntime or pt2; empty = from the folder")
    threads: int = setting(0, "torch intra-op threads of the model; 0 = torch's default")
    resume_dir: str = setting("outputs", "where model=last looks")
    log_level: str = setting("warning", "uvicorn's: debug, info (one line per request), warning, error")


LOG_LEVELS = ("critical", "error", "warning", "info", "debug", "trace")


def usage() -> str:
    from sru_lightning.app.key_value import command_usage

    notes = [
        "POST /v1/completions {prompt, max_tokens, temperature, top_k, top_p, n, stop, seed, stream, logprobs};",
        "GET /v1/models; GET /health.",
        "temperature=0 is greedy (the text of `generate ... temperature=0`).",
    ]
    example = f"{PROG} model=outputs/<date>/<time> port=8000 max_streams=64"
    return command_usage(PROG, "Serve completions of a trained model over HTTP.", ServeSettings, notes, [example])


def parse_settings(argv: Sequence[str]) -> ServeSettings:
    from sru_lightning.app.key_value import check_device, parse_key_values

    settings, _ = parse_key_values(argv, ServeSettings, UsageError)
    if not 0 <= settings.port <= 65535:
        raise UsageError(f"`port` must be from 0 (a free port) to 65535, got {settings.port}")
    if settings.max_streams < 1:
        raise UsageError(
            f"`max_streams` must be a positive integer (open completions at once), got {settings.max_streams}"
        )
    if settings.max_tokens_cap < 1:
        raise UsageError(f"`max_tokens_cap` must be a positive integer, got {settings.max_tokens_cap}")
    if settings.threads < 0:
        raise UsageError(f"`threads` must be an integer >= 0 (0 = torch's default), got {settings.threads}")
    check_device(settings.device, UsageError)
    if settings.log_level not in LOG_LEVELS:
        raise UsageError(f"`log_level` must be one of {', '.join(LOG_LEVELS)}, got {settings.log_level!r}")
    return settings


def load_model(settings: ServeSettings):
    """(model with `step`, codec, one line saying what was loaded), by `generate`'s loaders."""
    from sru_lightning.export.package import MANIFEST_NAME

    folder = Path(settings.model).expanduser()
    if (folder / MANIFEST_NAME).is_file():
        from sru_lightning.export import ExportError
        from sru_lightning.export.generate_backend import load_for_generation

        if settings.device != "cpu":
            raise UsageError(f"`device` must be 'cpu' with an export folder, got {settings.device!r}")
        try:
            return load_for_generation(settings.model, settings.backend, torch.get_num_threads())
        except ExportError as error:
            raise UsageError(str(error)) from None
    if settings.backend:
        raise UsageError(
            f"`backend` ({settings.backend!r}) applies to an export folder, but {settings.model!r} holds no "
            f"{MANIFEST_NAME}"
        )
    from sru_lightning.app.runs.trained_model import load_trained

    try:
        path, checkpoint, model, codec = load_trained(settings.model, settings.resume_dir, "serve")
    except UsageError as error:  # generate's loader names its own setting
        raise UsageError(
            str(error).replace("`ckpt_path", "`model").replace("point ckpt_path at", "point model at")
        ) from None
    network = model.net.to(settings.device)  # the network steps; the LightningModule trains it
    return network, codec, f"{path} (step {checkpoint.get('global_step', '?')}, {codec.level} level)"


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if wants_help(argv):
        print(usage())
        return 0
    try:
        settings = parse_settings(argv)
        _check_server_packages()
        if settings.threads:
            torch.set_num_threads(settings.threads)
        model, codec, description = load_model(settings)
        listener = _listen(settings.host, settings.port)
    except UsageError as error:
        print_error(str(error), PROG)
        return 2
    return serve(model, codec, description, listener, settings)


def _check_server_packages() -> None:
    """The web server's packages, or a one-line UsageError naming the extra that installs them."""
    import importlib.util

    missing = [name for name in ("fastapi", "uvicorn") if importlib.util.find_spec(name) is None]
    if missing:
        raise UsageError(
            f"serve needs {' and '.join(missing)}, {'which is' if len(missing) == 1 else 'which are'} not installed: "
            "pip install 'sru_lightning[serve]'"
        )


def _listen(host: str, port: int) -> socket.socket:
    """The bound listening socket (port 0: a free one), so the address printed is the real one."""
    try:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        listener = socket.socket(family, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((host, port))
    except OSError as error:
        raise UsageError(f"cannot listen on host={host!r} port={port}: {error.strerror or error}") from None
    listener.listen(2048)
    listener.setblocking(False)
    return listener


def serve(model, codec, description: str, listener: socket.socket, settings: ServeSettings) -> int:
    """Run the server on `listener` until SIGTERM/SIGINT; the open streams finish first."""
    import uvicorn

    from sru_lightning.app.serving.http import Outbox, build_app
    from sru_lightning.app.serving.scheduler import Scheduler

    outbox = Outbox()
    try:
        scheduler = Scheduler(model, codec, settings.max_streams, after_step=outbox.flush)
    except ValueError as error:
        print_error(f"cannot batch this model's steps: {error}", PROG)
        return 2
    name = Path(settings.model).name or settings.model
    app = build_app(scheduler, outbox, name, settings.max_tokens_cap)
    config = uvicorn.Config(app, log_level=settings.log_level, access_log=settings.log_level in ("info", "debug"))
    server = uvicorn.Server(config)
    host, port = listener.getsockname()[:2]
    shown = f"[{host}]" if ":" in host else host
    print(f"{PROG}: {description}", file=sys.stderr)
    print(
        f"{PROG}: {READY_PREFIX}{shown}:{port} (max_streams={settings.max_streams}, "
        f"max_tokens_cap={settings.max_tokens_cap}); SIGTERM or Ctrl+C drains and stops",
        file=sys.stderr,
        flush=True,
    )
    # uvicorn drains on SIGTERM/SIGINT and then raises the signal again, to end the process by its
    # default action; a handler of our own takes that second delivery, so a drained stop exits 0.
    stopped: list[int] = []
    previous = {
        signum: signal.signal(signum, lambda signum, frame: stopped.append(signum))
        for signum in (signal.SIGTERM, signal.SIGINT)
    }
    try:
        server.run(sockets=[listener])
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        scheduler.close()
    stats = scheduler.stats()
    print(f"{PROG}: stopped after {stats['tokens']} tokens in {stats['steps']} batched steps", file=sys.stderr)
    return 0
