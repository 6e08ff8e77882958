"""Python processes for the tests, started from an interpreter that has already imported
torch, Lightning, DeepSpeed and Hydra: a fork server.

A test that runs the command line in a separate process (`python -m sru_lightning fit ...`,
`python -c ...`, `python script.py`) pays about 5 CPU-seconds of imports before the command
does anything, and the process tests start a few hundred. `run` and `Popen` here take the
same arguments as `subprocess.run` / `subprocess.Popen`; for a Python command line they ask
this worker's fork server for the process instead. What the test gets is still a real,
separate process: its own pid, arguments, environment, working directory, standard streams
(the test's files, passed over; a `PIPE` is a file read back when the process has ended),
exit status and, with `start_new_session=True`, its
own session, so that signals to it or to its process group behave as they do for a process
started from a shell. The child runs its target the way `python -m`/`-c`/a script does
(`runpy`), re-seeds `random`, sets the thread count the environment asks for, and at exit
waits for its threads and runs `atexit` as an interpreter does.

What differs from a fresh interpreter: the server's third-party modules are already imported
(never sru_lightning's own, which each child imports from its own `sys.path`). So a command
whose environment changes what those imports read (PYTHON*, LD_*, TORCH*, OMP_*/MKL_*/KMP_*
other than OMP_NUM_THREADS, CUDA*, DS_ACCELERATOR) gets a real interpreter, as does any
command line with interpreter options. Tests about interpreter start-up itself (imports
without Hydra, packaging, shell pipes, kernel builds) use `subprocess` directly.
`SRU_LIGHTNING_TEST_FRESH_INTERPRETERS=1` makes every process here a real interpreter.
(`ps` shows a forked process with the server's command line, `.../preloaded.py <socket>`.)
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

PRELOAD = ("torch", "torch._dynamo", "lightning.pytorch", "hydra", "omegaconf", "torchmetrics", "deepspeed")
# Environment variables read when the preloaded modules are imported: a command that sets
# them differently from the server gets a real interpreter.
IMPORT_TIME_PREFIXES = ("PYTHON", "LD_", "TORCH", "OMP_", "MKL_", "KMP_", "CUDA", "DS_ACCELERATOR")
# Read when the process runs, not at import; torch.compile sets TORCHINDUCTOR_CACHE_DIR,
# TORCH_WARM_POOL and KMP_DUPLICATE_LIB_OK in the process that compiles, and joblib's import
# sets KMP_INIT_AT_FORK (Intel OpenMP's fork handling, read at fork), so every process a test
# worker starts after either would otherwise look different.
RUNTIME_ONLY = {
    "PYTHONPATH",
    "OMP_NUM_THREADS",
    "TORCH_EXTENSIONS_DIR",
    "TORCHINDUCTOR_CACHE_DIR",
    "TORCH_WARM_POOL",
    "KMP_DUPLICATE_LIB_OK",
    "KMP_INIT_AT_FORK",
}
FRESH = "SRU_LIGHTNING_TEST_FRESH_INTERPRETERS"

# `sys.executable` of a child started with preload_children=True: the Python processes its
# command starts (Lightning's launcher starting the other ranks) are forked by the server too.
# It runs without `site` (milliseconds), stands in for the process it asked for (its streams,
# working directory and environment go with the request; SIGTERM/SIGINT/SIGHUP are passed on;
# it exits as that process did) and execs the real interpreter for anything else.
PROXY = """#!{python} -S
import json, os, signal, socket, sys

REAL, SERVER = {python!r}, {server!r}
IMPORTED_WITH = {imported_with}
PREFIXES = {prefixes!r}
RUNTIME_ONLY = {runtime_only!r}
argv = sys.argv[1:]
changed = [key for key in set(os.environ) | set(IMPORTED_WITH) if key.startswith(PREFIXES)
           and key not in RUNTIME_ONLY and os.environ.get(key) != IMPORTED_WITH.get(key)]
if len(argv) < 2 or (argv[0] not in ("-m", "-c") and argv[0].startswith("-")) or changed:
    os.execv(REAL, [REAL, *argv])
connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
connection.connect(SERVER)
request = dict(argv=argv, cwd=os.getcwd(), env=dict(os.environ), new_session=False, preload_children=True)
socket.send_fds(connection, [json.dumps(request).encode() + b"\\n"], [0, 1, 2])
replies = connection.makefile("r")
pid = json.loads(replies.readline())["pid"]
for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
    signal.signal(signum, lambda signum, frame: os.kill(pid, signum))
line = replies.readline()
code = json.loads(line)["returncode"] if line else -signal.SIGKILL
if code < 0:
    signal.signal(-code, signal.SIG_DFL)
    os.kill(os.getpid(), -code)
sys.exit(code)
"""


# --- the client: what tests call --------------------------------------------------------


class Popen:
    """A `subprocess.Popen` stand-in for a Python command line (see the module docstring).

    Accepts `cwd`, `env`, `stdin`, `stdout`, `stderr` (None, a file object or descriptor,
    `subprocess.PIPE`/`DEVNULL`/`STDOUT`), `text` and `start_new_session`. Anything the fork
    server cannot run faithfully is started with `subprocess.Popen` itself.
    """

    def __new__(cls, args, **options):
        if not _forkable(args, options):
            options.pop("preload_children", None)
            return subprocess.Popen(args, **options)
        return super().__new__(cls)

    def __init__(
        self,
        args,
        *,
        cwd=None,
        env=None,
        stdin=None,
        stdout=None,
        stderr=None,
        text=False,
        start_new_session=False,
        universal_newlines=None,
        preload_children=False,
    ) -> None:
        self.args = list(args)
        self.text = bool(text or universal_newlines)
        self.returncode: int | None = None
        self.stdout = self.stderr = None
        self._captured: dict[str, Path] = {}
        opened: list[int] = []

        def descriptor(stream, name: str, default: int) -> int:
            if stream is None:
                return default
            if stream == subprocess.DEVNULL:
                fd = os.open(os.devnull, os.O_RDWR)
                opened.append(fd)
                return fd
            if stream == subprocess.PIPE and name == "stdin":
                raise ValueError("preloaded.Popen: stdin=PIPE is not supported; pass a file")
            if stream == subprocess.PIPE:  # read back after the process ends (no deadlock to manage)
                handle, path = tempfile.mkstemp(prefix=f"preloaded-{name}-")
                self._captured[name] = Path(path)
                opened.append(handle)
                return handle
            return stream if isinstance(stream, int) else stream.fileno()

        try:
            fds = [descriptor(stdin, "stdin", 0), descriptor(stdout, "stdout", 1)]
            fds.append(fds[1] if stderr == subprocess.STDOUT else descriptor(stderr, "stderr", 2))
            request = {
                "argv": self.args[1:],
                "cwd": str(cwd or os.getcwd()),
                "env": dict(os.environ if env is None else env),
                "new_session": bool(start_new_session),
                "preload_children": bool(preload_children),
            }
            self._connection = _server().connect()
            socket.send_fds(self._connection, [json.dumps(request).encode() + b"\n"], fds)
        finally:
            for fd in opened:
                os.close(fd)
        self._reader = self._connection.makefile("r")
        reply = json.loads(self._reader.readline() or "{}")
        if "pid" not in reply:
            raise RuntimeError(f"the fork server did not start {self.args!r}: {reply.get('error', 'no reply')}")
        self.pid = reply["pid"]

    def poll(self) -> int | None:
        if self.returncode is None and select.select([self._connection], [], [], 0)[0]:
            self._read_status()
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            if not select.select([self._connection], [], [], timeout)[0]:
                raise subprocess.TimeoutExpired(self.args, timeout)
            self._read_status()
        return self.returncode

    def _read_status(self) -> None:
        line = self._reader.readline()
        self.returncode = json.loads(line)["returncode"] if line else -signal.SIGKILL  # server gone
        self._reader.close()
        self._connection.close()

    def send_signal(self, signum: int) -> None:
        if self.returncode is None:
            try:
                os.kill(self.pid, signum)
            except ProcessLookupError:
                pass

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def communicate(self, input=None, timeout: float | None = None):
        if input is not None:
            raise ValueError("preloaded.Popen.communicate: `input` is not supported; pass stdin= a file")
        self.wait(timeout)
        outputs = []
        for name in ("stdout", "stderr"):
            path = self._captured.pop(name, None)
            if path is None:
                outputs.append(None)
                continue
            data = path.read_bytes()
            path.unlink()
            outputs.append(data.decode(errors="replace") if self.text else data)
        return tuple(outputs)


def run(
    args, *, capture_output: bool = False, timeout: float | None = None, check: bool = False, **options
) -> subprocess.CompletedProcess:
    """`subprocess.run` for a Python command line, through the fork server."""
    if capture_output:
        options.setdefault("stdout", subprocess.PIPE)
        options.setdefault("stderr", subprocess.PIPE)
    if not _forkable(args, options):
        options.pop("preload_children", None)
        return subprocess.run(args, timeout=timeout, check=check, **options)
    process = Popen(args, **options)
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
        raise
    completed = subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)
    if check:
        completed.check_returncode()
    return completed


def _forkable(args, options) -> bool:
    return fresh_interpreter_reason(args, **options) is None


def fresh_interpreter_reason(args, **options) -> str | None:
    """Why `args` (with Popen's `options`) gets a fresh interpreter; None: the fork server runs it."""
    args = list(args)
    if os.environ.get(FRESH) == "1":
        return f"{FRESH}=1"
    if len(args) < 2 or args[0] != sys.executable:
        return "not a command line of this Python"
    if args[1] not in ("-m", "-c") and args[1].startswith("-"):
        return f"interpreter option {args[1]}"
    unsupported = set(options) - {
        "cwd",
        "env",
        "stdin",
        "stdout",
        "stderr",
        "text",
        "start_new_session",
        "universal_newlines",
        "preload_children",
    }
    if unsupported:
        return f"Popen options {sorted(unsupported)}"
    env = options.get("env")
    changed = _import_time_differences(dict(os.environ if env is None else env), _server().env)
    return f"environment read at import differs: {sorted(changed)}" if changed else None


def _import_time_differences(env: dict, server_env: dict) -> list[str]:
    return [
        key
        for key in set(env) | set(server_env)
        if key.startswith(IMPORT_TIME_PREFIXES) and key not in RUNTIME_ONLY and env.get(key) != server_env.get(key)
    ]


class _Server:
    """This test process's fork server (started on first use, ended with the process)."""

    def __init__(self) -> None:
        self.folder = tempfile.mkdtemp(prefix="preloaded-")
        self.path = os.path.join(self.folder, "server")
        # Started without PYTHONPATH: a child's sys.path is its own first entry and PYTHONPATH
        # followed by the server's path after its first entry.
        self.env = {key: value for key, value in os.environ.items() if key not in RUNTIME_ONLY}
        self.proxy = os.path.join(self.folder, "python")
        imported_with = {key: value for key, value in self.env.items() if key.startswith(IMPORT_TIME_PREFIXES)}
        Path(self.proxy).write_text(
            PROXY.format(
                python=sys.executable,
                server=self.path,
                imported_with=json.dumps(imported_with),
                prefixes=IMPORT_TIME_PREFIXES,
                runtime_only=sorted(RUNTIME_ONLY),
            )
        )
        os.chmod(self.proxy, 0o755)
        self.process = subprocess.Popen(
            [sys.executable, __file__, self.path, self.proxy],
            env=self.env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            text=True,
        )
        printed = []  # what the imports print (DeepSpeed names its accelerator), then "ready"
        for line in self.process.stdout:
            if line.strip() == "ready":
                break
            printed.append(line)
        else:
            raise RuntimeError(f"the fork server did not start (exit {self.process.wait()}): {''.join(printed)}")

    def connect(self) -> socket.socket:
        connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        connection.connect(self.path)
        return connection

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            self.process.wait()
        for name in os.listdir(self.folder):
            os.unlink(os.path.join(self.folder, name))
        os.rmdir(self.folder)


_the_server: _Server | None = None
_server_lock = threading.Lock()


def _server() -> _Server:
    global _the_server
    with _server_lock:
        if _the_server is None or _the_server.process.poll() is not None:
            _the_server = _Server()
            import atexit

            atexit.register(_the_server.close)
        return _the_server


# --- the server: a preloaded interpreter that forks -------------------------------------


def serve(path: str, proxy: str) -> None:
    import importlib

    for name in PRELOAD:
        try:
            importlib.import_module(name)
        except ImportError:  # an optional package that is not installed
            pass
    threads = _thread_count()
    server_path = list(sys.path)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(64)
    # A child's exit wakes the loop (no polling); the timeout notices a parent that is gone.
    wake_read, wake_write = os.pipe()
    os.set_blocking(wake_write, False)
    signal.set_wakeup_fd(wake_write)
    signal.signal(signal.SIGCHLD, lambda signum, frame: None)
    parent = os.getppid()
    print("ready", flush=True)
    quiet = os.open(os.devnull, os.O_WRONLY)
    os.dup2(quiet, 1)  # nobody reads the pipe after "ready"
    os.close(quiet)
    waiting: dict[int, socket.socket | None] = {}
    while os.getppid() == parent:
        asking = [connection for connection in waiting.values() if connection is not None]
        readable = select.select([listener, wake_read, *asking], [], [], 1.0)[0]
        if wake_read in readable:
            os.read(wake_read, 512)
        for pid, connection in list(waiting.items()):
            if connection is not None and connection in readable:  # whoever asked is gone: so is the process
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                connection.close()
                waiting[pid] = None
        if listener in readable:
            connection, _ = listener.accept()
            try:
                message, fds, _, _ = socket.recv_fds(connection, 1 << 16, 3)
                while not message.endswith(b"\n"):  # a long environment comes in several reads
                    more = connection.recv(1 << 16)
                    if not more:
                        raise ValueError("the request ended early")
                    message += more
                request = json.loads(message)
            except (OSError, ValueError) as error:
                connection.close()
                print(f"preloaded: a bad request: {error}", file=sys.stderr, flush=True)
                continue
            sys.stderr.flush()
            pid = os.fork()
            if pid == 0:
                signal.set_wakeup_fd(-1)
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                for fd in (wake_read, wake_write):
                    os.close(fd)
                listener.close()
                for other in waiting.values():
                    if other is not None:
                        other.close()
                connection.close()
                _become(request, fds, threads, server_path, proxy)  # never returns
            for fd in fds:
                os.close(fd)
            connection.sendall(json.dumps({"pid": pid}).encode() + b"\n")
            waiting[pid] = connection
        while waiting:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                break
            connection = waiting.pop(pid, None)
            if connection is not None:
                try:
                    connection.sendall(json.dumps({"returncode": os.waitstatus_to_exitcode(status)}).encode() + b"\n")
                except OSError:  # the test that started it is gone
                    pass
                connection.close()


def _thread_count() -> int:
    import torch

    return torch.get_num_threads()


def _become(request: dict, fds: list[int], threads: int, server_path: list[str], proxy: str) -> None:
    """In the forked child: take the request's streams, session, directory, environment and
    arguments, run the target as the interpreter would, and exit with its status."""
    code = 1
    try:
        if request["new_session"]:
            os.setsid()
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
        for fd in set(fds):
            if fd > 2:
                os.close(fd)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        argv = request["argv"]
        first = {"-m": os.getcwd(), "-c": ""}.get(argv[0], os.path.dirname(os.path.abspath(argv[0])))
        pythonpath = [entry for entry in os.environ.get("PYTHONPATH", "").split(os.pathsep) if entry]
        sys.path[:] = [first, *pythonpath, *server_path[1:]]
        import random

        import torch

        random.seed()
        if request.get("preload_children"):
            sys.executable = proxy  # the command's own Python processes come from the server too
        wanted = os.environ.get("OMP_NUM_THREADS")
        torch.set_num_threads(int(wanted) if wanted and wanted.isdigit() else threads)
        code = _run_target(argv)
    except BaseException:  # the forking itself failed: say so on the child's stderr
        import traceback

        traceback.print_exc()
    finally:
        os._exit(code)


def _run_target(argv: list[str]) -> int:
    import runpy

    interrupted = False
    code = 0
    try:
        if argv[0] == "-m":
            sys.argv = [argv[1], *argv[2:]]
            runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
        elif argv[0] == "-c":
            import builtins
            import types

            sys.argv = ["-c", *argv[2:]]
            main = types.ModuleType("__main__")
            main.__builtins__ = builtins
            sys.modules["__main__"] = main
            exec(compile(argv[1], "<string>", "exec"), vars(main))
        else:
            sys.argv = list(argv)
            runpy.run_path(argv[0], run_name="__main__")
    except SystemExit as exit:
        code = _exit_code(exit.code)
    except KeyboardInterrupt:
        sys.excepthook(*sys.exc_info())
        interrupted, code = True, 130
    except BaseException:
        sys.excepthook(*sys.exc_info())
        code = 1
    code = _shut_down(code)
    if interrupted:  # as the interpreter does: end by the signal, so the parent sees SIGINT
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    return code


def _exit_code(value) -> int:
    if value is None:
        return 0
    if isinstance(value, int):
        return value & 0xFF
    print(value, file=sys.stderr)
    return 1


def _shut_down(code: int) -> int:
    """What the interpreter does at exit: wait for non-daemon threads, run atexit, flush."""
    import atexit

    try:
        threading._shutdown()
    except BaseException:
        pass
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            code = code or 120  # as the interpreter reports a failed flush at exit
    return code


if __name__ == "__main__":
    serve(*sys.argv[1:3])
