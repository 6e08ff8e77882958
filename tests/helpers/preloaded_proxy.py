"""The `sys.executable` of a process that the fork server (preloaded.py) started with
`preload_children=True`, so that the Python processes its command starts (Lightning's launcher
starting the other ranks) are forked by the server too.

The server's folder holds a copy of this file, `python`, behind a `#!<real python> -S` line
(no `site`: it starts in milliseconds), and `proxy.json` beside it: the real interpreter, the
server's socket and the environment the server imported with. For a command line the server
can run as a fresh interpreter would, the proxy stands in for the process it asks for: its
streams, working directory and environment go with the request; SIGTERM/SIGINT/SIGHUP are
passed on; it exits as that process did. Anything else, or a request the server refuses,
execs the real interpreter.

This module also holds the rules that both the proxy and preloaded.py apply to a command line
and its environment, so the two cannot disagree; it imports nothing outside the standard
library, since the proxy runs without `site`.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sys

# Environment variables read when the preloaded modules are imported: a command that sets
# them differently from the server gets a real interpreter.
IMPORT_TIME_PREFIXES = ("PYTHON", "LD_", "TORCH", "OMP_", "MKL_", "KMP_", "CUDA", "DS_ACCELERATOR")
# Read when the process runs, not at import; torch.compile sets TORCHINDUCTOR_CACHE_DIR,
# TORCH_WARM_POOL and KMP_DUPLICATE_LIB_OK in the process that compiles, and joblib's import
# sets KMP_INIT_AT_FORK (Intel OpenMP's fork handling, read at fork), so every process a test
# worker starts after either would otherwise look different.
RUNTIME_ONLY = frozenset(
    {
        "PYTHONPATH",
        "OMP_NUM_THREADS",
        "TORCH_EXTENSIONS_DIR",
        "TORCHINDUCTOR_CACHE_DIR",
        "TORCH_WARM_POOL",
        "KMP_DUPLICATE_LIB_OK",
        "KMP_INIT_AT_FORK",
    }
)
# CUDA_VISIBLE_DEVICES values that hide every GPU: a process with one of them cannot use CUDA.
NO_CUDA_DEVICE = ("", "-1")


def fresh_reason(argv: list[str], env: dict[str, str], server_env: dict[str, str]) -> str | None:
    """Why `python *argv` with `env` needs a real interpreter rather than a child of a server
    that imported with `server_env`; None when the server can run it."""
    if not argv:
        return "no command (an interactive interpreter)"
    if argv[0] in ("-m", "-c"):
        if len(argv) < 2:
            return f"{argv[0]} without its argument"
    elif argv[0].startswith("-"):
        return f"interpreter option {argv[0]}"
    # CUDA is never used in a forked child: the CUDA tier runs in the interpreter it is
    # documented for, whatever the server did or did not initialise.
    devices = env.get("CUDA_VISIBLE_DEVICES")
    if devices is not None and devices.strip() not in NO_CUDA_DEVICE:
        return f"the environment asks for CUDA (CUDA_VISIBLE_DEVICES={devices})"
    changed = import_time_differences(env, server_env)
    return f"environment read at import differs: {changed}" if changed else None


def import_time_differences(env: dict[str, str], server_env: dict[str, str]) -> list[str]:
    return sorted(
        key
        for key in set(env) | set(server_env)
        if key.startswith(IMPORT_TIME_PREFIXES) and key not in RUNTIME_ONLY and env.get(key) != server_env.get(key)
    )


def main() -> None:
    with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "proxy.json")) as handle:
        config = json.load(handle)
    real, argv = config["python"], sys.argv[1:]
    if fresh_reason(argv, dict(os.environ), config["imported_with"]) is not None:
        os.execv(real, [real, *argv])
    connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    connection.connect(config["server"])
    request = dict(argv=argv, cwd=os.getcwd(), env=dict(os.environ), new_session=False, preload_children=True)
    socket.send_fds(connection, [json.dumps(request).encode() + b"\n"], [0, 1, 2])
    replies = connection.makefile("r")
    reply = json.loads(replies.readline() or "{}")
    if "pid" not in reply:  # refused (the server has threads): this process becomes the interpreter
        replies.close()
        connection.close()
        os.execv(real, [real, *argv])
    pid = reply["pid"]
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, lambda signum, frame: os.kill(pid, signum))
    line = replies.readline()
    code = json.loads(line)["returncode"] if line else -signal.SIGKILL
    if code < 0:
        signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    sys.exit(code)


if __name__ == "__main__":
    main()
