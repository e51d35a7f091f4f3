"""The one output commit: a command's outputs are staged, then renamed into place together.

Why: writing results file by file lets a failure half-way (a record that cannot be encoded,
a full disk, a kill) leave ``.results.json`` beside a stale or missing ``.per_sample.json``.
Here every output is first written in full under a temporary name beside its target (same
folder, so the rename is atomic); only when all are written are they renamed into place, the
commit-point file last. A failure before that removes the staged files: the previous state
stays. A kill leaves only temporary names, which ``clean_stale_temps`` removes at the next
start of any command in that folder.

Temporary names: ``.tmp-<target name>~<host>-<pid>~<random>``. A temporary of a process that is
still alive on this host is never removed (two commands may share a folder).
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import secrets
import shutil
import socket
import time
from typing import Any, Callable, List, Optional, Tuple

from utils.errors import ReformError
from utils.runlock import pid_alive

TMP_PREFIX = ".tmp-"
#: a temporary of another host (a shared disk) is stale after this many seconds
FOREIGN_TEMP_AGE_S = 24 * 3600
#: a temporary whose name carries no owner is stale after this many seconds
UNOWNED_TEMP_AGE_S = 3600
_OWNER = re.compile(r"~([0-9a-f]{8})-([0-9]+)")


def _host() -> str:
    return hashlib.sha256(socket.gethostname().encode("utf-8", "replace")).hexdigest()[:8]


#: a file name's limit on common filesystems; a temporary's name must fit too
NAME_MAX = 255


def owner_prefix(target: str) -> str:
    """``.tmp-<target>~<host>-``: add the pid (and anything unique) for a temporary name. A long
    target is shortened (with a hash of the whole) so the temporary name stays under NAME_MAX."""
    if len(target.encode("utf-8", "surrogatepass")) > NAME_MAX - 64:
        digest = hashlib.sha256(target.encode("utf-8", "surrogatepass")).hexdigest()[:12]
        target = target.encode("utf-8", "surrogatepass")[:NAME_MAX - 96].decode("utf-8", "ignore") + "-" + digest
    return f"{TMP_PREFIX}{target}~{_host()}-"


def temp_name(target: str) -> str:
    """A fresh temporary name for ``target`` (a basename), owned by this process."""
    return f"{owner_prefix(target)}{os.getpid()}~{secrets.token_hex(4)}"


def _is_stale(directory: str, name: str) -> bool:
    """A temporary of a process gone from this host, or of another host (or an older naming)
    and old enough that no command can still be writing it."""
    owner = _OWNER.search(name)
    if owner and owner.group(1) == _host():
        pid = int(owner.group(2))
        return pid != os.getpid() and not pid_alive(pid)
    try:
        age = time.time() - os.lstat(os.path.join(directory, name)).st_mtime
    except OSError:
        return False
    return age > (FOREIGN_TEMP_AGE_S if owner else UNOWNED_TEMP_AGE_S)


def clean_stale_temps(directory: str, depth: int = 1) -> int:
    """Remove our temporaries (files or folders named ``.tmp-*``) left in ``directory`` and its
    sub-folders down to ``depth`` by a process that is gone; returns how many."""
    n = 0
    try:
        names = os.listdir(directory)
    except OSError:
        return 0
    for name in names:
        full = os.path.join(directory, name)
        if name.startswith(TMP_PREFIX):
            if _is_stale(directory, name):
                _remove(full)
                n += 1
        elif depth > 0 and os.path.isdir(full) and not os.path.islink(full):
            n += clean_stale_temps(full, depth - 1)
    return n


def _remove(path: str) -> None:
    try:
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path, ignore_errors=True)
        else:
            os.unlink(path)
    except FileNotFoundError:
        pass


def _mode_file(path: str) -> None:
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(path, 0o666 & ~umask)


class Commit:
    """Stage outputs, then rename them into place as one unit.

    ``with Commit("results") as c: c.write_json(path, obj); c.write_text(path2, text)``: the
    files appear when the block ends without an error; on an error nothing changed. Folders:
    ``d = c.folder(path)`` gives an empty staged folder to fill; at commit it replaces ``path``
    as a whole (nothing of an older folder survives). Targets are renamed in the order they
    were staged, except ``last`` (the commit point: e.g. ``.results.json``) which goes last.
    """

    def __init__(self, what: str = "outputs") -> None:
        self.what = what
        self.staged: List[Tuple[str, str]] = []  # (temporary, target)
        self.last: Optional[str] = None
        self.removals: List[str] = []
        self.after: List[Callable[[], None]] = []
        self.done = False

    # -- staging
    def _stage(self, target: str) -> str:
        target = os.path.abspath(target)
        directory = os.path.dirname(target)
        try:
            os.makedirs(directory, exist_ok=True)
        except OSError as e:
            raise ReformError(f"{directory}: cannot create folder ({e.strerror or e}); nothing was written") from None
        if any(t == target for _, t in self.staged):
            raise ReformError(f"{target}: written twice by one command")
        tmp = os.path.join(directory, temp_name(os.path.basename(target)))
        self.staged.append((tmp, target))
        return tmp

    def write(self, target: str, write: Callable[[Any], None], last: bool = False) -> str:
        """Stage ``target`` written by ``write(file)`` (text, UTF-8); returns ``target``."""
        tmp = self._stage(target)
        try:
            with open(tmp, "w", encoding="utf-8") as f:
                write(f)
                f.flush()
                os.fsync(f.fileno())
            _mode_file(tmp)
        except OSError as e:
            self.abort()
            raise ReformError(f"{target}: cannot write ({e.strerror or e}); nothing was changed") from None
        except (UnicodeEncodeError, ValueError, TypeError) as e:
            self.abort()
            raise ReformError(f"{target}: cannot write ({type(e).__name__}: {' '.join(str(e).split())[:200]}); "
                              "nothing was changed") from None
        if last:
            self.last = os.path.abspath(target)
        return target

    def write_json(self, target: str, obj: Any, indent: Optional[int] = 1, last: bool = False) -> str:
        def write(f: Any) -> None:
            if isinstance(obj, list) and indent is not None:
                # records: one per line, each by the C encoder (json.dump with an indent runs the
                # pure-Python encoder: a minute for 50,000 records, against a second)
                f.write("[")
                for i, item in enumerate(obj):
                    f.write(("\n" if i == 0 else ",\n") + json.dumps(item, ensure_ascii=False))
                f.write("\n]\n")
                return
            f.write(json.dumps(obj, ensure_ascii=False, indent=indent))
            f.write("\n")
        return self.write(target, write, last)

    def write_text(self, target: str, text: str, last: bool = False) -> str:
        return self.write(target, lambda f: f.write(text), last)

    def folder(self, target: str) -> str:
        """An empty staged folder that replaces ``target`` at commit; returns its path."""
        tmp = self._stage(target)
        try:
            os.mkdir(tmp)
        except OSError as e:
            self.abort()
            raise ReformError(f"{target}: cannot create folder ({e.strerror or e}); nothing was changed") from None
        return tmp

    def remove(self, target: str) -> None:
        """Remove ``target`` (a file or folder an older output left) at commit."""
        self.removals.append(os.path.abspath(target))

    def on_commit(self, action: Callable[[], None]) -> None:
        """Run ``action`` after every output is in place (e.g. append the run index line)."""
        self.after.append(action)

    # -- commit / abort
    def commit(self) -> None:
        """Rename every staged output into place (a folder replaces the old folder whole)."""
        order = [s for s in self.staged if s[1] != self.last] + [s for s in self.staged if s[1] == self.last]
        for tmp, target in order:  # every conflict before the first rename
            is_dir = os.path.isdir(tmp) and not os.path.islink(tmp)
            if os.path.lexists(target) and (os.path.isdir(target) and not os.path.islink(target)) != is_dir:
                self.abort()
                raise ReformError(f"{target}: exists and is {'not ' if is_dir else ''}a folder; nothing was "
                                  "changed (remove it or choose another output folder)")
        try:
            for tmp, target in order:
                if os.path.isdir(tmp) and not os.path.islink(tmp):
                    if os.path.lexists(target):
                        old = os.path.join(os.path.dirname(target), temp_name(os.path.basename(target)))
                        os.rename(target, old)
                        os.rename(tmp, target)
                        _remove(old)
                    else:
                        os.rename(tmp, target)
                else:
                    os.replace(tmp, target)
            for target in self.removals:
                if os.path.lexists(target):
                    old = os.path.join(os.path.dirname(target), temp_name(os.path.basename(target)))
                    os.rename(target, old)
                    _remove(old)
        except OSError as e:
            self.abort()
            raise ReformError(f"{self.what}: cannot move outputs into place ({e.strerror or e})") from None
        except BaseException:
            self.abort()
            raise
        self.staged = []
        self.done = True
        for action in self.after:
            action()

    def abort(self) -> None:
        """Remove whatever is still staged (targets already renamed stay)."""
        for tmp, _ in self.staged:
            if os.path.lexists(tmp):
                _remove(tmp)
        self.staged = []

    def __enter__(self) -> "Commit":
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is None:
            self.commit()
        else:
            self.abort()
