"""A private one-node SLURM cluster for the tests: real slurmctld, slurmd and munged daemons,
started from Debian's packages (`apt-get install slurmctld slurmd slurm-client munge`).

Everything the cluster has lives in one temporary directory: its `slurm.conf`, munge key,
munge socket, state and spool directories, pid files and logs. The client commands find it
through `SLURM_CONF` in `SlurmCluster.env` (the munge socket is named in slurm.conf's
`AuthInfo`), so nothing under /etc is read or written and two test runs, each with its own
cluster and its own free ports, can run side by side on one machine.

The node is named after the directory and has the machine's real CPUs and memory (`slurmd -C`).
Partitions: `debug` (the default) and `urgent`, a higher-priority partition on the same node
whose jobs preempt `debug` jobs by requeueing them (`PreemptType=preempt/partition_prio`,
`PreemptMode=REQUEUE`). There is no accounting (no slurmdbd): jobs are followed with
`scontrol show job`, which knows a finished job for `MinJobAge` (300 s) after it ends.

The daemons run as root (`SlurmUser=root`), as on a test machine or in CI; `unavailable()`
says why a cluster cannot start here. `stop()` (also run at interpreter exit) cancels every
job, stops the daemons and kills whatever of the cluster is still running: the daemons, any
`slurmstepd`, and job processes, found by the cluster's directory in their command line or
environment. A process that is killed before it can stop its cluster (SIGKILL, no atexit)
leaves that to a small watcher process started with the cluster, which notices its owner's end.

By hand, for a trial (as root):

    .venv/bin/python tests/helpers/slurm_cluster.py start   # prints `export SLURM_CONF=...`, Ctrl+C stops it
    .venv/bin/python tests/helpers/slurm_cluster.py cleanup # kills what clusters of a killed test run left
"""

from __future__ import annotations

import atexit
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

DAEMONS = ("munged", "mungekey", "slurmctld", "slurmd")
CLIENTS = ("sbatch", "srun", "scontrol", "scancel", "squeue", "sinfo")
# The daemons and their helper processes, as /proc/<pid>/stat names them.
DAEMON_NAMES = {b"(munged)", b"(slurmctld)", b"(slurmscriptd)", b"(slurmd)", b"(slurmstepd)"}
INSTALL = "apt-get install slurmctld slurmd slurm-client munge"
PREFIX = "sru-slurm-"
# States after which a job never runs again (a requeued job passes through PENDING instead).
FINAL_STATES = frozenset(
    {
        "COMPLETED",
        "FAILED",
        "CANCELLED",
        "TIMEOUT",
        "NODE_FAIL",
        "PREEMPTED",
        "OUT_OF_MEMORY",
        "BOOT_FAIL",
        "DEADLINE",
        "SPECIAL_EXIT",
    }
)
# Environment variables of an enclosing SLURM job or of the user's SLURM set-up, which would
# point the clients at another cluster or change what sbatch/srun ask for.
FOREIGN_ENVIRONMENT = ("SLURM_", "SBATCH_", "SRUN_", "SALLOC_", "SQUEUE_", "SINFO_", "SCANCEL_")


def find_binary(name: str) -> str | None:
    """`name` on PATH or in the sbin directories (where Debian puts the daemons)."""
    search = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/usr/local/sbin", "/sbin"])
    return shutil.which(name, path=search)


def unavailable() -> str | None:
    """Why a private cluster cannot start on this machine, or None when it can."""
    missing = [name for name in (*DAEMONS, *CLIENTS) if find_binary(name) is None]
    if "slurmctld" in missing:
        return f"slurmctld is not installed ({INSTALL})"
    if missing:
        return f"{', '.join(missing)} not installed ({INSTALL})"
    if os.geteuid() != 0:
        return "the private SLURM cluster runs its daemons as root (SlurmUser=root); run the tests as root"
    return None


def free_ports(count: int) -> list[int]:
    """`count` distinct ports that were free a moment ago (the kernel's ephemeral choice)."""
    probes = []
    try:
        for _ in range(count):
            probe = socket.socket()
            probe.bind(("127.0.0.1", 0))
            probes.append(probe)
        return [probe.getsockname()[1] for probe in probes]
    finally:
        for probe in probes:
            probe.close()


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError:
        return b""


def cluster_processes(root: str | Path, jobs_only: bool = False) -> dict[int, str]:
    """{pid: command line} of the live processes of the cluster in `root`: those whose command
    line names a file of it (the daemons, a batch script), and the daemons' helpers
    (slurmstepd, slurmscriptd) and job processes whose environment does (`SLURM_CONF`), even
    when they have left their parents. A shell that merely exported the cluster's SLURM_CONF is
    not one of them. `jobs_only`: only the jobs' own processes (no daemons, no helpers)."""
    needle, found = os.path.join(str(root), "").encode(), {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        stat = _read(Path(f"/proc/{entry}/stat"))
        if not stat or stat.rsplit(b")", 1)[-1].split()[:1] == [b"Z"]:
            continue  # gone, or a zombie (dead, waiting for its parent)
        daemon = stat.split(b" ", 2)[1] in DAEMON_NAMES
        environ = _read(Path(f"/proc/{entry}/environ"))
        job = needle in environ and b"SLURM_JOB_ID=" in environ and not daemon
        cmdline = _read(Path(f"/proc/{entry}/cmdline"))
        if job or (not jobs_only and (needle in cmdline or (daemon and needle in environ))):
            found[int(entry)] = cmdline.replace(b"\0", b" ").decode(errors="replace").strip()
    return found


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    stat = _read(Path(f"/proc/{pid}/stat"))
    return bool(stat) and stat.rsplit(b")", 1)[-1].split()[:1] != [b"Z"]


def _wait_gone(pids, timeout: float) -> list[int]:
    deadline = time.monotonic() + timeout
    while True:
        left = [pid for pid in pids if _alive(pid)]
        if not left or time.monotonic() >= deadline:
            return left
        time.sleep(0.05)


def _kill(pid: int, signum: int) -> None:
    try:
        os.kill(pid, signum)
    except ProcessLookupError:
        pass


def _tail(path: Path, lines: int = 15) -> str:
    text = _read(path).decode(errors="replace").splitlines()[-lines:]
    return "\n".join(f"    {line}" for line in text) if text else "    (empty)"


class SlurmError(RuntimeError):
    """A cluster that did not start or stop, a client command that failed, a job that did not end."""


class SlurmCluster:
    """A one-node SLURM cluster of this machine, private to the test run that starts it.

    `start()` brings it up (under a second here) and `stop()` takes it down completely; use it
    as a context manager or call both. Run the client commands with `env=cluster.env`, or
    through `sbatch`, `wait`, `job_state`, `scancel`, `run`.
    """

    def __init__(self, extra_config: dict[str, str] | None = None, keep: bool = False) -> None:
        """`extra_config`: slurm.conf settings added or replacing the defaults (e.g. {"KillWait": "5"});
        `keep`: leave the directory (logs, job output) after `stop()`."""
        self.extra_config = dict(extra_config or {})
        self.keep = keep
        self.root: Path | None = None
        self.node = ""
        self.ports: list[int] = []
        self.pids: dict[str, int] = {}
        self._scripts = 0
        self._running = False
        self._watcher: subprocess.Popen | None = None

    # --- where things are ------------------------------------------------------------

    @property
    def conf(self) -> Path:
        return self.root / "slurm.conf"

    @property
    def munge_socket(self) -> Path:
        return self.root / "run" / "munge.socket"

    @property
    def logs(self) -> dict[str, Path]:
        return {name: self.root / "log" / f"{name}.log" for name in ("munged", "slurmctld", "slurmd")}

    @property
    def env(self) -> dict[str, str]:
        """The environment for sbatch/srun/scontrol/scancel/squeue/sinfo on this cluster: the
        test's own, without any other SLURM set-up, with SLURM_CONF naming this cluster's config.
        A batch job gets it too (sbatch exports the submitting environment)."""
        env = {key: value for key, value in os.environ.items() if not key.startswith(FOREIGN_ENVIRONMENT)}
        env["SLURM_CONF"] = str(self.conf)
        return env

    # --- start and stop --------------------------------------------------------------

    def start(self, timeout: float = 30) -> SlurmCluster:
        """Start munged, slurmctld and slurmd; return once the node is idle (or raise SlurmError
        with the daemons' log tails, having stopped whatever had started)."""
        reason = unavailable()
        if reason:
            raise SlurmError(reason)
        if self._running:
            return self
        self.root = Path(self._make_root())
        self.node = "sru-" + re.sub(r"[^a-z0-9]", "-", self.root.name[len(PREFIX) :].lower())
        for name in ("munge", "run", "log", "state", "spool", "jobs"):
            (self.root / name).mkdir()
        os.chmod(self.root / "munge", 0o700)  # munged refuses a key others could read
        os.chmod(self.root / "run", 0o755)  # and a socket directory others could write
        self.ports = free_ports(2)
        self.conf.write_text(self._config())
        self._running = True
        atexit.register(self.stop)
        self._start_watcher()
        try:
            self._check(["mungekey", "--create", f"--keyfile={self.root / 'munge' / 'munge.key'}"])
            self._check(
                [
                    "munged",
                    f"--socket={self.munge_socket}",
                    f"--key-file={self.root / 'munge' / 'munge.key'}",
                    f"--pid-file={self.root / 'run' / 'munged.pid'}",
                    f"--log-file={self.logs['munged']}",
                    f"--seed-file={self.root / 'munge' / 'munged.seed'}",
                ]
            )
            self.pids["munged"] = self._pid_from_file("munged.pid", timeout)
            # Both daemonize and write their pid files; slurmctld -i: no earlier state to insist on.
            self._check(["slurmctld", "-i", "-f", str(self.conf)])
            self.pids["slurmctld"] = self._pid_from_file("slurmctld.pid", timeout)
            self._check(["slurmd", "-f", str(self.conf), "-N", self.node])
            self.pids["slurmd"] = self._pid_from_file("slurmd.pid", timeout)
            self._wait_idle(timeout)
        except BaseException as error:
            report = self._daemon_report()
            self.stop()
            if isinstance(error, SlurmError):
                raise SlurmError(f"{error}\n{report}") from None
            raise
        return self

    def stop(self) -> None:
        """Cancel every job and wait for it, stop slurmd, slurmctld and munged, kill anything of
        the cluster still running (slurmstepd, job processes); remove the directory unless `keep`.
        Safe to call twice, and when `start()` failed half way."""
        if not self._running:
            return
        self._running = False
        atexit.unregister(self.stop)
        self._stop_watcher()
        problems = []
        if self.pids.get("slurmctld") and _alive(self.pids["slurmctld"]):
            try:
                self._cancel_everything()
            except (SlurmError, subprocess.TimeoutExpired) as error:
                problems.append(f"cancelling the jobs: {error}")
            self._client(["scontrol", "shutdown"], timeout=10)
        for name in ("slurmd", "slurmctld"):
            pid = self.pids.get(name) or self._pid_from_file(f"{name}.pid", 0, required=False)
            if pid and _wait_gone([pid], 10):
                problems.append(f"{name} ignored `scontrol shutdown`; killed")
                _kill(pid, signal.SIGKILL)
        munged = self.pids.get("munged") or self._pid_from_file("munged.pid", 0, required=False)
        if munged:
            _kill(munged, signal.SIGTERM)
            if _wait_gone([munged], 5):
                _kill(munged, signal.SIGKILL)
        left = cluster_processes(str(self.root))
        if left:
            problems.append(f"left running, killed: {left}")
            for pid in left:
                _kill(pid, signal.SIGKILL)
            _wait_gone(left, 5)
        still = cluster_processes(str(self.root))
        if not self.keep and not still:
            shutil.rmtree(self.root, ignore_errors=True)
        if still:
            raise SlurmError(f"processes of the cluster in {self.root} survive SIGKILL: {still}")
        if problems:  # not an error of the test that used the cluster: said, not raised
            print(f"slurm_cluster: stopping {self.root}: " + "; ".join(problems), file=sys.stderr)

    def __enter__(self) -> SlurmCluster:
        return self.start()

    def __exit__(self, *exc_info) -> None:
        self.stop()

    # --- jobs --------------------------------------------------------------------------

    def run(self, args: list[str], timeout: float = 60, **options) -> subprocess.CompletedProcess:
        """A client command (sbatch, srun, ...) on this cluster; its output captured as text."""
        options.setdefault("env", self.env)
        return subprocess.run(args, capture_output=True, text=True, timeout=timeout, **options)

    def sbatch(self, script: str | Path, *args: str, env: dict[str, str] | None = None) -> int:
        """Submit `script` (a file, or the text of one) with sbatch's `args`; return the job id."""
        if not isinstance(script, Path) and "\n" in script:
            self._scripts += 1
            path = self.root / "jobs" / f"script-{self._scripts}.sh"
            path.write_text(script)
            script = path
        done = self._check(["sbatch", "--parsable", *args, str(script)], env=env)
        return int(done.stdout.strip().split(";")[0])

    def job(self, job_id: int) -> dict[str, str] | None:
        """`scontrol show job`'s fields of the job, or None when the controller no longer knows it."""
        done = self.run(["scontrol", "--oneliner", "show", "job", str(job_id)], timeout=15)
        if done.returncode != 0:
            if "Invalid job id" in done.stderr:
                return None
            raise SlurmError(f"scontrol show job {job_id}: {done.stderr.strip()}")
        return dict(re.findall(r"(\S+?)=(\S*)", done.stdout))

    def job_state(self, job_id: int) -> str | None:
        """The job's state (PENDING, RUNNING, COMPLETED, ...), or None when the controller no longer knows it."""
        fields = self.job(job_id)
        return None if fields is None else fields["JobState"]

    def wait(self, job_id: int, states=FINAL_STATES, timeout: float = 120, poll: float = 0.2) -> str | None:
        """Poll until the job is in one of `states` (default: ended for good) or unknown to the
        controller; return that state, or None for a job it no longer knows. Raise SlurmError
        (with the job's record and the daemons' log tails) after `timeout` seconds."""
        deadline = time.monotonic() + timeout
        while True:
            fields = self.job(job_id)
            state = None if fields is None else fields["JobState"]
            if state is None or (
                state in states
                and not (
                    state == "PREEMPTED"
                    and states is FINAL_STATES
                    and fields.get("Requeue") == fields.get("BatchFlag") == "1"
                )
            ):
                return state  # (a preempted job that will be requeued has not ended for good)
            if time.monotonic() >= deadline:
                record = self.run(["scontrol", "show", "job", str(job_id)]).stdout
                raise SlurmError(f"job {job_id} is still {state} after {timeout} s\n{record}\n{self._daemon_report()}")
            time.sleep(poll)

    def scancel(self, job_id: int, *args: str) -> None:
        self._check(["scancel", *args, str(job_id)])

    def jobs(self) -> list[int]:
        """Ids of the jobs squeue lists (pending, running, completing, requeued)."""
        out = self._check(["squeue", "--noheader", "--format=%i"]).stdout
        return [int(line.split("_")[0]) for line in out.split()]

    # --- inside ------------------------------------------------------------------------

    def _start_watcher(self) -> None:
        """A small process that cleans up after this one if it dies without `stop()` (killed:
        no atexit), holding the read end of a pipe only this process writes to."""
        (self.root / "owner").write_text(str(os.getpid()))
        self._watcher = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), "watch", str(self.root), *(["--keep"] if self.keep else [])],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            start_new_session=True,
        )

    def _stop_watcher(self) -> None:
        if self._watcher is None:
            return
        try:
            self._watcher.stdin.write(b"stopped\n")
            self._watcher.stdin.close()
        except OSError:
            pass
        try:
            self._watcher.wait(10)
        except subprocess.TimeoutExpired:
            self._watcher.kill()
            self._watcher.wait()
        self._watcher = None

    @staticmethod
    def _make_root() -> str:
        parent = tempfile.gettempdir()
        if len(parent) > 60:  # keep the munge socket's path far below the 107 bytes a socket may have
            parent = "/tmp"
        root = tempfile.mkdtemp(prefix=PREFIX, dir=parent)
        os.chmod(root, 0o755)  # munged checks every directory above its socket and key
        return root

    def _config(self) -> str:
        hardware = self._hardware()
        settings = {
            "ClusterName": "srutest",
            "SlurmctldHost": "localhost(127.0.0.1)",
            "SlurmctldPort": str(self.ports[0]),
            "SlurmdPort": str(self.ports[1]),
            "SlurmUser": "root",
            "SlurmdUser": "root",
            "AuthType": "auth/munge",
            # A requeued job may run again cred_expire + 1 s after it stopped (the default is 120 s).
            # 5 is the least that works: below it, slurmd never starts the requeued job again.
            "AuthInfo": f"socket={self.munge_socket},cred_expire=5",
            "CredType": "cred/munge",
            "StateSaveLocation": str(self.root / "state"),
            "SlurmdSpoolDir": str(self.root / "spool"),
            "SlurmctldPidFile": str(self.root / "run" / "slurmctld.pid"),
            "SlurmdPidFile": str(self.root / "run" / "slurmd.pid"),
            "SlurmctldLogFile": str(self.logs["slurmctld"]),
            "SlurmdLogFile": str(self.logs["slurmd"]),
            "SlurmctldDebug": "info",
            "SlurmdDebug": "info",
            "PlugStackConfig": str(self.root / "plugstack.conf"),
            # No systemd and no cgroups here: processes are tracked through /proc, nothing is bound.
            "ProctrackType": "proctrack/linuxproc",
            "TaskPlugin": "task/none",
            "JobAcctGatherType": "jobacct_gather/none",
            "AccountingStorageType": "accounting_storage/none",
            "JobCompType": "jobcomp/none",
            "MpiDefault": "none",
            "SelectType": "select/cons_tres",
            "SelectTypeParameters": "CR_Core",  # cores are allocated, memory is not
            "SchedulerParameters": "sched_interval=1,bf_interval=1",  # a batch job starts within about a second
            "ReturnToService": "2",
            "JobRequeue": "1",
            "PreemptType": "preempt/partition_prio",
            "PreemptMode": "REQUEUE",
            "MailProg": "/bin/true",
        }
        settings.update(self.extra_config)
        lines = [f"# A private test cluster (tests/helpers/slurm_cluster.py), directory {self.root}"]
        lines += [f"{key}={value}" for key, value in settings.items()]
        lines.append(f"NodeName={self.node} NodeAddr=127.0.0.1 NodeHostname=localhost {hardware} State=UNKNOWN")
        lines.append(f"PartitionName=debug Nodes={self.node} Default=YES MaxTime=INFINITE State=UP PriorityTier=1")
        lines.append(f"PartitionName=urgent Nodes={self.node} MaxTime=INFINITE State=UP PriorityTier=2")
        (self.root / "plugstack.conf").write_text("")  # not the system's /etc/slurm/plugstack.conf
        return "\n".join(lines) + "\n"

    def _hardware(self) -> str:
        """This machine as `slurmd -C` sees it: CPUs, boards, sockets, cores, threads, memory."""
        out = self._check(["slurmd", "-C"], env={"PATH": os.environ.get("PATH", "")}).stdout
        first = out.splitlines()[0]
        fields = dict(re.findall(r"(\w+)=(\S+)", first))
        names = ("CPUs", "Boards", "SocketsPerBoard", "CoresPerSocket", "ThreadsPerCore", "RealMemory")
        if not all(name in fields for name in names):
            raise SlurmError(f"`slurmd -C` printed no hardware description: {out!r}")
        return " ".join(f"{name}={fields[name]}" for name in names)

    def _check(self, args: list[str], env: dict[str, str] | None = None, timeout: float = 30):
        binary = find_binary(args[0])
        if binary is None:
            raise SlurmError(f"{args[0]} is not installed ({INSTALL})")
        done = subprocess.run(
            [binary, *args[1:]],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=self.env if env is None else env,
            stdin=subprocess.DEVNULL,
        )
        if done.returncode != 0:
            raise SlurmError(
                f"`{' '.join(args)}` exited with {done.returncode}: {(done.stderr or done.stdout).strip()}"
            )
        return done

    def _client(self, args: list[str], timeout: float = 30) -> None:
        """A client command whose failure stop() can live with."""
        try:
            self._check(args, timeout=timeout)
        except (SlurmError, subprocess.TimeoutExpired):
            pass

    def _pid_from_file(self, name: str, timeout: float, required: bool = True) -> int | None:
        path = self.root / "run" / name
        deadline = time.monotonic() + timeout
        while True:
            text = _read(path).decode().strip()
            if text.isdigit() and _alive(int(text)):
                return int(text)
            if time.monotonic() >= deadline:
                if required:
                    raise SlurmError(f"{name.split('.')[0]} did not start (no live pid in {path})")
                return None
            time.sleep(0.02)

    def _wait_idle(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        state = "no answer"
        while time.monotonic() < deadline:
            for name, pid in self.pids.items():
                if not _alive(pid):
                    raise SlurmError(f"{name} (pid {pid}) exited while the cluster started")
            done = self.run(["scontrol", "--oneliner", "show", "node", self.node], timeout=10)
            if done.returncode == 0:
                state = dict(re.findall(r"(\S+?)=(\S*)", done.stdout)).get("State", "?")
                if state == "IDLE":
                    return
            else:
                state = done.stderr.strip() or state
            time.sleep(0.05)
        raise SlurmError(f"node {self.node} is not idle after {timeout} s (last: {state})")

    def _cancel_everything(self) -> None:
        jobs = [str(job) for job in self.jobs()]
        if not jobs:
            return
        self._client(["scancel", *jobs])  # pending jobs go; running ones get SIGTERM
        deadline = time.monotonic() + 2
        while self.jobs() and time.monotonic() < deadline:
            time.sleep(0.05)
        if self.jobs():
            # No grace at teardown: slurmd would wait KillWait (30 s) before its SIGKILL to a job
            # that ignores SIGTERM (`scancel --signal=KILL` too), so the jobs' processes are
            # killed here and slurmstepd, seeing them gone, ends each job.
            for pid in cluster_processes(self.root, jobs_only=True):
                _kill(pid, signal.SIGKILL)
            deadline = time.monotonic() + 30
            while self.jobs() and time.monotonic() < deadline:
                time.sleep(0.05)
        if self.jobs():
            raise SlurmError(f"jobs {self.jobs()} still listed 30 s after scancel and SIGKILL")

    def _daemon_report(self) -> str:
        if self.root is None:
            return ""
        return "\n".join(f"  {name} log ({path}):\n{_tail(path)}" for name, path in self.logs.items())


def cleanup(directories: list[str], keep: bool = False) -> int:
    """Kill every process of the clusters in `directories` and remove the directories (unless
    `keep`). Without directories: every cluster directory in the temporary directory whose
    owner (the process that started it) is gone, the clusters of a test run that was killed."""
    if not directories:
        directories = []
        for parent in {tempfile.gettempdir(), "/tmp"}:
            for path in Path(parent).glob(f"{PREFIX}*"):
                owner = _read(path / "owner").decode().strip()
                if not (owner.isdigit() and _alive(int(owner))):
                    directories.append(str(path))
    for directory in directories:
        left = cluster_processes(directory)
        for pid, command in left.items():
            print(f"killing {pid}: {command}")
            _kill(pid, signal.SIGKILL)
        _wait_gone(left, 5)
        if not keep:
            shutil.rmtree(directory, ignore_errors=True)
            print(f"removed {directory}")
    return 0


def watch(directory: str, keep: bool) -> int:
    """Wait for the owner of the cluster in `directory` to say it stopped the cluster; when
    its pipe ends without that (the owner was killed), clean up after it."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the owner's Ctrl+C is the owner's to handle
    if sys.stdin.buffer.read() != b"stopped\n":
        cleanup([directory], keep=keep)
    return 0


def main(argv: list[str]) -> int:
    if argv[:1] == ["cleanup"]:
        return cleanup(argv[1:])
    if argv[:1] == ["watch"]:
        return watch(argv[1], keep="--keep" in argv)
    if argv[:1] != ["start"]:
        print(__doc__.split("By hand", 1)[1].strip(": \n"))
        return 2
    with SlurmCluster(keep="--keep" in argv) as cluster:
        print(f"cluster {cluster.root}: node {cluster.node}, ports {cluster.ports}, partitions debug (default), urgent")
        print(f"export SLURM_CONF={cluster.conf}")
        print("Ctrl+C stops it (cancelling every job).", flush=True)
        try:
            signal.signal(signal.SIGINT, signal.default_int_handler)  # even when started in the background
            signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
            while True:
                time.sleep(3600)
        except KeyboardInterrupt:
            pass
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
