"""Python processes for the tests, forked from a server that has imported torch, Lightning,
DeepSpeed and Hydra once (a fresh interpreter spends about 5 CPU-seconds on those imports).

`Popen` and `run` are `subprocess.Popen` and `subprocess.run` whose Python command lines this
test process's fork server runs (docs/testing.md, "Processes the tests start", says what a
forked process keeps and what differs). Where a real interpreter runs one instead, the
process's `fresh_interpreter_reason` says why (None: forked): SRU_LIGHTNING_TEST_FRESH_INTERPRETERS=1;
another executable, an interpreter option or a Popen option that changes how a process starts;
an environment that changes what the imports read; a process that might use CUDA (in a test
marked `cuda`, or with a GPU visible); a server with more than one thread (a lock another thread
holds at a fork stays held in the child for good).
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import gc
import importlib
import json
import os
import random
import re
import runpy
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import types

PRELOAD = ("torch", "torch._dynamo", "lightning.pytorch", "hydra", "omegaconf", "torchmetrics", "deepspeed")
FRESH = "SRU_LIGHTNING_TEST_FRESH_INTERPRETERS"
IMPORT_TIME = ("PYTHON", "LD_", "TORCH", "OMP_", "MKL_", "KMP_", "CUDA", "DS_ACCELERATOR")
# Read as a process runs, not at import (torch.compile sets the TORCH*/KMP_ ones, joblib's import KMP_INIT_AT_FORK).
RUNTIME_ONLY = {"PYTHONPATH", "OMP_NUM_THREADS", "TORCH_EXTENSIONS_DIR", "TORCHINDUCTOR_CACHE_DIR", "TORCH_WARM_POOL"}
RUNTIME_ONLY |= {"KMP_DUPLICATE_LIB_OK", "KMP_INIT_AT_FORK"}
running_test = None  # the pytest item whose setup, call or teardown runs (tests/conftest.py sets it)
_the_server = None
_server_lock = threading.Lock()


def fresh_reason(argv: list[str], env: dict[str, str], server_env: dict[str, str]) -> str | None:
    """Why `python *argv` with `env` needs a real interpreter rather than a child of a server
    that imported with `server_env` (None: it can be forked). The client and the proxy ask it."""
    if not argv or argv[0][:1] in ("-", "") and (argv[0] not in ("-m", "-c") or len(argv) < 2):
        return f"an interpreter option or no command: {argv[:1]}"
    devices = env.get("CUDA_VISIBLE_DEVICES")
    if devices is not None and devices.strip() not in ("", "-1"):
        return f"the environment asks for CUDA (CUDA_VISIBLE_DEVICES={devices})"
    read = {key for key in {*env, *server_env} if key.startswith(IMPORT_TIME) and key not in RUNTIME_ONLY}
    changed = sorted(key for key in read if env.get(key) != server_env.get(key))
    return f"environment read at import differs: {changed}" if changed else None


def fresh_interpreter_reason(args, env=None) -> str | None:
    """Why `args` with `env` gets a fresh interpreter; None: the server is asked to fork it."""
    if os.environ.get(FRESH) == "1":
        return f"{FRESH}=1"
    if running_test is not None and running_test.get_closest_marker("cuda") is not None:
        return "the test is marked cuda"
    if isinstance(args, (str, bytes)) or not args or args[0] != sys.executable:
        return "not a command line of this Python"
    return fresh_reason(list(map(os.fsdecode, args[1:])), dict(os.environ if env is None else env), _server().env)


def _ask(path: str, request: dict, fds: list[int]):
    """Send the server a request and stdin, stdout, stderr: (a reader for the wait status, pid) or a refusal."""
    with socket.socket(socket.AF_UNIX) as connection:
        connection.connect(path)
        socket.send_fds(connection, [b"\n"], fds)
        connection.sendall(json.dumps(request).encode() + b"\n")
        reader = connection.makefile("r")  # keeps the connection open
    reply = reader.readline().strip()
    if reply.isdigit():
        return reader, int(reply)
    reader.close()
    return reply or "the fork server did not answer"


class Popen(subprocess.Popen):
    """`subprocess.Popen`, forked by the server where it can be. `preload_children=True`: its `sys.executable`
    is a proxy asking the server, by the same rules, for the Python processes it starts (Lightning's ranks)."""

    def __init__(self, args, *, preload_children: bool = False, **options) -> None:
        self.preload_children, self.fresh_interpreter_reason = preload_children, None
        super().__init__(args, **options)

    def _execute_child(self, args, executable, preexec_fn, close_fds, pass_fds, cwd, env, startupinfo, creationflags,
                       shell, p2cread, p2cwrite, c2pread, c2pwrite, errread, errwrite, *rest):  # fmt: skip
        restore_signals, gid, gids, uid, umask, new_session, *group = rest  # process_group: Python 3.11+
        special = shell or executable or preexec_fn or pass_fds or not close_fds or umask != -1
        special = special or (gid, gids, uid) != (None,) * 3 or group not in ([], [-1])
        reason = self.fresh_interpreter_reason = "Popen options" if special else fresh_interpreter_reason(args, env)
        if reason is None:
            env = dict(os.environ if env is None else env)
            request = dict(argv=list(map(os.fsdecode, args[1:])), cwd=os.path.abspath(cwd or "."), env=env,
                           new_session=new_session, preload_children=self.preload_children)  # fmt: skip
            fds = [p2cread, c2pwrite, errwrite]
            asked = _ask(_server().path, request, [fd if fd != -1 else n for n, fd in enumerate(fds)])
            if not isinstance(asked, str):
                (self._reader, self.pid), self._child_created = asked, True
                return self._close_pipe_fds(p2cread, p2cwrite, c2pread, c2pwrite, errread, errwrite)
            self.fresh_interpreter_reason = asked  # refused: a real interpreter runs it
        super()._execute_child(args, executable, preexec_fn, close_fds, pass_fds, cwd, env, startupinfo, creationflags,
                               shell, p2cread, p2cwrite, c2pread, c2pwrite, errread, errwrite, *rest)  # fmt: skip

    # subprocess waits through os.waitpid; a forked process's wait status comes from the server.
    def _internal_poll(self, _deadstate=None, **_):
        return super()._internal_poll(_deadstate, _waitpid=self._waitpid)

    def _try_wait(self, wait_flags):
        return self._waitpid(self.pid, wait_flags)

    def _waitpid(self, pid: int, flags: int) -> tuple[int, int]:
        if self.fresh_interpreter_reason is not None:
            return os.waitpid(pid, flags)
        if flags & os.WNOHANG and not select.select([self._reader], [], [], 0)[0]:
            return 0, 0
        line = self._reader.readline()
        self._reader.close()
        return pid, int(line) if line.strip() else signal.SIGKILL  # no status: the server is gone


def run(args, *, capture_output=False, timeout=None, check=False, **options) -> subprocess.CompletedProcess:
    """`subprocess.run` (without `input`) with `Popen`; `fresh_interpreter_reason` as the process's."""
    if capture_output:
        options.update(stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    with Popen(args, **options) as process:
        try:
            stdout, stderr = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.communicate()
            raise
    completed = subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)
    completed.fresh_interpreter_reason = process.fresh_interpreter_reason
    if check:
        completed.check_returncode()
    return completed


class _Server:
    """A fork server importing `preload` with `env` (default: this process's environment less RUNTIME_ONLY)."""

    def __init__(self, preload: tuple[str, ...] = PRELOAD, env: dict[str, str] | None = None) -> None:
        self.env = {k: v for k, v in os.environ.items() if k not in RUNTIME_ONLY} if env is None else dict(env)
        self.folder = tempfile.mkdtemp(prefix="preloaded-")
        self.path, self.proxy = os.path.join(self.folder, "server"), os.path.join(self.folder, "python")
        with open(self.proxy, "w") as proxy:  # without `site`: quick to start
            proxy.write(f"#!{sys.executable} -S\nimport sys\nsys.path.insert(0, {os.path.dirname(__file__)!r})\n")
            proxy.write("import preloaded\n")
            proxy.write(f"preloaded.proxy({self.path!r}, {sys.executable!r}, {self.env!r})\n")
        os.chmod(self.proxy, 0o755)
        # It takes the connections once it has imported; its stdin stays open while this process lives.
        with socket.socket(socket.AF_UNIX) as listener:
            listener.bind(self.path)
            listener.listen(64)
            command = [sys.executable, os.path.abspath(__file__), str(listener.fileno()), self.proxy, *preload]
            options = dict(stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, pass_fds=[listener.fileno()])
            self.process = subprocess.Popen(command, env=self.env, **options)

    def close(self) -> None:
        with self.process:  # closes its stdin, waits
            self.process.terminate()
        shutil.rmtree(self.folder, ignore_errors=True)


def _server() -> _Server:
    global _the_server
    with _server_lock:
        if _the_server is None or _the_server.process.poll() is not None:
            _the_server = _Server()
            atexit.register(_the_server.close)
        return _the_server


def proxy(path: str, python: str, server_env: dict[str, str]) -> None:
    """The `sys.executable` of a process started with preload_children=True (see the top)."""
    argv, env = sys.argv[1:], dict(os.environ)
    request = dict(argv=argv, cwd=os.getcwd(), env=env, new_session=False, preload_children=True)
    asked = fresh_reason(argv, env, server_env) or _ask(path, request, [0, 1, 2])
    if isinstance(asked, str):
        os.execv(python, [python, *argv])
    reader, pid = asked
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, lambda signum, frame: os.kill(pid, signum))
    code = os.waitstatus_to_exitcode(int(reader.readline() or signal.SIGKILL))
    if code < 0:  # end as it did: by its signal
        signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    sys.exit(code)


def serve(listener: socket.socket, preload: list[str]) -> tuple[dict, list[int]]:
    """Import `preload`, then fork a process for each request on `listener`. Returns in a
    forked process only: its request and stdin, stdout, stderr."""
    os.environ["OPENBLAS_NUM_THREADS"] = "1"  # else numpy's and scipy's OpenBLAS start threads
    for name in preload:
        with contextlib.suppress(ImportError):  # an optional package that is not installed
            importlib.import_module(name)
    torch_threads = sys.modules["torch"].get_num_threads() if "torch" in sys.modules else None  # starts none
    gc.freeze()  # the imports' objects: a child's collections (at exit too) pass them by, as they do not change
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the kernel reaps the waiters it forks
    while 0 not in select.select([0, listener], [], [])[0]:  # until stdin ends: the test process is gone
        connection, fds = listener.accept()[0], []
        with connection:
            try:
                fds = socket.recv_fds(connection, 1, 3)[1]
                request = json.loads(connection.makefile("rb").readline())
                threads = len(os.listdir("/proc/self/task"))
                if threads > 1:  # refused: the client starts a real interpreter
                    connection.sendall(b"the fork server has %d threads: a fork could deadlock\n" % threads)
                elif os.fork() == 0:
                    listener.close()
                    _wait_for(connection, fds)  # returns in the forked process only
                    return {**request, "torch_threads": torch_threads}, fds
            except (OSError, ValueError):
                pass  # whoever asked is gone
            for fd in fds:
                os.close(fd)
    sys.exit()


def _wait_for(connection: socket.socket, fds: list[int]) -> None:
    """A waiter forked for one request: forks the process (returning there), sends its pid, then its wait status."""
    pid = -1
    try:
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        pid = os.fork()
        if pid:
            for fd in fds:
                os.close(fd)
            connection.sendall(b"%d\n" % pid)
            connection.sendall(b"%d\n" % os.waitpid(pid, 0)[1])
    finally:
        if pid:
            os._exit(0)


if __name__ == "__main__":  # the server; what follows runs in a forked process, as `python *argv` would
    request, fds = serve(socket.socket(fileno=int(sys.argv[1])), sys.argv[3:])
    # Take the request's session, streams, directory, environment, `sys.path` (its own first entry and
    # PYTHONPATH, then the server's, which imported without PYTHONPATH) and thread counts.
    if request["new_session"]:
        os.setsid()
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    argv, code = request["argv"], 0
    first = {"-m": os.getcwd(), "-c": ""}.get(argv[0], os.path.dirname(os.path.abspath(argv[0])))
    sys.path[:] = [first, *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep)), *sys.path[1:]]
    random.seed()
    if request["preload_children"]:
        sys.executable = sys.argv[2]
    if request["torch_threads"] is not None:  # the server's OpenMP read the server's environment
        wanted = os.environ.get("OMP_NUM_THREADS", "")
        sys.modules["torch"].set_num_threads(int(wanted) if wanted.isdigit() else request["torch_threads"])
    # Each OpenBLAS loaded runs one thread (see serve): give it the count a fresh one picks.
    counts = [re.match(r"\s*\+?(\d+)", os.environ.get(f"{key}_NUM_THREADS", "")) for key in ("OPENBLAS", "GOTO", "OMP")]
    blas = min([int(count[1]) for count in counts if count and int(count[1]) > 0][:1] + [len(os.sched_getaffinity(0))])
    with open("/proc/self/maps") as maps:
        found = {line.split()[-1] for line in maps if "openblas" in line.rsplit("/", 1)[-1].lower()}
    names = [f"{prefix}openblas_set_num_threads{suffix}" for prefix in ("", "scipy_") for suffix in ("", "64_")]
    for setter in [getattr(lib, name) for lib in map(ctypes.CDLL, found) for name in names if hasattr(lib, name)]:
        setter(blas)
    try:
        if argv[0] == "-m":
            sys.argv = argv[1:]
            runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
        elif argv[0] == "-c":
            sys.argv = ["-c", *argv[2:]]
            sys.modules["__main__"] = main = types.ModuleType("__main__")
            exec(compile(argv[1], "<string>", "exec"), vars(main))
        else:
            sys.argv = argv
            runpy.run_path(argv[0], run_name="__main__")
    except SystemExit as stop:  # None is 0, a number the status; anything else is printed, and 1
        code = stop.code or 0 if isinstance(stop.code, int | None) else print(stop.code, file=sys.stderr) or 1
    except BaseException as error:  # a KeyboardInterrupt ends the process by SIGINT
        sys.excepthook(type(error), error, error.__traceback__)
        code = -signal.SIGINT if isinstance(error, KeyboardInterrupt) else 1
    # The interpreter's exit, less tearing down its objects (a CPU-second and more after these imports):
    threading._shutdown()  # waits for the threads that are not daemons
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            code = code or 120
    if code == -signal.SIGINT:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    os._exit(code & 0xFF)
