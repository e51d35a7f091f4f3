"""Content hashes of files, with a stat-keyed memo so each file is read once per machine.

Why: the run identity and the response cache must follow what a file holds, never where it is
or when it was touched (issue 24: the same data in another folder, or after a ``touch``, missed
on every request). Reading 100k image files on every start would be slow, so a file's hash is
remembered under its stat key (device, inode, size, modification and change times): a moved,
copied or touched file gets a new stat key, is read once more, and hashes to the same content.

Image files are also checked where they are read (``file_digest``: a readable image within the
pixel limit, header and ``verify``, no pixels decoded), and only a file that passed is remembered:
a broken image is refused in one line naming its sample whichever model runs (a baseline never
decodes it), and each good file is checked once per machine, not once per run.

Store: one folder per data directory under ``$REFORM_CACHE/checked_images/`` (named by a hash of
the directory's path), so a run reads the memos of the directories it uses and no others.
In it, append-only JSONL segments, one per writing process (no locks: safe for ranks and
concurrent runs), read once per process on first use; a torn, foreign or damaged line (each line
carries a check sum of its fields) is skipped, and lines that disagree about one file are all
dropped. The memo is never believed over the file: a hash taken from it is checked when the run
reads the file's bytes (nothing is sent on its word alone, ``unchanged_digest``), and before a
response cache hit is used (``verify_fingerprint``: the file is read once per run then); a file
whose stat is unchanged but whose bytes disagree has its entry replaced and the run stops (its
identity and cache keys were made from the wrong hash; the next run is right); only a file
whose stat or bytes changed since this run read it is "changed during the run". When a
directory's memo has many segments, those of finished processes are merged into one, keeping
only entries whose file still has that stat key (a memo never grows without bound).
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import stat
import secrets
import socket
import threading
from typing import Any, Callable, Dict, Optional, Set, Tuple

from .images import check_image, max_image_pixels
from .paths import cache_root
from .runlock import pid_alive

logger = logging.getLogger(__name__)

#: merge the segments of finished processes once a directory has more than this many
MAX_SEGMENTS = 16

def stat_key(st: os.stat_result) -> str:
    return f"{st.st_dev}:{st.st_ino}:{st.st_size}:{st.st_mtime_ns}:{st.st_ctime_ns}"


def stat_fields(st: os.stat_result) -> Tuple[int, ...]:
    """What ``stat_key`` holds, as a tuple (compared per request: no string to build)."""
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def content_hash(data: bytes) -> str:
    """The content hash of bytes already read (as ``hash_bytes_of`` gives for their file)."""
    return hashlib.blake2b(data, digest_size=16).hexdigest()


def hash_bytes_of(path: str) -> str:
    """blake2b-128 of a file's bytes, read in 1 MiB blocks."""
    h = hashlib.blake2b(digest_size=16)
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


class _DirMemo:
    """The memo of one data directory: file name -> (stat key, hash)."""

    def __init__(self, folder: str, data_dir: str) -> None:
        self.folder, self.data_dir = folder, data_dir
        self.known: Dict[Tuple[str, str], str] = {}
        self.disputed: Set[Tuple[str, str]] = set()  # (name, stat key) with lines that disagree
        self._fd: Optional[int] = None
        names = []
        try:
            names = sorted(n for n in os.listdir(folder) if n.startswith("seg-") and n.endswith(".jsonl"))
        except OSError:
            pass
        for name in names:
            try:
                with open(os.path.join(folder, name), "rb") as f:
                    for line in f:
                        self._parse(line)
            except OSError:
                continue
        if len(names) > MAX_SEGMENTS:
            self._compact(names)

    def _parse(self, line: bytes) -> None:
        """One line: taken only with its check sum (a damaged line, valid JSON or not, is
        skipped); two lines that give one file and stat key different hashes are both dropped
        (the file is hashed again: the memo is never believed over the file)."""
        if not line.endswith(b"\n") or len(line) > 65536:
            return
        try:
            entry = json.loads(line)
            name, key, value, check = entry["f"], entry["k"], entry["h"], entry["c"]
        except (ValueError, KeyError, TypeError, RecursionError):
            return
        if not (isinstance(name, str) and isinstance(key, str) and isinstance(value, str) and len(value) == 32
                and check == _line_check(name, key, value)):
            return
        if (name, key) in self.disputed:
            return
        known = self.known.get((name, key))
        if known is not None and known != value:
            del self.known[(name, key)]
            self.disputed.add((name, key))
            return
        self.known[(name, key)] = value

    def _compact(self, names: list) -> None:
        """One segment holding the entries that are still true; the segments of processes that
        are gone are removed (a live process may still append to its own)."""
        dead = [n for n in names if _owner_gone(n)]
        if len(dead) < 2:
            return
        merged = os.path.join(self.folder, f"seg-{socket.gethostname()}-0-{secrets.token_hex(4)}.jsonl")
        tmp = merged + ".tmp"
        try:
            with open(tmp, "w", encoding="utf-8") as f:
                for (name, key), value in self.known.items():
                    try:
                        current = stat_key(os.stat(os.path.join(self.data_dir, name)))
                    except OSError:
                        continue
                    if current == key:
                        f.write(_line(name, key, value))
            os.replace(tmp, merged)
            for n in dead:
                os.unlink(os.path.join(self.folder, n))
        except OSError as e:  # a memo that cannot be tidied is still a correct memo
            logger.debug("file hashes: compaction skipped (%s)", e)
            if os.path.exists(tmp):
                os.unlink(tmp)

    def append(self, name: str, key: str, value: str) -> None:
        try:
            if self._fd is None:
                os.makedirs(self.folder, exist_ok=True)
                seg = f"seg-{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(4)}.jsonl"
                self._fd = os.open(os.path.join(self.folder, seg), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            os.write(self._fd, _line(name, key, value).encode("utf-8"))
        except OSError as e:  # no memo on a read-only or full disk: hashes are still right, only slower
            logger.debug("file hashes: memo not written (%s)", e)


def _line_check(name: str, key: str, value: str) -> str:
    """The check sum of one memo line: a line damaged in any field no longer matches it."""
    text = json.dumps([name, key, value])
    return hashlib.blake2b(text.encode("ascii"), digest_size=8).hexdigest()


def _line(name: str, key: str, value: str) -> str:
    # ASCII JSON: a file name that is not UTF-8 (a surrogate-escaped byte) round-trips as \udcXX
    return json.dumps({"f": name, "k": key, "h": value, "c": _line_check(name, key, value)}) + "\n"


def _identity(path: str) -> str:
    """The absolute name of ``path`` as the system resolves it: textual normalisation is right
    except across ``..`` (``link/..`` is the link target's parent), where the real path is taken."""
    full = os.path.abspath(path)
    return os.path.realpath(path) if ".." in path.split(os.sep) else full


class FileHashes:
    """The memo: ``digest(path)`` reads the file only when its stat key is new."""

    def __init__(self, directory: Optional[str] = None,
                 check: Optional[Callable[[bytes, str, Any], None]] = None) -> None:
        self.directory = directory
        self.check = check
        #: what the check depends on besides the bytes (its ``variant()``, the pixel limit): a memo
        #: per value, so a file passed under a higher limit is checked again under a lower one
        self.variant = getattr(check, "variant", None) or (lambda: "")
        self._dirs: Dict[Tuple[str, str], _DirMemo] = {}
        self._lock = threading.Lock()
        self.read_files = 0
        #: absolute path -> the content hash ``digest`` last gave for it: what a run's identity and
        #: cache keys hold (the run fingerprints every file when it starts)
        self.fingerprinted: Dict[str, str] = {}
        #: absolute path -> its ``stat_fields`` when ``digest`` gave that hash (``unchanged_digest``)
        self.fingerprint_stat: Dict[str, Tuple[int, ...]] = {}
        #: absolute paths whose fingerprint this process made from the file's bytes (not taken from
        #: the memo): only those are trusted without a read (``unchanged_digest``)
        self.verified: Set[str] = set()

    def _memo(self, data_dir: str, variant: str) -> _DirMemo:
        memo = self._dirs.get((data_dir, variant))
        if memo is None:
            root = self.directory or os.path.join(cache_root(), "checked_images")
            named = data_dir + ("\x00" + variant if variant else "")
            tag = hashlib.sha256(named.encode("utf-8", "surrogatepass")).hexdigest()[:24]
            memo = self._dirs[(data_dir, variant)] = _DirMemo(os.path.join(root, tag), data_dir)
        return memo

    def digest(self, path: str, st: Optional[os.stat_result] = None, record: Any = None) -> str:
        """The content hash of ``path`` (``OSError`` if it cannot be read; with a ``check``, what
        ``check(data, path, record)`` raises for bytes it refuses)."""
        st = st or os.stat(path)
        if not stat.S_ISREG(st.st_mode):  # a FIFO or device would block the reader, a folder fail it
            raise OSError(f"not a regular file: {path}")
        key = stat_key(st)
        full = _identity(path)
        data_dir, name = os.path.split(full)
        variant = self.variant()
        memo = self._dirs.get((data_dir, variant))  # (a plain read: the memo of a folder is made once)
        if memo is None:
            with self._lock:
                memo = self._memo(data_dir, variant)
        found = memo.known.get((name, key))
        if found is not None:
            self.fingerprinted[full] = found
            self.fingerprint_stat[full] = stat_fields(st)
            self.verified.discard(full)  # (the memo's word: checked against the bytes when they are read)
            return found
        if self.check is None:
            value = hash_bytes_of(path)
        else:
            with open(path, "rb") as f:
                data = f.read()
            self.check(data, path, record)  # only a file that passed is remembered
            value = content_hash(data)
        with self._lock:
            self.read_files += 1
            memo.known[(name, key)] = value
            memo.append(name, key, value)
        self.fingerprinted[full] = value
        self.fingerprint_stat[full] = stat_fields(st)
        self.verified.add(full)
        return value

    def correct(self, full: str, st: os.stat_result, value: str) -> None:
        """The file ``full`` holds content ``value`` under the stat key ``st`` although the memo said
        otherwise: the memo's entry is replaced (in this process, and by a line that disputes the
        wrong one in later processes, which then hash the file again)."""
        data_dir, name = os.path.split(full)
        key = stat_key(st)
        with self._lock:
            memo = self._memo(data_dir, self.variant())
            memo.known[(name, key)] = value
            memo.append(name, key, value)


def _owner_gone(name: str) -> bool:
    """Whether the process that wrote segment ``name`` (``seg-<host>-<pid>-<nonce>.jsonl``) is gone."""
    parts = name[:-len(".jsonl")].split("-")
    try:
        host, pid = "-".join(parts[1:-2]), int(parts[-2])
    except (ValueError, IndexError):
        return False
    return host == socket.gethostname() and (pid == 0 or not pid_alive(pid))


class _ImageCheck:
    """``check_image`` on a file's bytes; its verdict depends on the pixel limit in force too."""

    def __call__(self, data: bytes, path: str, record: Any) -> None:
        check_image(data, record=record, name=path)

    @staticmethod
    def variant() -> str:
        return str(max_image_pixels())


_check_image = _ImageCheck()
_memo = FileHashes(check=_check_image)


def file_digest(path: str, st: Optional[os.stat_result] = None, record: Any = None) -> str:
    """The content hash of an image file, through this process's memo; a file read for the first
    time is checked as an image (errors name ``record``, the sample, and the file)."""
    return _memo.digest(path, st, record)


def forget_fingerprints() -> None:
    """End what a run's fingerprint promised (at the start and end of each run): a later run in
    the same process, or ``load_reform_dataset`` after it, takes files as they are then."""
    _memo.fingerprinted.clear()
    _memo.fingerprint_stat.clear()
    _memo.verified.clear()


class ChangedSinceFingerprint(Exception):
    """A file's bytes are not the content the run fingerprinted (args: then, now)."""


class MemoWasWrong(ChangedSinceFingerprint):
    """The run's fingerprint of a file came from the memo, and the file (unchanged since) holds
    other bytes: the run's identity and cache keys name the wrong picture. The memo's entry is
    already corrected when this is raised, so the next run fingerprints the file right."""


def read_regular(path: str) -> bytes:
    """The bytes of regular file ``path``, in one open, fstat and read (a worker thread gives up
    the interpreter lock at each system call, so the request path makes few): a FIFO or device
    is refused (``OSError``), never waited on."""
    return _read_regular_stat(path)[0]


def _read_regular_stat(path: str) -> Tuple[bytes, os.stat_result]:
    """``read_regular`` and the file's stat as it was opened: ``open``, ``fstat``, one ``read`` of
    the size the stat gave plus one byte, ``close``. Only a read of exactly the stat's size is
    known to be the whole file: a shorter one may be cut (Linux returns at most 2 GiB - 4 KiB per
    read; a network or FUSE filesystem may return any part) and a longer one found the file grown,
    so both go on reading to the end (an empty read) and give the stat after that read: a file
    that changed while it was read is then not taken for the unchanged file its first stat named
    (``bytes_as_fingerprinted`` would blame the image memo and "correct" it with the new bytes).
    (A Python file object costs six more system calls: an ``fstat``, a tty ``ioctl``, ``lseek``s
    and a read of the end; each gives up the interpreter lock, and with 128 window workers every
    hand-over of the lock cost more than the call itself: ``bench/api_ceiling.py``.)"""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(f"not a regular file: {path}")
        data = os.read(fd, st.st_size + 1)
        if len(data) == st.st_size:
            return data, st
        parts = [data]  # a cut read, or a file that grew or shrank since its stat: read to its end
        while True:
            more = os.read(fd, 1 << 20)
            if not more:
                return b"".join(parts), os.fstat(fd)
            parts.append(more)
    finally:
        os.close(fd)


def unchanged_digest(path: str) -> Optional[str]:
    """The content hash the run fingerprinted for ``path`` while the file's stat key (device,
    inode, size, modification and change times) is still the one it had then: one ``stat``, no
    read. None when the file was never fingerprinted, has changed or is gone: the caller then
    reads it (``bytes_as_fingerprinted``). A caller may use this only to look up what it made
    from the very bytes of that hash (an encoded image): what it sends is then the fingerprinted
    content whatever the file holds now."""
    full = _identity(path)
    then = _memo.fingerprint_stat.get(full)
    if then is None or full not in _memo.verified:  # (a hash from the memo is checked by a read first)
        return None
    try:
        st = os.stat(path)
    except OSError:
        return None
    if stat_fields(st) != then:
        return None
    return _memo.fingerprinted.get(full)


def verify_fingerprint(path: str) -> None:
    """Make sure the run's fingerprint of ``path`` is the file's content and not only the memo's
    word: a file this run hashed from its bytes (and unchanged since) costs one ``stat``; one
    fingerprinted from the memo is read once (``bytes_as_fingerprinted``, which raises
    ``MemoWasWrong`` or ``ChangedSinceFingerprint`` when it disagrees). Used before a response
    cache hit, which would otherwise never read the file."""
    if unchanged_digest(path) is None and _identity(path) in _memo.fingerprinted:
        bytes_as_fingerprinted(path)


def bytes_as_fingerprinted(path: str) -> Tuple[bytes, str]:
    """The bytes of ``path`` and their content hash, read once: what a model is given must be
    what the run's identity and cache keys name. A file replaced since the run fingerprinted it
    raises ``ChangedSinceFingerprint`` (an answer about the new picture would be stored under
    the old picture's key); a file never fingerprinted is taken as it is."""
    data, st = _read_regular_stat(path)
    now = content_hash(data)
    full = _identity(path)
    then = _memo.fingerprinted.get(full)
    if then is not None and then != now:
        if full in _memo.verified or _memo.fingerprint_stat.get(full) != stat_fields(st):
            raise ChangedSinceFingerprint(then, now)  # a real change: new bytes since this run read them
        # the fingerprint was the memo's word and the file is as it was then: the memo was wrong,
        # and the run's identity, image_sha and cache keys were made from it: corrected, and the
        # run stops (going on would write a right answer under a wrong identity)
        _memo.correct(full, st, now)
        raise MemoWasWrong(then, now)
    if then is not None:
        _memo.verified.add(full)
        _memo.fingerprint_stat[full] = stat_fields(st)  # (these bytes are the fingerprint: read at most once)
    return data, now
