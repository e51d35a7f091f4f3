"""Conditions of the world, told apart from defects of the harness.

Why: a full disk, a folder path that runs through a regular file, a scheduler's SIGTERM or a
DataLoader worker killed by the out-of-memory killer are not bugs of ours, yet they arrive as
``OSError`` or ``RuntimeError`` from deep inside a library and used to be reported as
"internal error" (exit 1) with a traceback hint. Here each such condition becomes one line that
names the file (and the setting that chose it) and the way out, exit 2; an interrupt, however
it reaches us (``KeyboardInterrupt``, a SIGTERM noted by the command line's handler, or torch's
"DataLoader worker ... is killed by signal" that replaces the interrupt when a whole process
group is signalled), is reported as the interrupt (exit 130). The exception boundary
(``evaluation.boundary``) asks this module; writers keep saved answers whole either way.
"""
from __future__ import annotations

import contextlib
import errno
import os
import re
import signal
import threading
from typing import Callable, Dict, Iterator, List, Optional

from .commit import temp_name
from .errors import ReformError

#: errno -> what the condition is and the way out (the samples saved so far are always kept)
_FULL = ("the disk (or your quota) is full: free space there, or point the setting named here at another "
         "disk; the samples saved so far are kept and re-running the same command resumes")
WORLD_ERRNOS: Dict[int, str] = {
    errno.ENOSPC: _FULL,
    errno.EDQUOT: _FULL,
    errno.EFBIG: "the file is larger than this file system or your limits allow: choose another disk",
    errno.ENOTDIR: "a part of this path is a regular file, not a folder: point the setting named here at a folder",
    errno.EISDIR: "a folder is where a file must go: remove or rename it",
    errno.EACCES: "make it writable for this user, or point the setting named here elsewhere",
    errno.EPERM: "make it writable for this user, or point the setting named here elsewhere",
    errno.EROFS: "point the setting named here at a writable folder",
    errno.ENAMETOOLONG: "a name in this path is too long for the file system: choose a shorter folder",
    errno.ELOOP: "too many symbolic links in this path: fix the links or choose another folder",
    errno.EMFILE: "too many open files: raise the limit (ulimit -n) or lower --num_workers",
    errno.ENFILE: "too many open files on this machine: lower --num_workers or retry later",
    errno.EIO: "the storage failed (I/O error): check the disk or network file system, then re-run",
    errno.ESTALE: "the network file system dropped the file (stale handle): re-run the same command",
}

#: environment variables that choose where we write; a failing path under one is named with it
PATH_SETTINGS = ("REFORM_CACHE", "HF_HUB_CACHE", "HF_HOME", "TRANSFORMERS_CACHE", "XDG_CACHE_HOME", "TMPDIR",
                 "WANDB_DIR", "MLFLOW_TRACKING_URI")

#: signals that stop a run on purpose (a terminal's Ctrl-C, a scheduler's stop, a closed session)
INTERRUPTS = {"SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT"}

_settings: Dict[str, str] = {}
_signals: List[int] = []

_WORKER = re.compile(r"DataLoader worker \(pid(?:\(s\))? ([0-9, ]+)\) (?:is killed by signal: ([^.\n]+)|exited unexpectedly)")


def name_setting(flag: str, path: Optional[str]) -> None:
    """Say which flag chose ``path`` (``--output_dir``, ``--cache_dir``), so a failure below it
    names the flag as the way out."""
    if path:
        _settings[flag] = os.path.abspath(os.path.expanduser(str(path)))


def note_signal(signum: int) -> None:
    """Called by the command line's signal handler: this process was asked to stop."""
    _signals.append(signum)


def reset() -> None:
    """A new command starts: no signal received yet, nothing saved yet."""
    _signals.clear()
    _progress.clear()


#: what a run has saved so far, said by the run while it runs (``note_progress``)
_progress: List[Callable[[], str]] = []


def note_progress(describe: Callable[[], str]) -> None:
    """The run's answer to "what is saved?" ("12 of 40 samples are saved"), for an interrupt."""
    _progress[:] = [describe]


def interrupted_line(sig: str, stage: str) -> str:
    """The one line of an interrupt by signal ``sig`` ("SIGINT" is Ctrl-C, named by no suffix;
    others as " (SIGTERM)"): what is saved and how to resume.
    The same words whichever way the interrupt travelled (a run's own handler, or the command
    line's boundary when a second signal or a DataLoader worker's death overtook it), so a
    scheduler's SIGTERM never loses the count."""
    how = "" if sig == "SIGINT" else f" ({sig})"
    if _progress:
        return f"interrupted{how}: {_progress[0]()}; re-running the same command resumes from there"
    return f"interrupted{how} while {stage}; re-running the same command resumes from the samples already saved"


def received_signal() -> Optional[str]:
    """The name of the first stop signal this process received since ``reset``, if any."""
    return signal.Signals(_signals[0]).name if _signals else None


def chain(error: BaseException) -> Iterator[BaseException]:
    """``error`` and every exception it was raised from or while handling."""
    seen = set()
    e: Optional[BaseException] = error
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        yield e
        e = e.__cause__ or e.__context__


def _worker_signal(e: BaseException) -> Optional[str]:
    """'SIGTERM' for torch's "DataLoader worker (pid N) is killed by signal: Terminated.", 'unknown'
    for "exited unexpectedly", None for anything else."""
    if not isinstance(e, RuntimeError):
        return None
    m = _WORKER.search(str(e))
    if not m:
        return None
    if m.group(2) is None:
        return "unknown"
    described = m.group(2).strip()
    for sig in signal.Signals:
        if sig.name == described or signal.strsignal(sig) == described:
            return sig.name
    return described


def interrupt_of(error: BaseException) -> Optional[str]:
    """How the run was stopped on purpose, or None: a stop signal this process received, a
    KeyboardInterrupt anywhere in the chain, or a DataLoader worker killed by a stop signal."""
    got = received_signal()
    if got:
        return got
    for e in chain(error):
        if isinstance(e, KeyboardInterrupt):
            return "SIGINT"
        sig = _worker_signal(e)
        if sig in INTERRUPTS:
            return sig
    return None


def setting_for(path: str) -> Optional[str]:
    """The flag or environment variable whose folder holds ``path`` (the longest match)."""
    path = os.path.abspath(path)
    found = [(len(p), flag) for flag, p in _settings.items() if path == p or path.startswith(p.rstrip(os.sep) + os.sep)]
    for name in PATH_SETTINGS:
        value = os.environ.get(name)
        if value:
            value = value[len("file://"):] if value.startswith("file://") else value
            p = os.path.abspath(os.path.expanduser(value))
            if path == p or path.startswith(p.rstrip(os.sep) + os.sep):
                found.append((len(p), name))
    return max(found)[1] if found else None


def _file_in_the_way(path: str) -> Optional[str]:
    """The existing regular file that a folder path runs through, if any."""
    p = os.path.abspath(path)
    while True:
        parent = os.path.dirname(p)
        if parent == p:
            return None
        if os.path.lexists(parent):
            return parent if not os.path.isdir(parent) else None
        p = parent


def probe_folder(path: str, setting: str) -> None:
    """Before any work: make ``path`` and write, flush and remove one small file there, as the
    run will (so a folder below a regular file, a read-only or a full disk is one line now, not
    an error after the work); the probe is named like our temporaries, so a kill leaves nothing
    that the next start does not remove."""
    name_setting(setting, path)
    probe = os.path.join(path, temp_name("probe"))
    try:
        os.makedirs(path, exist_ok=True)
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o644)
        try:
            os.write(fd, b"probe\n")
            os.fsync(fd)
        finally:
            os.close(fd)
            os.unlink(probe)
    except OSError as e:
        if e.filename is None:
            e.filename = path
        raise ReformError(os_error_line(e) if e.errno in WORLD_ERRNOS else
                          f"{path}: {setting}: cannot write there ({e.strerror or e})") from None


def os_error_line(e: OSError, what: Optional[str] = None) -> str:
    """One line for an OSError of the world: the file, the setting that chose it, what it is and
    the way out (``what``: the file's role when the error carries no file name)."""
    name = e.filename if e.filename is not None else what
    if name is None:
        where = "a file we write"
    else:
        where = os.fsdecode(name) if isinstance(name, (str, bytes, os.PathLike)) else str(name)
    setting = setting_for(where) if name is not None else None
    code = errno.errorcode.get(e.errno or 0, str(e.errno))
    reason = WORLD_ERRNOS.get(e.errno or -1, "")
    parts = [f"{where}: {e.strerror or e} ({code})"]
    if e.errno == errno.ENOTDIR and name is not None:
        blocker = _file_in_the_way(where)
        if blocker:
            parts.append(f"({blocker} is a regular file)")
    if setting:
        parts.append(f"(set by {setting})")
    if not setting:
        reason = reason.replace("the setting named here", "the flag or variable that names this folder")
    return " ".join(parts) + (f"; {reason}" if reason else "")


def world_error(error: BaseException) -> Optional[ReformError]:
    """The one-line error (exit 2) for a condition of the world in ``error``'s chain, or None for
    anything else (a defect of ours)."""
    for e in chain(error):
        if isinstance(e, OSError) and e.errno in WORLD_ERRNOS:
            return ReformError(os_error_line(e))
        sig = _worker_signal(e)
        if sig is not None and sig not in INTERRUPTS:
            why = {"SIGKILL": "killed, most often by the out-of-memory killer",
                   "SIGBUS": "the shared memory (/dev/shm) is too small",
                   "unknown": "it exited unexpectedly"}.get(sig, f"signal {sig}")
            return ReformError(f"a DataLoader worker died ({sig}: {why}); lower --num_workers (0 loads in the main "
                               "process); the samples saved so far are kept and re-running the same command resumes")
    return None


@contextlib.contextmanager
def interrupts_held(child_deaths: bool = False) -> Iterator[None]:
    """Ctrl-C and SIGTERM noted but not raised while the block runs (the run is already
    stopping, and what the block does, writing out finished records, decides what the one line
    can say is saved). With ``child_deaths``,
    SIGCHLD's handler is set aside too: torch raises "DataLoader worker ... is killed by signal"
    from it when the whole process group got the SIGTERM, which would replace the line of the
    interrupt already being reported. In the main thread only; the handlers are put back after."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    before = {sig: signal.signal(sig, lambda signum, frame: note_signal(signum))
              for sig in (signal.SIGINT, signal.SIGTERM)}
    if child_deaths:
        before[signal.SIGCHLD] = signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    try:
        yield
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)
