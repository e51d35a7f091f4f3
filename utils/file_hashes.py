"""Content hashes of files, with a stat-keyed memo so each file is read once per machine.

Why: the run identity and the response cache must follow what a file holds, never where it is
or when it was touched (issue 24: the same data in another folder, or after a ``touch``, missed
on every request). Reading 100k image files on every start would be slow, so a file's hash is
remembered under its stat key (device, inode, size, modification and change times): a moved,
copied or touched file gets a new stat key, is read once more, and hashes to the same content.

Store: append-only JSONL segments under ``$REFORM_CACHE/file_hashes/``, one per writing process
(no locks; safe for ranks and concurrent runs), read once per process on first use. A torn or
foreign line is skipped. Segments of finished processes are merged into one when there are many.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import secrets
import socket
import threading
from typing import Dict, Optional, Tuple

from utils.paths import cache_root
from utils.runlock import pid_alive

logger = logging.getLogger(__name__)

#: merge the segments of finished processes once there are more than this many
MAX_SEGMENTS = 32

StatKey = Tuple[int, int, int, int, int]


def stat_key(st: os.stat_result) -> StatKey:
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def hash_bytes_of(path: str) -> str:
    """blake2b-128 of a file's bytes, read in 1 MiB blocks."""
    h = hashlib.blake2b(digest_size=16)
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


class FileHashes:
    """The memo: ``digest(path)`` reads the file only when its stat key is new."""

    def __init__(self, directory: Optional[str] = None) -> None:
        self.directory = directory
        self.known: Dict[str, str] = {}
        self._loaded = False
        self._fd: Optional[int] = None
        self._lock = threading.Lock()
        self.read_files = 0

    def _dir(self) -> str:
        return self.directory or os.path.join(cache_root(), "file_hashes")

    def _load(self) -> None:
        self._loaded = True
        d = self._dir()
        try:
            names = sorted(n for n in os.listdir(d) if n.startswith("seg-") and n.endswith(".jsonl"))
        except OSError:
            return
        for name in names:
            try:
                with open(os.path.join(d, name), "rb") as f:
                    for line in f:
                        self._parse(line)
            except OSError:
                continue
        if len(names) > MAX_SEGMENTS:
            self._compact(d, names)

    def _parse(self, line: bytes) -> None:
        if not line.endswith(b"\n"):
            return
        try:
            entry = json.loads(line)
            key, value = entry["k"], entry["h"]
        except (ValueError, KeyError, TypeError):
            return
        if isinstance(key, str) and isinstance(value, str) and len(value) == 32:
            self.known[key] = value

    def _compact(self, d: str, names: list) -> None:
        """One segment holding every entry; the segments of processes that are gone are removed
        (a live process may still append to its own)."""
        dead = [n for n in names if _owner_gone(n)]
        if len(dead) < 2:
            return
        merged = os.path.join(d, f"seg-{socket.gethostname()}-0-{secrets.token_hex(4)}.jsonl")
        tmp = merged + ".tmp"
        try:
            with open(tmp, "w", encoding="ascii") as f:
                for k, v in self.known.items():
                    f.write(json.dumps({"k": k, "h": v}, ensure_ascii=True) + "\n")
            os.replace(tmp, merged)
            for n in dead:
                os.unlink(os.path.join(d, n))
        except OSError as e:  # a memo that cannot be tidied is still a correct memo
            logger.debug("file hashes: compaction skipped (%s)", e)
            if os.path.exists(tmp):
                os.unlink(tmp)

    def digest(self, path: str, st: Optional[os.stat_result] = None) -> str:
        """The content hash of ``path`` (``OSError`` if it cannot be read)."""
        st = st or os.stat(path)
        key = ":".join(str(x) for x in stat_key(st))
        with self._lock:
            if not self._loaded:
                self._load()
            found = self.known.get(key)
        if found is not None:
            return found
        value = hash_bytes_of(path)
        with self._lock:
            self.read_files += 1
            self.known[key] = value
            self._append(key, value)
        return value

    def _append(self, key: str, value: str) -> None:
        try:
            if self._fd is None:
                d = self._dir()
                os.makedirs(d, exist_ok=True)
                name = f"seg-{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(4)}.jsonl"
                self._fd = os.open(os.path.join(d, name), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            os.write(self._fd, (json.dumps({"k": key, "h": value}, ensure_ascii=True) + "\n").encode("ascii"))
        except OSError as e:  # no memo on a read-only or full disk: hashes are still right, only slower
            logger.debug("file hashes: memo not written (%s)", e)


def _owner_gone(name: str) -> bool:
    """Whether the process that wrote segment ``name`` (``seg-<host>-<pid>-<nonce>.jsonl``) is gone."""
    parts = name[:-len(".jsonl")].split("-")
    try:
        host, pid = "-".join(parts[1:-2]), int(parts[-2])
    except (ValueError, IndexError):
        return False
    return host == socket.gethostname() and (pid == 0 or not pid_alive(pid))


_memo = FileHashes()


def file_digest(path: str, st: Optional[os.stat_result] = None) -> str:
    """The content hash of an image file, through this process's memo."""
    return _memo.digest(path, st)
