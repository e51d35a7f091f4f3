"""One run per run identity at a time: an ``O_EXCL`` lock file holding host, pid and start time.

Two copies of one command in one output directory would append to the same shards and race
on the merge. The second copy exits 2 naming the process that holds the run. A lock left by a
process that is gone (killed with -9) is detected on the same host and taken over.
"""
from __future__ import annotations

import json
import os
import socket
import time
from typing import Any, Dict, Optional

from .errors import ReformError


def _proc_start(pid: int) -> Optional[str]:
    """The kernel's start time of ``pid`` (guards against pid reuse), or None where unknown."""
    try:
        with open(f"/proc/{pid}/stat", "r", encoding="ascii", errors="replace") as f:
            return f.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def pid_alive(pid: int) -> bool:
    """Is process ``pid`` alive on this host (one we may not signal counts as alive)? A pid no
    process can have (read from a file name: negative, zero or past the C int) is not alive."""
    if not isinstance(pid, int) or pid <= 0 or pid > 2**31 - 1:
        return False
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, OverflowError):
        return False
    except PermissionError:
        return True
    return True


def _alive(info: Dict[str, Any]) -> bool:
    try:
        pid = int(info.get("pid", -1))
    except (TypeError, ValueError):
        return False  # an unreadable holder is no live process: the lock is stale
    if pid <= 0 or not pid_alive(pid):
        return False
    start = info.get("start")
    return start is None or _proc_start(pid) in (None, start)


class FileLock:
    """Context manager: hold the lock file ``path`` (``O_EXCL``; host, pid and process start
    time inside). A live holder makes ``acquire`` wait up to ``wait_s`` seconds (0: fail at
    once with a message naming the holder, ``what`` says what is locked); a holder that is gone
    is taken over."""

    def __init__(self, path: str, what: str = "this resource", wait_s: float = 0.0, poll_s: float = 0.2) -> None:
        self.path = path
        self.what = what
        self.wait_s = wait_s
        self.poll_s = poll_s
        self.held = False

    def acquire(self) -> None:
        deadline = time.monotonic() + self.wait_s
        while True:
            try:
                return self._try_acquire()
            except ReformError:
                if time.monotonic() >= deadline:
                    raise
                time.sleep(self.poll_s)

    def _try_acquire(self) -> None:
        me = {"host": socket.gethostname(), "pid": os.getpid(), "start": _proc_start(os.getpid()),
              "since": time.strftime("%Y-%m-%d %H:%M:%S")}
        for _ in range(3):
            try:
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                holder = self._read()
                if holder is None and self._age() < 5.0:
                    time.sleep(0.5)  # another process is between creating and writing the lock
                    holder = self._read()
                if holder is None or (holder.get("host") == me["host"] and not _alive(holder)):
                    try:
                        os.unlink(self.path)  # stale: its process is gone
                    except FileNotFoundError:
                        pass
                    continue
                raise ReformError(
                    f"{self.path}: {self.what} is held by process {holder.get('pid')} on host "
                    f"{holder.get('host')} since {holder.get('since')}"
                    f"{f' (waited {self.wait_s:.0f}s)' if self.wait_s else ''}; wait for it to finish, or remove "
                    "the lock file if that process is gone")
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump(me, f)
            self.held = True
            return
        raise ReformError(f"{self.path}: could not take the run lock")

    def _age(self) -> float:
        try:
            return time.time() - os.stat(self.path).st_mtime
        except OSError:
            return float("inf")

    def _read(self) -> Optional[Dict[str, Any]]:
        try:
            with open(self.path, "r", encoding="utf-8") as f:
                data = json.load(f)
            return data if isinstance(data, dict) else None
        except (OSError, ValueError):
            return None  # unreadable or half-written by a killed process: stale

    def release(self) -> None:
        if self.held:
            try:
                os.unlink(self.path)
            except FileNotFoundError:
                pass
            self.held = False

    def __enter__(self) -> "FileLock":
        self.acquire()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.release()


class RunLock(FileLock):
    """``<output_dir>/.lock-<run_id>``: one run per run identity at a time (no waiting)."""

    def __init__(self, output_dir: str, run_id: str) -> None:
        super().__init__(os.path.join(output_dir, f".lock-{run_id}"),
                         "this run (same command and data) is already running: it")
