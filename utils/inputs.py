"""The one input boundary: every file the harness reads comes through here.

Why one layer: guarantees checked reader by reader leak again through the next reader nobody
tried. Here, whatever the benchmark, a file is read once and checked once for

* its name: a path or directory entry that is not UTF-8, a dangling symbolic link, two entries
  of one folder whose names differ only in case;
* its kind and size: a regular file (a FIFO would block), at most ``REFORM_MAX_INPUT_BYTES``,
  and for a zip archive (an ``.xlsx``) what its members inflate to as well, in total and as a
  ratio (``check_zip``, ``REFORM_MAX_ZIP_RATIO``);
* its text: UTF-8 with or without a BOM, else the byte offset and line of the first bad byte;
* its structure: JSON nested at most ``MAX_DEPTH`` levels (so no later ``deepcopy`` or
  recursive walk can overflow the stack), integers that fit 64 bits, finite numbers, strings
  that are valid Unicode (a lone surrogate is valid JSON but cannot be written back as UTF-8);
  CSV fields of at most ``MAX_CSV_FIELD`` characters and rows of the header's width.

Every failure is a ``ReformError`` of one line naming the file, the record and the field.
"""
from __future__ import annotations

import csv
import io
import json
import math
import os
import re
import stat
import zipfile
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

from .errors import input_error
from .secrets import Secret

#: default size limit of one input file (bytes); REFORM_MAX_INPUT_BYTES changes it
DEFAULT_MAX_INPUT_BYTES = 4 * 1024 ** 3
#: most a zip member (an .xlsx sheet) may inflate, times its compressed size, once it inflates
#: past ZIP_RATIO_FLOOR; REFORM_MAX_ZIP_RATIO changes it. Spreadsheet XML deflates ~5-30x; a
#: 1 MB file inflating to 1 GB (1000x) is a bomb, however far under the size limit
DEFAULT_MAX_ZIP_RATIO = 100
#: a member inflating to at most this many bytes is never refused for its ratio
ZIP_RATIO_FLOOR = 64 * 1024 ** 2
#: deepest nesting of JSON/YAML values accepted (records need < 10)
MAX_DEPTH = 64
#: largest integer magnitude accepted (a 64-bit signed integer)
MAX_INT = 2 ** 63 - 1
#: a run of digits long enough to be an integer past 64 bits (then the slow walk decides)
_LONG_NUMBER = re.compile(r"\d{19,}")
#: longest CSV field accepted (characters; the MMMT-IF release's longest field is ~1.3k)
MAX_CSV_FIELD = 1024 * 1024


#: the most values (mappings, lists and scalars together) one option value may hold
MAX_OPTION_ITEMS = 10_000


def plain_data_problem(value: Any, json_only: bool = False) -> Optional[str]:
    """Why ``value`` (a parsed option value) is not plain data, or None: a recursive alias
    (``&x {a: *x}``, which ended a run as a RecursionError), nesting deeper than MAX_DEPTH or
    more than MAX_OPTION_ITEMS values. ``json_only``: also only JSON's types, text keys and
    finite numbers (a NaN or 1e309 is no JSON a server accepts)."""
    count = 0
    stack: List[Tuple[Any, int, Tuple[int, ...]]] = [(value, 0, ())]
    while stack:
        v, depth, path = stack.pop()
        count += 1
        if count > MAX_OPTION_ITEMS:
            return f"more than {MAX_OPTION_ITEMS} values"
        if depth > MAX_DEPTH:
            return f"nested deeper than {MAX_DEPTH}"
        if isinstance(v, (dict, list, tuple, set, frozenset)):
            if id(v) in path:
                return "a recursive alias (a value that contains itself)"
            inner = path + (id(v),)
            if isinstance(v, dict):
                if json_only and not all(isinstance(k, str) for k in v):
                    return "a key that is not text"
                items: Any = v.values()
            elif isinstance(v, (set, frozenset)) and json_only:
                return "a set (not JSON)"
            else:
                items = v
            stack.extend((x, depth + 1, inner) for x in items)
        elif json_only:
            if isinstance(v, float) and not math.isfinite(v):
                return f"a number that is not finite ({v!r}: not JSON)"
            if not (v is None or isinstance(v, (str, bool, int, float, Secret))):  # (a Secret: text sent)
                return f"a {type(v).__name__} (not JSON)"
    return None


def max_input_bytes() -> int:
    """The file size limit in force: ``REFORM_MAX_INPUT_BYTES`` or the default."""
    raw = os.environ.get("REFORM_MAX_INPUT_BYTES")
    try:
        return int(raw) if raw else DEFAULT_MAX_INPUT_BYTES
    except ValueError:
        raise input_error(f"must be a whole number of bytes, got {raw!r}", field="REFORM_MAX_INPUT_BYTES") from None


def max_zip_ratio() -> float:
    """The inflation ratio limit in force: ``REFORM_MAX_ZIP_RATIO`` or the default."""
    raw = os.environ.get("REFORM_MAX_ZIP_RATIO")
    try:
        value = float(raw) if raw else float(DEFAULT_MAX_ZIP_RATIO)
    except ValueError:
        value = math.nan
    if not value >= 1:  # NaN too
        raise input_error(f"must be a number of at least 1, got {raw!r}", field="REFORM_MAX_ZIP_RATIO")
    return value


# --------------------------------------------------------------------------- names
def check_name(path: str, what: str = "path") -> str:
    """``path`` itself, if it can be written as UTF-8 (a name of undecodable bytes arrives as
    lone surrogates and would fail later, when a results file names it)."""
    try:
        path.encode("utf-8")
    except UnicodeEncodeError:
        raise input_error(f"{what} name is not UTF-8 ({ascii(path)}); rename it") from None
    return path


def list_dir(path: str, what: str = "folder", suffix: Optional[Sequence[str]] = None,
             kind: Optional[str] = None) -> List[str]:
    """Sorted entry names of ``path`` (those ending with ``suffix``; ``kind`` "file" or "dir"
    keeps only regular files or folders).

    Refused, naming the entries: a name that is not UTF-8; a symbolic link whose target is
    missing (it would be silently skipped or fail half-way); two names that differ only in
    case (``existence.txt`` and ``Existence.txt``: one would be silently dropped, and on a
    case-insensitive disk they are one file)."""
    check_name(path, what)
    try:
        names = sorted(os.listdir(path))
    except FileNotFoundError:
        raise input_error(f"{what} not found", file=path) from None
    except NotADirectoryError:
        raise input_error(f"{what} is not a folder", file=path) from None
    except OSError as e:
        raise input_error(f"cannot list {what} ({e.strerror or e})", file=path) from None
    out: List[str] = []
    folded: Dict[str, str] = {}
    for name in names:
        full = os.path.join(path, name)
        try:
            name.encode("utf-8")
        except UnicodeEncodeError:
            raise input_error(f"holds an entry whose name is not UTF-8 ({ascii(name)}); rename it", file=path) from None
        if suffix is not None and not name.endswith(tuple(suffix)):
            continue
        if os.path.islink(full) and not os.path.exists(full):
            raise input_error(f"is a dangling symbolic link (to {os.readlink(full)!r}); remove it or fix "
                              "its target", file=full)
        if kind == "file" and not os.path.isfile(full) or kind == "dir" and not os.path.isdir(full):
            continue
        twin = folded.get(name.casefold())
        if twin is not None:
            raise input_error(f"holds both {twin!r} and {name!r}, names that differ only in case; "
                              "keep one", file=path)
        folded[name.casefold()] = name
        out.append(name)
    return out


# --------------------------------------------------------------------------- bytes and text
def check_file(path: str, what: str = "file") -> None:
    """Refuse, in one line, what ``read_bytes`` would not read: a missing file or dangling link,
    a directory or other non-regular file, a file over ``max_input_bytes()``."""
    check_name(path, what)
    try:
        st = os.stat(path)
    except FileNotFoundError:
        if os.path.islink(path):
            raise input_error(f"{what} is a dangling symbolic link (to {os.readlink(path)!r})", file=path) from None
        raise input_error(f"{what} not found", file=path) from None
    except OSError as e:
        raise input_error(f"cannot read {what} ({e.strerror or e})", file=path) from None
    if stat.S_ISDIR(st.st_mode):
        raise input_error(f"{what} is a directory", file=path)
    if not stat.S_ISREG(st.st_mode):
        raise input_error(f"{what} is not a regular file", file=path)
    limit = max_input_bytes()
    if st.st_size > limit:
        raise input_error(f"{what} is {st.st_size} bytes, over the limit of {limit}; raise it with "
                          "REFORM_MAX_INPUT_BYTES=<bytes> if the file is trusted", file=path)


def read_bytes(path: str, what: str = "file") -> bytes:
    """The bytes of a regular file of at most ``max_input_bytes()``; one line otherwise."""
    check_file(path, what)
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as e:
        raise input_error(f"cannot read {what} ({e.strerror or e})", file=path) from None


def check_zip(path: str, what: str = "zip file") -> None:
    """Refuse, in one line, a zip archive (an ``.xlsx`` is one) whose members would inflate past
    ``max_input_bytes()`` together, a member inflating past ``ZIP_RATIO_FLOOR`` and more than
    ``max_zip_ratio()`` times its compressed size (the size limit alone let a 1 MB file inflate
    to 1 GB), or members compressed otherwise than stored or deflated.

    Why the declared sizes suffice: Python's ``zipfile`` yields at most a member's declared size
    (deflate is inflated in bounded steps, then cut there; a member that holds more fails its
    CRC), so the sum bounds everything a reader of the archive can inflate. Other methods
    (bzip2, lzma) inflate one read without a bound, and no spreadsheet writer uses them."""
    check_file(path, what)
    try:
        with zipfile.ZipFile(path) as z:
            infos = z.infolist()
    except (zipfile.BadZipFile, OSError, ValueError, EOFError) as e:
        raise input_error(f"{what} is not a readable zip archive ({type(e).__name__}: {e})", file=path) from None
    limit = max_input_bytes()
    total = sum(i.file_size for i in infos)
    if total > limit:
        raise input_error(f"{what} inflates to {total} bytes, over the limit of {limit} (a zip bomb?); raise it with "
                          "REFORM_MAX_INPUT_BYTES=<bytes> if the file is trusted", file=path)
    ratio = max_zip_ratio()
    bomb = next((i for i in infos if i.file_size > ZIP_RATIO_FLOOR and i.file_size > ratio * i.compress_size), None)
    if bomb is not None:
        raise input_error(f"{what} member {bomb.filename!r} inflates from {bomb.compress_size} to {bomb.file_size} "
                          f"bytes, over {ratio:g} times (a zip bomb?); raise it with REFORM_MAX_ZIP_RATIO=<n> if "
                          "the file is trusted", file=path)
    odd = next((i for i in infos if i.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED)), None)
    if odd is not None:
        raise input_error(f"{what} member {odd.filename!r} uses zip compression method {odd.compress_type}; only "
                          "stored and deflated members are read", file=path)


def decode(raw: bytes, path: str, what: str = "file") -> str:
    """UTF-8 text, a leading BOM dropped; else the byte offset and line of the first bad byte."""
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        line = raw[: e.start].count(b"\n") + 1
        raise input_error(f"{what} is not UTF-8 text (byte 0x{raw[e.start]:02x} at offset {e.start}, line {line}); "
                          "save it as UTF-8", file=path) from None


def read_text(path: str, what: str = "file") -> str:
    """The UTF-8 text of a regular file (see ``read_bytes`` and ``decode``)."""
    return decode(read_bytes(path, what), path, what)


# --------------------------------------------------------------------------- JSON values
def check_value(value: Any, file: Optional[str] = None, record: Optional[Any] = None, field: Optional[str] = None,
                max_depth: int = MAX_DEPTH, finite: bool = True) -> None:
    """Walk a parsed value without recursion: nesting at most ``max_depth``, integers within
    64 bits, numbers finite (``finite``), strings and keys valid Unicode."""
    stack: List[Tuple[Any, int]] = [(value, 0)]
    while stack:
        v, depth = stack.pop()
        if isinstance(v, str):
            try:
                v.encode("utf-8")
            except UnicodeEncodeError as e:
                raise input_error(f"holds a lone surrogate ({ascii(v[e.start])}), not valid Unicode text",
                                  file=file, record=record, field=field) from None
        elif isinstance(v, bool) or v is None:
            continue
        elif isinstance(v, int):
            if abs(v) > MAX_INT:
                raise input_error(f"integer of {len(str(abs(v)))} digits is too large (at most 64 bits)",
                                  file=file, record=record, field=field)
        elif isinstance(v, float):
            if finite and not math.isfinite(v):
                raise input_error(f"number {v!r} is not finite", file=file, record=record, field=field)
        elif isinstance(v, (dict, list)):
            if depth >= max_depth:
                raise input_error(f"nested too deeply (more than {max_depth} levels)", file=file, record=record, field=field)
            if isinstance(v, dict):
                for k, x in v.items():
                    stack.append((k, depth + 1))
                    stack.append((x, depth + 1))
            else:
                stack.extend((x, depth + 1) for x in v)


def _quick_ok(value: Any) -> bool:
    """True when ``value`` certainly passes ``check_value``: the C encoder refuses non-finite
    numbers, lone surrogates (on UTF-8 encoding) and deep nesting; integers are checked by their
    digits. False means: walk it to find (and name) the problem, if there is one."""
    try:
        text = json.dumps(value, ensure_ascii=False, allow_nan=False, check_circular=False)
        text.encode("utf-8")
    except (ValueError, UnicodeEncodeError, RecursionError, TypeError):
        return False
    return not _LONG_NUMBER.search(text) and _depth_ok(text)


def _depth_ok(text: str) -> bool:
    """Nesting of a JSON text at most MAX_DEPTH - 1 (brackets inside strings make it conservative)."""
    if text.count("[") + text.count("{") < MAX_DEPTH - 1:
        return True
    depth = deepest = 0
    for ch in text:
        if ch in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif ch in "]}":
            depth -= 1
    return deepest < MAX_DEPTH - 1


def check_record(rec: Any, file: Optional[str], record: Any) -> None:
    """``check_value`` for one record, the error naming the top-level field it is in."""
    if isinstance(rec, dict) and _quick_ok(rec):
        return
    if isinstance(rec, dict):
        for k, v in rec.items():
            check_value(k, file, record)
            check_value(v, file, record, str(k), max_depth=MAX_DEPTH - 1)
    else:
        check_value(rec, file, record)


class DuplicateKey(ValueError):
    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


def _unique_keys(pairs: Any) -> Dict[str, Any]:
    out: Dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise DuplicateKey(k)
        out[k] = v
    return out


def json_depth_within(text: str, limit: int) -> bool:
    """Whether the nesting of a JSON text stays within ``limit`` levels, found by a scan that
    skips strings: the parser's own recursion is never reached by a deeper text."""
    if text.count("[") + text.count("{") <= limit:
        return True
    depth = 0
    in_string = escaped = False
    for ch in text:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
            if depth > limit:
                return False
        elif ch in "]}":
            depth -= 1
    return True


def parse_json(text: str, path: str, where: Optional[str] = None, max_depth: Optional[int] = None) -> Any:
    """``json.loads`` whose every failure (malformed, too deep, huge numbers) is one line;
    the value is not yet checked (``check_value``/``check_record`` do that). ``max_depth``:
    nesting deeper than that is refused before the parser sees the text."""
    at = f" at {where}" if where else ""
    if max_depth is not None and not json_depth_within(text, max_depth):
        raise input_error(f"JSON nested too deeply (more than {max_depth} levels){at}", file=path)
    try:
        return json.loads(text, object_pairs_hook=_unique_keys)
    except DuplicateKey as e:
        raise input_error(f"key {e.key!r} is given twice in one object{at} (which one is meant?)", file=path) from None
    except json.JSONDecodeError as e:
        loc = where or f"line {e.lineno} column {e.colno}"
        raise input_error(f"malformed JSON at {loc}: {e.msg}", file=path) from None
    except RecursionError:
        raise input_error(f"JSON nested too deeply (more than {MAX_DEPTH} levels){at}", file=path) from None
    except ValueError as e:  # e.g. an integer of thousands of digits
        raise input_error(f"unreadable JSON value{at} ({e})", file=path) from None


_BOM = b"\xef\xbb\xbf"
#: how much of a file ``first_line`` reads at a time
_LINE_CHUNK = 1 << 16


def first_line(path: str) -> str:
    """The first non-blank line of a file, whole whatever its length (a thinking model's response
    can make it megabytes), decoded as ``decode`` does (a BOM dropped; undecodable bytes replaced:
    the caller only recognises a format by it); "" for an unreadable or blank file.

    Why not the first bytes: a record cut at a fixed size is not JSON, and a file of another
    harness would then be read as the wrong format. Reading stops at ``max_input_bytes()``: a
    larger file is refused when it is read."""
    limit, buf, start, scan = max_input_bytes(), bytearray(), 0, 0
    try:
        with open(path, "rb") as f:
            while len(buf) <= limit:
                chunk = f.read(_LINE_CHUNK)
                if not chunk:
                    break
                buf += chunk
                if start == 0 and buf.startswith(_BOM):
                    start = scan = len(_BOM)
                while True:
                    end = buf.find(b"\n", scan)
                    if end < 0:
                        scan = len(buf)  # each byte is searched once
                        break
                    if buf[start:end].strip():
                        return _line_text(bytes(buf[start:end]))
                    start = scan = end + 1
    except OSError:
        return ""
    return _line_text(bytes(buf[start:]))


def _line_text(raw: bytes) -> str:
    return raw.decode("utf-8", errors="replace").strip("\r\n")


def read_json(path: str, what: str = "JSON file") -> Any:
    """A whole JSON file, checked (``check_value``)."""
    value = parse_json(read_text(path, what), path)
    check_value(value, path)
    return value


def iter_jsonl(path: str, what: str = "JSONL file", text: Optional[str] = None) -> Iterator[Tuple[int, Any]]:
    """(line number, value) of each non-blank line, each checked as a record of that line."""
    text = read_text(path, what) if text is None else text
    for lineno, line in enumerate(text.split("\n"), 1):
        if not line.strip():
            continue
        value = parse_json(line, path, f"line {lineno}")
        check_record(value, path, f"line {lineno}")
        yield lineno, value


def read_records(path: str, what: str = "prediction file") -> List[Any]:
    """A JSON array or JSONL file -> its values, each checked as a record (``check_record``)."""
    text = read_text(path, what)
    stripped = text.lstrip()
    if stripped.startswith("["):
        data = parse_json(text, path)
        if isinstance(data, list):
            for i, rec in enumerate(data):
                check_record(rec, path, i)
        return data
    if stripped.startswith("{") and not _parses(stripped.split("\n", 1)[0]):
        # one object over several lines: valid JSON, but no records (a results or run file)
        parse_json(text, path)
        raise input_error(f"holds one JSON object, not records (a {what} is a JSON array of records or one "
                          "record per line); is it a results, run or comparison file?", file=path)
    return [v for _, v in iter_jsonl(path, what, text)]


def _parses(line: str) -> bool:
    try:
        json.loads(line)
    except ValueError:
        return False
    return True


# --------------------------------------------------------------------------- CSV
def read_csv(path: str, what: str = "CSV file", required: Sequence[str] = (),
             delimiter: str = ",") -> Tuple[List[str], List[Dict[str, str]]]:
    """(header, rows as dicts) of a UTF-8 CSV file (``delimiter="\t"``: a TSV file). Refused in
    one line: a field over ``MAX_CSV_FIELD`` characters, a row of another width than the header,
    a missing ``required`` column, malformed quoting."""
    text = read_text(path, what)
    old = csv.field_size_limit()
    rows: List[Dict[str, str]] = []
    try:
        csv.field_size_limit(MAX_CSV_FIELD)
        reader = csv.reader(io.StringIO(text, newline=""), delimiter=delimiter)
        try:
            header = next(reader, [])
            for row in reader:
                if not row:
                    continue
                if len(row) != len(header):
                    raise input_error(f"has {len(row)} fields, the header has {len(header)}", file=path,
                                      record=f"line {reader.line_num}")
                rows.append(dict(zip(header, row)))
        except csv.Error as e:
            msg = str(e)
            if "field larger than field limit" in msg:
                msg = f"a field is longer than {MAX_CSV_FIELD} characters"
            raise input_error(f"unreadable CSV ({msg})", file=path, record=f"line {reader.line_num}") from None
    finally:
        csv.field_size_limit(old)
    missing = [c for c in required if c not in header]
    if missing:
        raise input_error(f"missing columns {missing}", file=path)
    return header, rows
