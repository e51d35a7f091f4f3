"""The one output commit: a command's outputs are staged, then renamed into place together.

Why: writing results file by file lets a failure half-way (a record that cannot be encoded,
a full disk, a kill) leave ``.results.json`` beside a stale or missing ``.per_sample.json``.
Here every output is first written in full under a temporary name beside its target (same
folder, so the rename is atomic); only when all are written are they renamed into place, the
commit-point file last. A failure before that removes the staged files: the previous state
stays. A kill leaves only temporary names, which ``clean_stale_temps`` removes at the next
start of any command in that folder.

The renames themselves are several steps, so before the first one a *journal*
(``.commit~<host>-<pid>~<random>.json``, beside the commit point) lists every rename, removal
and index line of the unit; it is removed after the last. A kill between two renames leaves
the journal: the next start (``clean_stale_temps``, through ``recover_commits``) completes the
unit from it (every staged file is whole and synced before the journal exists), so a folder
never keeps half of one command's outputs beside half of another's. The states, in order:
staging (temporaries only: rolled back), journal written (rolled forward), renamed, removed,
index line appended (at most once: the line carries the unit's id), journal removed (done).

Temporary names: ``.tmp-<target name>~<host>-<pid>~<random>``. A temporary of a process that is
still alive on this host is never removed (two commands may share a folder).
"""
from __future__ import annotations

import errno
import hashlib
import json
import logging
import os
import re
import secrets
import shutil
import socket
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

from .errors import ReformError, input_error
from .inputs import MAX_DEPTH, parse_json, read_text
from .runlock import pid_alive

logger = logging.getLogger(__name__)

TMP_PREFIX = ".tmp-"
#: a unit's journal: what its renames, removals and index lines are (``recover_commits``)
JOURNAL_PREFIX = ".commit~"
#: a temporary of another host (a shared disk) is stale after this many seconds
FOREIGN_TEMP_AGE_S = 24 * 3600
#: a temporary whose name carries no owner is stale after this many seconds
UNOWNED_TEMP_AGE_S = 3600
_OWNER = re.compile(r"~([0-9a-f]{8})-([0-9]+)")


def _host() -> str:
    return hashlib.sha256(socket.gethostname().encode("utf-8", "replace")).hexdigest()[:8]


#: a file name's limit on common filesystems; a temporary's name must fit too
NAME_MAX = 255


def name_max(directory: str) -> int:
    """The longest file name (bytes) the file system of ``directory`` (or of its nearest existing
    parent) takes; ``NAME_MAX`` where it does not say."""
    d = os.path.abspath(directory)
    while not os.path.isdir(d) and os.path.dirname(d) != d:
        d = os.path.dirname(d)
    try:
        return min(NAME_MAX, int(os.pathconf(d, "PC_NAME_MAX")))
    except (OSError, ValueError, AttributeError):
        return NAME_MAX


def check_names(paths: "list[str] | tuple[str, ...]", what: str = "output") -> None:
    """Every name a command will write must fit its file system, checked before the first write:
    a name too long failed at its rename, after the outputs before it were in place (a
    ``.results.md`` without its ``.results.json``). One line naming the longest."""
    for path in paths:
        name = os.path.basename(os.path.normpath(path))
        size = len(name.encode("utf-8", "surrogatepass"))
        limit = name_max(os.path.dirname(os.path.abspath(path)))
        if size > limit:
            raise ReformError(f"{path}: the {what} name is {size} bytes, over the file system's limit of {limit}; "
                              "nothing was written (use a shorter name)")


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
    """The start-up clean-up: complete the units a gone process left half-renamed (their
    journals: ``recover_commits``), then remove our temporaries (files or folders named
    ``.tmp-*``) left in ``directory`` and its sub-folders down to ``depth`` by a process that is
    gone; returns how many temporaries were removed."""
    for folder in _folders(directory, depth):  # every journal first: a unit's temporaries may lie
        recover_commits(folder, root=directory)  # in another folder than its journal
    n = 0
    kept = set().union(*(_journaled_temps(folder, directory) for folder in _folders(directory, depth)))
    for folder in _folders(directory, depth):
        try:
            names = os.listdir(folder)
        except OSError:
            continue
        for name in names:
            if name.startswith(TMP_PREFIX) and _is_stale(folder, name) \
                    and os.path.abspath(os.path.join(folder, name)) not in kept:
                _remove(os.path.join(folder, name))
                n += 1
    return n


def _folders(directory: str, depth: int) -> List[str]:
    """``directory`` and its sub-folders down to ``depth`` (not ours, not through links)."""
    out = [directory]
    if depth > 0:
        try:
            names = sorted(os.listdir(directory))
        except OSError:
            return out
        for name in names:
            full = os.path.join(directory, name)
            if not name.startswith(TMP_PREFIX) and os.path.isdir(full) and not os.path.islink(full):
                out += _folders(full, depth - 1)
    return out


def recover_commits(directory: str, root: Optional[str] = None) -> int:
    """Complete every unit whose journal a gone process left in ``directory``: the renames not
    yet done are done (a staged file still there is whole), then the removals and the index lines
    not yet appended; the journal goes last. Every path a journal names must lie inside ``root``
    (the output tree being started in; default ``directory``), else it is set aside.
    Returns how many units were completed."""
    try:
        names = sorted(n for n in os.listdir(directory) if n.startswith(JOURNAL_PREFIX))
    except OSError:
        return 0
    done = 0
    for name in names:
        path = os.path.join(directory, name)
        if not _is_stale(directory, name):
            continue
        try:
            journal = read_journal(path, root=root or directory)
        except ReformError as e:  # never a crash loop: the journal is set aside, named once
            _set_aside(directory, name, str(e))
            continue
        try:
            whole = _roll_forward(journal)
        except OSError:
            continue  # the folder is not writable now: the next start tries again
        if not whole:
            logger.warning("%s: a staged output of this unit is gone, so it cannot be completed; its outputs "
                           "that were in place are removed (run the command again)", path)
        _remove(path)
        done += 1
    return done


def _journaled_temps(folder: str, root: str) -> set:
    """The staged files the journals left in ``folder`` still name (never removed as stale:
    the unit completes from them)."""
    out: set = set()
    try:
        names = [n for n in os.listdir(folder) if n.startswith(JOURNAL_PREFIX)]
    except OSError:
        return out
    for name in names:
        try:
            out.update(os.path.abspath(tmp) for tmp, _ in read_journal(os.path.join(folder, name), root)["renames"])
        except ReformError:
            continue
    return out


#: a journal nests lists of pairs and an index line's mapping: deeper JSON is not a journal (and
#: is refused before the parser recurses into it)
JOURNAL_MAX_DEPTH = MAX_DEPTH
#: a journal set aside (not a journal): renamed so that no start reads it again
SET_ASIDE_PREFIX = ".bad-commit~"


def _inside(path: str, root: str) -> bool:
    """Is ``path`` (absolute, no ``..``) inside ``root`` once the links of its folder are
    resolved? (The last part itself is what is renamed or removed, so a link there is the link.)"""
    if not os.path.isabs(path) or any(part in ("..", ".") for part in path.split(os.sep)) \
            or os.path.basename(path) in ("", "..", "."):
        return False
    real = os.path.join(os.path.realpath(os.path.dirname(path)), os.path.basename(path))
    top = os.path.realpath(root)
    return real != top and os.path.commonpath([real, top]) == top


def read_journal(path: str, root: Optional[str] = None) -> Dict[str, Any]:
    """A commit journal, its shape checked: ``renames`` (pairs of a staged temporary and its
    target in the same folder), ``removals`` (paths) and ``appends`` (pairs of an index path and
    a mapping); else a ReformError naming the file and the field. Every path it names must lie
    inside ``root`` (default: the journal's folder): a journal acts on the output tree it was
    found in and nowhere else (a forged one removed folders elsewhere)."""
    journal = parse_json(read_text(path, "commit journal"), path, max_depth=JOURNAL_MAX_DEPTH)
    if not isinstance(journal, dict):
        raise input_error(f"not a commit journal (a JSON {type(journal).__name__}, not a mapping)", file=path)

    def pairs(field: str, second: type) -> None:
        value = journal.get(field)
        if not isinstance(value, list):
            raise input_error(f"not a commit journal ({field} is {type(value).__name__}, not a list)", file=path)
        for i, item in enumerate(value):
            if not (isinstance(item, list) and len(item) == 2 and isinstance(item[0], str) and item[0]
                    and isinstance(item[1], second)):
                raise input_error(f"not a commit journal ({field}[{i}] is not a pair of a path and a "
                                  f"{'path' if second is str else 'mapping'})", file=path)
    pairs("renames", str)
    pairs("appends", dict)
    for tmp, target in journal["renames"]:
        if not os.path.basename(tmp).startswith(TMP_PREFIX) or os.path.dirname(tmp) != os.path.dirname(target) \
                or not os.path.isabs(tmp):
            raise input_error(f"not a commit journal (renames {os.path.basename(tmp)[:80]!r}: not a staged "
                              "temporary beside its target)", file=path)
    removals = journal.get("removals")
    if not isinstance(removals, list) or not all(isinstance(r, str) and os.path.isabs(r) for r in removals):
        raise input_error("not a commit journal (removals is not a list of absolute paths)", file=path)
    top = root if root is not None else os.path.dirname(os.path.abspath(path))
    named = [p for pair in journal["renames"] for p in pair] + removals + [i for i, _ in journal["appends"]]
    for p in named:
        if not _inside(p, top):
            raise input_error(f"not a commit journal (it names {p[:200]!r}, outside the output folder "
                              f"{top})", file=path)
    return journal


def _set_aside(directory: str, name: str, why: str) -> None:
    """Rename a file that is not a journal out of the journals' names, with one line naming it."""
    aside = SET_ASIDE_PREFIX + name[len(JOURNAL_PREFIX):]
    try:
        os.replace(os.path.join(directory, name), os.path.join(directory, aside))
    except OSError as e:
        logger.warning("%s (left in place: cannot rename it, %s)", why, e.strerror or e)
        return
    logger.warning("%s; set aside as %s (the outputs it names were not completed from it)", why,
                   os.path.join(directory, aside))


def _roll_forward(journal: Dict[str, Any]) -> bool:
    """The steps of one unit that are not done yet (each step can be repeated safely). A unit
    whose staged file is gone before its target was put in place can never be completed: the
    outputs of it that are in place are removed (none of a unit rather than half of it) and no
    index line is appended (it would name a missing file); returns False then."""
    for tmp, target in journal["renames"]:
        if os.path.lexists(tmp):
            _put_in_place(tmp, target)
    if not all(os.path.lexists(target) for _, target in journal["renames"]):
        for _, target in reversed(journal["renames"]):
            _discard(target)
        return False
    for target in journal["removals"]:
        _discard(target)
    for index, entry in journal["appends"]:
        append_jsonl_once(index, entry)
    return True


def _put_in_place(tmp: str, target: str) -> None:
    """Rename a staged file or folder onto ``target``; a folder replaces the old folder whole."""
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


def _discard(target: str) -> None:
    """Remove ``target`` in one step: renamed to an owned temporary first (a kill leaves a
    temporary the next start removes, never a half-removed folder), then removed."""
    if os.path.lexists(target):
        old = os.path.join(os.path.dirname(target), temp_name(os.path.basename(target)))
        os.rename(target, old)
        _remove(old)


def discard(target: str) -> None:
    """Remove a file or folder in one step (see ``_discard``); nothing if it is not there."""
    try:
        _discard(os.path.abspath(target))
    except FileNotFoundError:
        pass


def append_jsonl_once(path: str, entry: Dict[str, Any]) -> None:
    """Append ``entry`` as one line to an index (O_APPEND: concurrent writers never interleave),
    unless a line with its ``commit`` id is already there (a recovered unit appends at most once).
    A full disk's short write is cut back, so the index keeps whole lines."""
    key = entry.get("commit")
    if key and os.path.exists(path):
        with open(path, "rb") as f:
            if f'"commit": "{key}"'.encode("ascii") in f.read():
                return
    line = (json.dumps(entry, ensure_ascii=False, default=str) + "\n").encode("utf-8")
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        start = os.lseek(fd, 0, os.SEEK_END)
        try:
            n = os.write(fd, line)
            if n != len(line):
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), path)
        except OSError as e:
            try:
                os.ftruncate(fd, start)
            except OSError:
                pass
            raise OSError(e.errno, e.strerror, path) from None
    finally:
        os.close(fd)


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
        self.appends: List[Tuple[str, Dict[str, Any]]] = []
        self.after: List[Callable[[], None]] = []
        self.done = False
        self.journaled = False
        self.id = secrets.token_hex(8)

    # -- staging
    def _stage(self, target: str) -> str:
        target = os.path.abspath(target)
        directory = os.path.dirname(target)
        check_names([target])
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
        """Run ``action`` after every output is in place (not journaled: a kill may skip it)."""
        self.after.append(action)

    def append_line(self, index: str, entry: Dict[str, Any]) -> None:
        """Append ``entry`` (a JSON line, e.g. the run index's) to ``index`` once every output is
        in place; journaled with the unit, so a kill before it is completed by the next start, and
        it carries the unit's id (``commit``) so it is appended at most once."""
        self.appends.append((os.path.abspath(index), {**entry, "commit": self.id}))

    # -- commit / abort
    def commit(self) -> None:
        """Rename every staged output into place (a folder replaces the old folder whole)."""
        order = [s for s in self.staged if s[1] != self.last] + [s for s in self.staged if s[1] == self.last]
        try:
            check_names([target for _, target in order])
        except ReformError:
            self.abort()
            raise
        for tmp, target in order:  # every conflict before the first rename
            is_dir = os.path.isdir(tmp) and not os.path.islink(tmp)
            if os.path.lexists(target) and (os.path.isdir(target) and not os.path.islink(target)) != is_dir:
                self.abort()
                raise ReformError(f"{target}: exists and is {'not ' if is_dir else ''}a folder; nothing was "
                                  "changed (remove it or choose another output folder)")
        if not (order or self.removals or self.appends):
            self.done = True
            for action in self.after:
                action()
            return
        journal = {"what": self.what, "renames": [list(s) for s in order], "removals": list(self.removals),
                   "appends": [list(a) for a in self.appends]}
        try:
            journal_path = self._write_journal(journal)
        except OSError as e:
            self.abort()
            raise ReformError(f"{self.what}: cannot write the commit journal ({e.strerror or e}); nothing was "
                              "changed") from None
        except BaseException:
            self.abort()
            raise
        # from here on the unit completes: now, or from the journal at the next start
        self.journaled = True
        try:
            _roll_forward(journal)
        except OSError as e:
            raise ReformError(f"{self.what}: cannot move outputs into place ({e.strerror or e} "
                              f"({getattr(e, 'filename', None) or 'a staged file'})); the next start of a command "
                              f"in {os.path.dirname(journal_path)} completes it from {os.path.basename(journal_path)}"
                              ) from None
        _remove(journal_path)
        self.staged = []
        self.done = True
        for action in self.after:
            action()

    def _write_journal(self, journal: Dict[str, Any]) -> str:
        """The unit's journal, whole and synced, renamed into place beside the commit point."""
        anchor = self.last or (self.staged[0][1] if self.staged else
                               (self.removals[0] if self.removals else self.appends[0][0]))
        directory = os.path.dirname(anchor)
        path = os.path.join(directory, f"{JOURNAL_PREFIX}{_host()}-{os.getpid()}~{secrets.token_hex(4)}.json")
        tmp = os.path.join(directory, temp_name(os.path.basename(path)))
        try:
            with open(tmp, "w", encoding="utf-8") as f:
                json.dump(journal, f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            if os.path.lexists(tmp):
                _remove(tmp)
            raise
        return path

    def abort(self) -> None:
        """Remove whatever is still staged (targets already renamed stay); once the journal is
        written the staged files belong to it (the next start completes the unit)."""
        if self.journaled:
            return
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
