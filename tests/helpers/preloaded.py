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

Guardrails (each answered with a real interpreter, the reason in `fresh_interpreter_reason`):
- the server forks only while it has one thread, counted in /proc/self/task right before
  each fork (a thread that held a lock at the fork leaves it held in the child for good). It
  imports with OPENBLAS_NUM_THREADS=1, since numpy's and scipy's OpenBLAS otherwise start
  their thread pools as they load; each child then sets the BLAS thread count its own
  environment asks for, as a fresh interpreter's OpenBLAS would.
- no CUDA in a forked child: not for a test marked `cuda` (tests/conftest.py tells this
  module which test is running) nor for an environment that makes a GPU visible
  (CUDA_VISIBLE_DEVICES other than empty or -1).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import select
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

try:
    from helpers.preloaded_proxy import IMPORT_TIME_PREFIXES, RUNTIME_ONLY, fresh_reason
except ImportError:  # run as the server's script: this folder is sys.path[0], `helpers` is not importable
    from preloaded_proxy import IMPORT_TIME_PREFIXES, RUNTIME_ONLY, fresh_reason

PRELOAD = ("torch", "torch._dynamo", "lightning.pytorch", "hydra", "omegaconf", "torchmetrics", "deepspeed")
FRESH = "SRU_LIGHTNING_TEST_FRESH_INTERPRETERS"
# The `sys.executable` of children started with preload_children=True (see that file).
PROXY_SOURCE = Path(__file__).with_name("preloaded_proxy.py")
# OpenBLAS's thread-count setting, under the names numpy's and scipy's builds export it by.
OPENBLAS_SETTERS = tuple(
    f"{prefix}openblas_set_num_threads{suffix}" for prefix in ("", "scipy_") for suffix in ("", "64_")
)

# The pytest item whose setup, call or teardown is running (set by tests/conftest.py through
# `running`): its markers decide, too, whether a process may be forked.
_running_test = None


@contextlib.contextmanager
def running(item):
    """While `item` (a pytest item) runs, processes are started as its markers require."""
    global _running_test
    previous, _running_test = _running_test, item
    try:
        yield
    finally:
        _running_test = previous


# --- the client: what tests call --------------------------------------------------------


class Popen:
    """A `subprocess.Popen` stand-in for a Python command line (see the module docstring).

    Accepts `cwd`, `env`, `stdin`, `stdout`, `stderr` (None, a file object or descriptor,
    `subprocess.PIPE`/`DEVNULL`/`STDOUT`), `text` and `start_new_session`. Anything the fork
    server cannot run faithfully, or refuses to fork, is started with `subprocess.Popen`
    itself; either way the process's `fresh_interpreter_reason` says why it is a real
    interpreter (None: forked).
    """

    fresh_interpreter_reason: str | None = None

    def __new__(cls, args, **options):
        reason = fresh_interpreter_reason(args, **options)
        if reason is None:
            process = super().__new__(cls)
            reason = process._start(args, **options)
            if reason is None:
                return process
        options.pop("preload_children", None)
        fresh = subprocess.Popen(args, **options)
        fresh.fresh_interpreter_reason = reason
        return fresh

    def __init__(self, args, **options) -> None:
        pass  # started by __new__, which returns a subprocess.Popen where the server does not fork

    def _start(
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
    ) -> str | None:
        """Ask the server for the process: None once it runs, else why the server would not fork."""
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
        if "fresh" in reply:  # the server did not fork: the caller starts a real interpreter instead
            self._reader.close()
            self._connection.close()
            for path in self._captured.values():
                path.unlink()
            return reply["fresh"]
        if "pid" not in reply:
            raise RuntimeError(f"the fork server did not start {self.args!r}: {reply.get('error', 'no reply')}")
        self.pid = reply["pid"]
        return None

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
    """`subprocess.run` for a Python command line, through the fork server. The result's
    `fresh_interpreter_reason` says why the process was a real interpreter (None: forked)."""
    if capture_output:
        options.setdefault("stdout", subprocess.PIPE)
        options.setdefault("stderr", subprocess.PIPE)
    reason = fresh_interpreter_reason(args, **options)
    if reason is not None:
        options.pop("preload_children", None)
        completed = subprocess.run(args, timeout=timeout, check=check, **options)
        completed.fresh_interpreter_reason = reason
        return completed
    process = Popen(args, **options)  # a subprocess.Popen if the server refuses to fork
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
        raise
    completed = subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)
    completed.fresh_interpreter_reason = process.fresh_interpreter_reason
    if check:
        completed.check_returncode()
    return completed


def fresh_interpreter_reason(args, **options) -> str | None:
    """Why `args` (with Popen's `options`) gets a fresh interpreter; None: the fork server is
    asked for it (and still refuses to fork while it has more than one thread)."""
    args = list(args)
    if os.environ.get(FRESH) == "1":
        return f"{FRESH}=1"
    if _running_test is not None and _running_test.get_closest_marker("cuda") is not None:
        return "the test is marked cuda"
    if not args or args[0] != sys.executable:
        return "not a command line of this Python"
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
    return fresh_reason(args[1:], dict(os.environ if env is None else env), _server().env)


class _Server:
    """A fork server (this test process's own is started on first use and ended with the
    process). `preload`: the modules it imports; `env`: its environment (default: this
    process's, less what is read only at run time)."""

    def __init__(self, preload: tuple[str, ...] = PRELOAD, env: dict[str, str] | None = None) -> None:
        self.folder = tempfile.mkdtemp(prefix="preloaded-")
        self.path = os.path.join(self.folder, "server")
        # Started without PYTHONPATH: a child's sys.path is its own first entry and PYTHONPATH
        # followed by the server's path after its first entry.
        if env is None:
            env = {key: value for key, value in os.environ.items() if key not in RUNTIME_ONLY}
        self.env = dict(env)
        self.proxy = install_proxy(self.folder, self.path, self.env)
        self.process = subprocess.Popen(
            [sys.executable, __file__, self.path, self.proxy, *preload],
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
        self.process.stdout.close()
        for name in os.listdir(self.folder):
            os.unlink(os.path.join(self.folder, name))
        os.rmdir(self.folder)


def install_proxy(folder: str, server: str, server_env: dict[str, str]) -> str:
    """Write the proxy for the server at socket `server`, which imported with `server_env`,
    into `folder`: a copy of preloaded_proxy.py run without `site`, its settings beside it."""
    imported_with = {key: value for key, value in server_env.items() if key.startswith(IMPORT_TIME_PREFIXES)}
    settings = {"python": sys.executable, "server": server, "imported_with": imported_with}
    Path(folder, "proxy.json").write_text(json.dumps(settings))
    proxy = os.path.join(folder, "python")
    Path(proxy).write_text(f"#!{sys.executable} -S\n" + PROXY_SOURCE.read_text())
    os.chmod(proxy, 0o755)
    return proxy


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


def serve(path: str, proxy: str, preload: list[str]) -> None:
    import importlib

    # OpenBLAS (numpy's and scipy's copies) starts a pool of threads as it loads unless told
    # to use one; each child sets the count its own environment asks for (_become).
    os.environ["OPENBLAS_NUM_THREADS"] = "1"
    for name in preload:
        try:
            importlib.import_module(name)
        except ImportError:  # an optional package that is not installed
            pass
    threads = _torch_threads()
    blas = _openblas_setters()
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
            refusal = _fork_refusal()
            if refusal is not None:  # the client starts a real interpreter instead
                for fd in fds:
                    os.close(fd)
                with contextlib.suppress(OSError):
                    connection.sendall(json.dumps({"fresh": refusal}).encode() + b"\n")
                connection.close()
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
                _become(request, fds, threads, blas, server_path, proxy)  # never returns
            for fd in fds:
                os.close(fd)
            _note_fork(request)
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


#: A file each server appends one line to per forked process (its command line), so what the
#: server saves can be measured: `SRU_LIGHTNING_TEST_FORK_LOG=/tmp/forks.txt make test`, then
#: the line count times what a fresh interpreter spends on the preloaded imports.
FORK_LOG = "SRU_LIGHTNING_TEST_FORK_LOG"


def _note_fork(request: dict) -> None:
    path = os.environ.get(FORK_LOG)
    if path:
        with open(path, "a", encoding="utf-8") as log:
            log.write(json.dumps(request.get("argv", [])[:3]) + "\n")


def _fork_refusal() -> str | None:
    """Why the server must not fork now; None when it has a single thread. A thread that
    holds a lock (malloc's, the import lock, a library's) when the process forks leaves that
    lock held in the child, where nothing will ever release it."""
    try:
        threads = len(os.listdir("/proc/self/task"))
    except OSError:
        return "the fork server cannot count its threads (no /proc/self/task)"
    return f"the fork server has {threads} threads: a child forked from it could deadlock" if threads > 1 else None


def _torch_threads() -> int | None:
    """torch's intra-op thread count for a child whose environment does not set one (None:
    torch is not preloaded, and a child that imports it reads its environment itself)."""
    if "torch" not in sys.modules:
        return None
    import torch

    return torch.get_num_threads()  # reads the OpenMP setting; starts no thread


def _openblas_setters() -> list:
    """`openblas_set_num_threads` of every OpenBLAS loaded in this process (found through
    /proc/self/maps, whatever the name numpy or scipy bundle it under)."""
    import ctypes

    libraries = set()
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                fields = line.split(maxsplit=5)
                if len(fields) == 6 and "openblas" in os.path.basename(fields[5].strip()).lower():
                    libraries.add(fields[5].strip())
    except OSError:
        return []
    setters = []
    for library in sorted(libraries):
        try:
            handle = ctypes.CDLL(library, mode=os.RTLD_NOLOAD | os.RTLD_LAZY)
        except OSError:
            continue
        for name in OPENBLAS_SETTERS:
            setter = getattr(handle, name, None)
            if setter is not None:
                setter.argtypes, setter.restype = [ctypes.c_int], None
                setters.append(setter)
                break
    return setters


def _blas_threads(env: dict[str, str]) -> int:
    """The thread count OpenBLAS picks as it loads in a process with `env`: the first of
    OPENBLAS_NUM_THREADS, GOTO_NUM_THREADS, OMP_NUM_THREADS that holds a positive number (read as
    C's atoi does), else the usable CPUs; never more than the usable CPUs."""
    cpus = len(os.sched_getaffinity(0))
    for key in ("OPENBLAS_NUM_THREADS", "GOTO_NUM_THREADS", "OMP_NUM_THREADS"):
        digits = re.match(r"\s*\+?(\d+)", env.get(key, ""))
        if digits and int(digits.group(1)) > 0:
            return min(int(digits.group(1)), cpus)
    return cpus


def _become(request: dict, fds: list[int], threads: int | None, blas: list, server_path: list[str], proxy: str) -> None:
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

        random.seed()
        if request.get("preload_children"):
            sys.executable = proxy  # the command's own Python processes come from the server too
        if threads is not None:
            import torch

            wanted = os.environ.get("OMP_NUM_THREADS")
            torch.set_num_threads(int(wanted) if wanted and wanted.isdigit() else threads)
        if blas:  # the server's OpenBLAS runs one thread; a fresh interpreter's would run this many
            wanted_blas = _blas_threads(os.environ)
            for setter in blas:
                setter(wanted_blas)
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
    serve(sys.argv[1], sys.argv[2], sys.argv[3:])
