"""A content-addressed cache of model calls, safe for ranks, concurrent runs and kill -9.

Key: a hash of everything that decides one response: the model's identity (family, checkpoint
and its files' fingerprint, or an API's served model id and endpoint; the output-changing
options), the sample's fingerprint (every field: question, options, answer, history, meta, id,
and the CONTENT of every image: a file's bytes, never its path or modification time, so the
same data in another folder or after a ``touch`` is served from the cache), the prompt, the
method and candidates, the generation settings, and the per-sample seed and response index. A changed image, prompt, sample,
checkpoint or setting is a different key, so a stale answer is never served (lmms-eval keys on
the request string and can be; so would a prompt-only key here, for a baseline that answers
from the sample's answer or candidates).

Store: append-only JSONL *segments*, one per writing process
(``<dir>/<model key>/seg-<host>-<pid>-<nonce>.jsonl``). No process ever writes another's file,
so torchrun ranks, two runs at once and shared filesystems (NFS, where SQLite's locking is not
safe) need no lock. Each line carries a checksum of its value; a line torn by kill -9, or
damaged any other way, is skipped on read, so a kill loses at most the calls in flight and
never leaves a store that cannot be read. Segments of one model are read once per run.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import secrets
import socket
import zlib
from typing import Any, Dict, List, Optional, Tuple

from ..utils.paths import cache_root

logger = logging.getLogger("reform_eval.evaluation.cache")

#: the store's format; a new format never reads an old one's lines (2: content-addressed images,
#: values carry the call's trace)
FORMAT = 2


def default_cache_dir() -> str:
    return os.path.join(cache_root(), "responses")


def _canonical(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, ensure_ascii=False, separators=(",", ":"), default=str)


def call_key(model_key: str, sample_digest: str, prompt: Any, method: str, candidates: Optional[List[str]],
             settings: Dict[str, Any], seed: Optional[int], index: int) -> str:
    """The key of one model call (see the module docstring). The images are in it through the
    sample's digest, which holds each image's content hash (``utils.fingerprint``)."""
    body = {"f": FORMAT, "model": model_key, "sample": sample_digest, "prompt": prompt,
            "method": method, "candidates": candidates, "settings": settings, "seed": seed, "index": index}
    return hashlib.sha256(_canonical(body).encode("utf-8", "surrogatepass")).hexdigest()


def _line(key: str, value: Any) -> bytes:
    payload = _canonical(value)
    crc = zlib.crc32(payload.encode("utf-8", "surrogatepass"))
    return (json.dumps({"k": key, "c": crc, "v": value}, ensure_ascii=True, separators=(",", ":")) + "\n").encode("ascii")


def _parse(line: bytes) -> Optional[Tuple[str, Any]]:
    """(key, value) of one complete, intact line; None for a torn or damaged one."""
    if not line.endswith(b"\n"):
        return None
    try:
        entry = json.loads(line)
        key, crc, value = entry["k"], entry["c"], entry["v"]
    except (ValueError, KeyError, TypeError, RecursionError):
        return None
    if not isinstance(key, str) or zlib.crc32(_canonical(value).encode("utf-8", "surrogatepass")) != crc:
        return None
    return key, value


class ResponseCache:
    """Read every segment of one model once; append this process's new calls to its own segment."""

    def __init__(self, directory: str, model_key: str) -> None:
        self.model_key = model_key
        self.directory = os.path.join(directory, model_key[:24])
        self.entries: Dict[str, Any] = {}
        self.hits = 0
        self.misses = 0
        self.skipped_lines = 0
        self._fd: Optional[int] = None
        self._path = ""
        #: the store's write error (a full disk), raised by ``raise_failure`` after the shard write
        self.failure: Optional[OSError] = None
        self._load()

    def _load(self) -> None:
        if not os.path.isdir(self.directory):
            return
        for name in sorted(os.listdir(self.directory)):
            if not (name.startswith("seg-") and name.endswith(".jsonl")):
                continue
            try:
                with open(os.path.join(self.directory, name), "rb") as f:
                    for line in f:
                        parsed = _parse(line)
                        if parsed is None:
                            self.skipped_lines += 1
                            continue
                        self.entries.setdefault(parsed[0], parsed[1])
            except OSError as e:  # an unreadable segment is a miss, never a failure
                logger.warning("response cache: cannot read %s (%s); its entries are ignored", name, e)
        if self.skipped_lines:
            logger.info("response cache: %d torn or damaged lines skipped", self.skipped_lines)

    def get(self, key: str) -> Any:
        if key in self.entries:
            self.hits += 1
            return self.entries[key]
        self.misses += 1
        return None

    def put_many(self, items: List[Tuple[str, Any]]) -> None:
        """Append entries as whole lines in one write (O_APPEND), then flush them to the file."""
        if not items:
            return
        for k, v in items:
            self.entries[k] = v
        if self.failure is not None:
            return
        path = self.directory
        try:
            if self._fd is None:
                os.makedirs(self.directory, exist_ok=True)
                path = os.path.join(self.directory, f"seg-{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(4)}.jsonl")
                self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
                self._path = path
            path = self._path
            start = os.lseek(self._fd, 0, os.SEEK_END)
            view = memoryview(b"".join(_line(k, v) for k, v in items))
            try:
                while view:
                    n = os.write(self._fd, view)
                    view = view[n:]
            except OSError:
                try:
                    os.ftruncate(self._fd, start)  # our own segment: no torn line stays behind
                except OSError:
                    pass
                raise
        except OSError as e:  # a full disk: the batch's answers are saved first (``raise_failure``)
            self.failure = OSError(e.errno, e.strerror, path)

    def raise_failure(self) -> None:
        """Raise the write error of the store (a full disk), once the caller has saved what the
        failed write held elsewhere (the run's shard): the answers are never lost with the cache."""
        if self.failure is not None:
            raise self.failure

    def close(self) -> None:
        if self._fd is not None:
            try:
                os.close(self._fd)
            except OSError:
                pass
            self._fd = None

    def stats(self) -> Dict[str, int]:
        return {"hits": self.hits, "misses": self.misses}
