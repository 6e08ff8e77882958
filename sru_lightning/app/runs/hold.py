"""One run per folder: the process that trains into a run directory holds it until it ends.

`fit`, `validate` and `test` take their output folder (a sweep: its sweep folder) before Hydra
writes anything into it (:class:`~.directories.RunDirectoryGuard`) and keep it to the end; a
second command into a held folder is refused in one line naming the holder, exit status 2.

The hold is a small JSON file in the folder (:attr:`RunFolder.HOLD_FILE <.folder.RunFolder>`),
made by writing the record to a file of the process's own and hard-linking it to the hold's
name: `link(2)` either creates the name or fails because it exists, atomically on local file
systems and on NFS alike, where `flock` may be advisory, emulated per host or missing. The
holder removes the file when it ends, also after an error or Ctrl+C.

Whether a hold found in a folder still holds it:

1. the same process (a second command in one Python process): it is this process's own;
2. the same job: the holder is this process's rank 0. Only a job's first process holds its
   folder; the job's other ranks (a rank Lightning launched, which inherits the holder's token
   in :data:`HOLD_ENV`; a rank of the same torchrun or manual multi-node launch, which shares
   the holder's rendezvous address; a task of the same SLURM job) go ahead under its hold and
   take none. A requeued SLURM job (a higher `SLURM_RESTART_COUNT`) takes the hold over from
   its earlier attempt;
3. the same host (its name and boot id): held while the holder's process id runs with the
   start time it had when it took the hold (a reused process id does not hold);
4. another host, in a SLURM job: held while SLURM knows the job in a state other than a final
   one (`scontrol show job`); a requeued job waiting to start again still holds its run;
5. another host otherwise, or SLURM cannot answer: held while the holder's heartbeat is fresh.
   The holder touches the file every :data:`HEARTBEAT_S` seconds; a file untouched for
   :data:`STALE_S` seconds is a holder that died (a lost node, SIGKILL, out of memory).

A hold file that was copied with its folder (`cp -r run copy`) holds nothing: the hold records
the folder's inode, and a copy has another. A hold that no longer holds is taken over with a
line saying whose it was; two processes taking one over at once agree through a directory that
only one of them can create.
"""

from __future__ import annotations

import atexit
import enum
import json
import os
import re
import shlex
import shutil
import socket
import subprocess
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from sru_lightning._atomic import written_beside
from sru_lightning.app.usage import PROG

from .folder import RunFolder
from .jobs import slurm_job

__all__ = ["HEARTBEAT_S", "STALE_S", "FolderHeld", "HeldFolders", "RunHold", "holder_of", "take_hold"]

#: How often a holder touches its hold file (seconds).
HEARTBEAT_S = 30.0
#: A hold file untouched this long belongs to a holder that died (seconds): four missed beats.
STALE_S = 120.0
#: A takeover's own directory older than this was left by a process that died mid-takeover.
_TAKEOVER_STALE_S = 30.0
#: SLURM job states after which a job never runs again.
_FINAL_SLURM_STATES = frozenset(
    {"BOOT_FAIL", "CANCELLED", "COMPLETED", "DEADLINE", "FAILED", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED", "TIMEOUT"}
)


class FolderHeld(Exception):
    """Another live process holds the folder; the message names it (one line)."""


# --------------------------------------------------------------------------------------------
# this process
def _boot_id() -> str | None:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip() or None
    except OSError:
        return None


def _process_start(pid: int) -> int | None:
    """The start time of process `pid` in clock ticks since boot (Linux), None where unknown."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return None
    fields = stat[stat.rfind(b")") + 2 :].split()  # after "pid (name) ": state is field 3
    try:
        return int(fields[19])  # field 22, starttime
    except (IndexError, ValueError):
        return None


def _pid_runs(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    except OSError:
        return False
    return True


#: The holder's token, inherited by the ranks Lightning's launcher starts from it.
HOLD_ENV = "SRU_LIGHTNING_RUN_HOLD"
#: Variables that number a process within a distributed job (torchrun, Lightning, SLURM).
_RANK_VARIABLES = ("RANK", "LOCAL_RANK", "NODE_RANK", "GROUP_RANK", "SLURM_PROCID")


def secondary_rank() -> bool:
    """This process is a rank other than the first of a distributed job (it holds nothing)."""
    return any(os.environ.get(name, "0").strip() not in ("", "0") for name in _RANK_VARIABLES)


def _rendezvous() -> str | None:
    """Where a distributed job's processes meet (torchrun and multi-node launches set it for all)."""
    address, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")
    if not (address and port):
        return None
    run = os.environ.get("TORCHELASTIC_RUN_ID")
    return f"{address}:{port}" + (f"/{run}" if run else "")


def _int_env(name: str) -> int:
    try:
        return int(os.environ.get(name, "0"))
    except ValueError:
        return 0


@dataclass(frozen=True)
class Holder:
    """Who holds a folder: what the hold file records."""

    token: str
    command: str
    pid: int
    host: str
    started: float
    boot_id: str | None = None
    process_start: int | None = None
    folder_inode: int | None = None
    slurm_job: str | None = None
    slurm_restart: int = 0
    rendezvous: str | None = None
    command_line: str = ""

    @classmethod
    def of_this_process(cls, command: str, folder: Path, command_line: str = "") -> Holder:
        pid = os.getpid()
        return cls(
            token=uuid.uuid4().hex,
            command=command,
            pid=pid,
            host=socket.gethostname(),
            started=time.time(),
            boot_id=_boot_id(),
            process_start=_process_start(pid),
            folder_inode=_inode(folder),
            slurm_job=slurm_job(),
            slurm_restart=_int_env("SLURM_RESTART_COUNT"),
            rendezvous=_rendezvous(),
            command_line=command_line,
        )

    def to_json(self) -> str:
        record = {name: getattr(self, name) for name in self.__dataclass_fields__}
        return json.dumps(record, sort_keys=True) + "\n"

    @classmethod
    def from_json(cls, text: str) -> Holder | None:
        try:
            record = json.loads(text)
            known = {name: record[name] for name in cls.__dataclass_fields__ if name in record}
            holder = cls(**known)
        except (ValueError, TypeError, KeyError):
            return None
        if not isinstance(holder.pid, int) or not isinstance(holder.host, str) or not isinstance(holder.token, str):
            return None
        return holder

    def describe(self) -> str:
        """`fit (process 1234 on host node1, started 2026-12-07 03:10:02 UTC, SLURM job 42): <its command>`"""
        when = (
            time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(self.started)) if self.started else "at a time unknown"
        )
        job = f", SLURM job {self.slurm_job}" if self.slurm_job else ""
        command = f": {self.command_line}" if self.command_line else ""
        return f"{self.command} (process {self.pid} on host {self.host}, started {when}{job}){command}"


def _inode(folder: Path) -> int | None:
    try:
        return os.stat(folder).st_ino
    except OSError:
        return None


# --------------------------------------------------------------------------------------------
# is a hold still held?
class Standing(enum.Enum):
    """What a hold found in a folder is to this process."""

    HELD = "held by a live process of another job"
    OWN = "this process's own (a command before this one in the same process)"
    JOB = "this job's: another rank or task of it holds the folder"
    GONE = "its holder is gone: the hold may be taken over"


@dataclass(frozen=True)
class Verdict:
    """A found hold's standing, and why (for the takeover line)."""

    standing: Standing
    reason: str = ""

    @property
    def held(self) -> bool:
        return self.standing is Standing.HELD


def judge(holder: Holder, folder: Path, now: float | None = None, mtime: float | None = None) -> Verdict:
    """Whether `holder`'s hold on `folder` still holds, for this process (the rules in the module doc)."""
    me = Holder.of_this_process(holder.command, folder)
    same_host = holder.host == me.host and (
        holder.boot_id is None or me.boot_id is None or holder.boot_id == me.boot_id
    )
    if holder.folder_inode is not None and me.folder_inode is not None and holder.folder_inode != me.folder_inode:
        return Verdict(Standing.GONE, "the hold was copied from another folder")
    if same_host and holder.pid == me.pid and holder.process_start == me.process_start:
        return Verdict(Standing.OWN)
    if os.environ.get(HOLD_ENV) == holder.token:
        return Verdict(Standing.JOB, "the process that launched this rank")
    if holder.rendezvous and holder.rendezvous == me.rendezvous and secondary_rank():
        return Verdict(Standing.JOB, f"this job's rank 0 (rendezvous {holder.rendezvous})")
    if holder.slurm_job and holder.slurm_job == me.slurm_job:
        if me.slurm_restart > holder.slurm_restart:
            return Verdict(Standing.GONE, f"SLURM job {holder.slurm_job} before its requeue")
        if secondary_rank():
            return Verdict(Standing.JOB, f"SLURM job {holder.slurm_job}'s")
    if same_host:
        if not _pid_runs(holder.pid):
            return Verdict(Standing.GONE, "its process is gone")
        started = _process_start(holder.pid)
        if holder.process_start is not None and started is not None and started != holder.process_start:
            return Verdict(Standing.GONE, "its process is gone (the process id now belongs to another)")
        return Verdict(Standing.HELD)
    if holder.slurm_job:
        state = slurm_job_state(holder.slurm_job)
        if state == "":
            return Verdict(Standing.GONE, f"SLURM no longer knows job {holder.slurm_job}")
        if state is not None:
            if state in _FINAL_SLURM_STATES:
                return Verdict(Standing.GONE, f"SLURM job {holder.slurm_job} is {state}")
            return Verdict(Standing.HELD)
    now = time.time() if now is None else now
    if mtime is not None and now - mtime > STALE_S:
        return Verdict(Standing.GONE, f"its heartbeat stopped {now - mtime:.0f} s ago (more than {STALE_S:.0f} s)")
    return Verdict(Standing.HELD)


def slurm_job_state(job: str) -> str | None:
    """SLURM's state of `job` (`RUNNING`, `PENDING`, `COMPLETED`, ...); '' when SLURM does not know
    the job (it ended long enough ago); None when SLURM cannot be asked."""
    scontrol = shutil.which("scontrol")
    if scontrol is None:
        return None
    try:
        done = subprocess.run([scontrol, "-o", "show", "job", job], capture_output=True, text=True, timeout=15)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if done.returncode != 0:
        return "" if "invalid job id" in (done.stderr + done.stdout).lower() else None
    states = re.findall(r"\bJobState=(\w+)", done.stdout)
    return states[0] if states else None


# --------------------------------------------------------------------------------------------
# taking, keeping and giving back a hold
def hold_path(folder: Path) -> Path:
    return Path(folder) / RunFolder.HOLD_FILE


def _read(path: Path) -> tuple[Holder | None, float | None, str | None]:
    """The holder a hold file records, its modification time and its text; Nones when none is there."""
    try:
        text = path.read_text()
        mtime = path.stat().st_mtime
    except FileNotFoundError:
        return None, None, None
    except OSError:
        return None, None, None
    return Holder.from_json(text), mtime, text


def holder_of(folder: str | Path) -> Holder | None:
    """The live process (not this job) that holds `folder`, or None."""
    folder = Path(folder).absolute()
    holder, mtime, _ = _read(hold_path(folder))
    if holder is None:
        return None
    return holder if judge(holder, folder, mtime=mtime).held else None


class RunHold:
    """This process's hold on a folder: released by :meth:`release` (idempotent), at the end of the
    command (its :class:`HeldFolders`) and at interpreter exit."""

    def __init__(self, folder: Path, holder: Holder, *, owned: bool, note: str | None = None) -> None:
        self.folder = folder
        self.holder = holder
        self.owned = owned  # False: another process of this job holds it (a rank, an earlier task)
        self.note = note  # the line saying whose hold was taken over, if one was
        self._stop = threading.Event()
        self._beat: threading.Thread | None = None
        self.kept = False  # taken for the rest of the command (a secondary rank's check is not)
        self._kept_by: HeldFolders | None = None

    @property
    def path(self) -> Path:
        return hold_path(self.folder)

    def start_heartbeat(self) -> None:
        if not self.owned or self._beat is not None:
            return
        self._beat = threading.Thread(target=self._heartbeat, name="sru-lightning-hold", daemon=True)
        self._beat.start()

    def _heartbeat(self) -> None:
        while not self._stop.wait(HEARTBEAT_S):
            try:
                os.utime(self.path)
            except OSError:
                pass

    def release(self) -> None:
        self._stop.set()
        atexit.unregister(self.release)
        if self._kept_by is not None:
            self._kept_by.forget(self)
        if not self.owned:
            return
        self.owned = False
        if os.environ.get(HOLD_ENV) == self.holder.token:
            del os.environ[HOLD_ENV]
        holder, _, _ = _read(self.path)
        if holder is not None and holder.token == self.holder.token:
            try:
                self.path.unlink()
            except FileNotFoundError:
                pass


class HeldFolders:
    """The folders one command holds: a folder asked for twice is held once, and
    :meth:`release_all` gives every one back (the command's end; a hold also goes at exit)."""

    def __init__(self) -> None:
        self._holds: dict[Path, RunHold] = {}

    def take(self, folder: str | Path, command: str, overrides: list[str] | tuple[str, ...] = ()) -> RunHold:
        """:func:`take_hold`, once per folder."""
        folder = Path(folder).absolute()
        if folder in self._holds:
            return self._holds[folder]
        hold = take_hold(folder, command, overrides)
        if hold.kept:
            hold._kept_by = self
            self._holds[folder] = hold
        return hold

    def forget(self, hold: RunHold) -> None:
        if self._holds.get(hold.folder) is hold:
            del self._holds[hold.folder]

    def release_all(self) -> None:
        """Give back every hold taken here."""
        for hold in list(self._holds.values()):
            hold.release()

    def __len__(self) -> int:
        return len(self._holds)


def take_hold(folder: str | Path, command: str, overrides: list[str] | tuple[str, ...] = ()) -> RunHold:
    """Hold `folder` (it exists) for `command` run with `overrides`; FolderHeld naming the holder
    when a live process of another job holds it. Takes over a hold whose holder is gone (the
    note says whose), or this process's own from an earlier command. The caller gives it back
    (:meth:`RunHold.release`), or :class:`HeldFolders` does; at the latest, the interpreter's exit."""
    folder = Path(folder).absolute()
    me = Holder.of_this_process(command, folder, f"{PROG} {shlex.join([command, *overrides])}")
    path = hold_path(folder)
    if secondary_rank():  # the job's first process holds the folder; this one only checks it
        holder, mtime, _ = _read(path)
        if holder is not None and judge(holder, folder, mtime=mtime).held:
            raise FolderHeld(f"{holder.describe()} holds it")
        return RunHold(folder, holder or me, owned=False)
    note = None
    for _ in range(200):  # a takeover under way elsewhere: look again (~10 s at most)
        if _link_new(path, me):
            return _keep(RunHold(folder, me, owned=True, note=note))
        holder, mtime, text = _read(path)
        if text is None:
            continue  # given back between the two calls: try again
        if holder is None:
            verdict = Verdict(Standing.GONE, "its hold file cannot be read")
            holder_text = "an unreadable hold"
        else:
            verdict = judge(holder, folder, mtime=mtime)
            holder_text = holder.describe()
        if verdict.held:
            raise FolderHeld(f"{holder_text} holds it")
        if verdict.standing is Standing.JOB and holder is not None:
            return _keep(RunHold(folder, holder, owned=False))
        taken = _take_over(path, text, me)
        if taken is None:
            time.sleep(0.05)
            continue
        if taken:
            if verdict.standing is Standing.GONE:
                note = f"took over the hold of {folder} from {holder_text}: {verdict.reason}"
            return _keep(RunHold(folder, me, owned=True, note=note))
    raise FolderHeld(f"another process is taking over its hold ({path}); try again")


def _keep(hold: RunHold) -> RunHold:
    hold.kept = True
    if hold.owned:
        os.environ[HOLD_ENV] = hold.holder.token  # for the ranks Lightning's launcher starts
        atexit.register(hold.release)
    hold.start_heartbeat()
    return hold


def _own_suffix(me: Holder) -> str:
    """The suffix of the file `me` writes its hold to beside the hold file (no other process's)."""
    return f".{me.host}.{me.pid}.{me.token[:8]}"


def _link_new(path: Path, me: Holder) -> bool:
    """Create the hold file as `me` if none is there (True); False when one is."""
    mine = path.with_name(path.name + _own_suffix(me))
    mine.write_text(me.to_json())
    try:
        os.link(mine, path)
        return True
    except (FileExistsError, FileNotFoundError):  # held; or the folder's entries changed meanwhile
        return False
    finally:
        mine.unlink(missing_ok=True)


def _take_over(path: Path, seen: str, me: Holder) -> bool | None:
    """Replace the hold whose text was `seen` with `me`'s. True when done; False when the hold
    changed meanwhile (judge it again); None when another process is taking it over now."""
    lock = path.with_name(f"{path.name}.takeover")
    try:
        lock.mkdir()
    except FileExistsError:
        try:
            if time.time() - lock.stat().st_mtime > _TAKEOVER_STALE_S:
                lock.rmdir()
        except OSError:
            pass
        return None
    try:
        _, _, text = _read(path)
        if text != seen:
            return False
        # one rename: the folder is never without a hold meanwhile, which another process
        # would take as free (and its hold would carry no word of the takeover)
        with written_beside(path, suffix=_own_suffix(me)) as mine:
            mine.write_text(me.to_json())
        return True
    finally:
        lock.rmdir()
