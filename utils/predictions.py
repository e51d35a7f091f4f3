"""Prediction records and files: the single reader and the single writer.

* A *record* is the sample without heavy objects (images become ``image_ids``) plus
  ``prediction`` and, for likelihood, ``candidate_logprobs``/``candidate_num_tokens``.
* Shards are JSONL files appended (and flushed) one record at a time, so a killed run loses
  at most the batch in flight; a torn last line is ignored and trimmed on resume.
* Final files are JSON arrays written atomically (``utils.commit``): a reader never sees a
  half-written file. Every file is read through ``utils.inputs``.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import threading
from typing import Any, Callable, Dict, Iterable, List, Optional, Tuple

from .commit import TMP_PREFIX, Commit, owner_prefix
from .errors import ReformError, input_error
from .inputs import check_name, check_record, read_records
from .schema import HEAVY_KEYS
from .surrogates import clean_surrogates
from .world import WORLD_ERRNOS, os_error_line

logger = logging.getLogger(__name__)

RecordKey = Tuple[str, int]

#: benchmark -> reader(directory) -> records, for benchmarks whose own tools write a
#: directory of results (e.g. the official MME format). Registered by metric modules.
PREDICTION_DIR_READERS: Dict[str, Callable[[str], List[Dict[str, Any]]]] = {}


#: benchmark -> writer(records, directory, **options): the benchmark's own results format
#: (e.g. the official MME tool's), registered by its metric module.
RESULTS_EXPORTERS: Dict[str, Callable[..., Any]] = {}


def register_prediction_dir_reader(benchmark: str, reader: Callable[[str], List[Dict[str, Any]]]) -> None:
    PREDICTION_DIR_READERS[benchmark] = reader


def register_results_exporter(benchmark: str, writer: Callable[..., Any]) -> None:
    RESULTS_EXPORTERS[benchmark] = writer


#: (benchmark, file extension) -> reader(path) -> records, for files that are not prediction
#: JSON (e.g. the MMMT-IF release CSV with its per-model scores). Registered by metric modules.
PREDICTION_FILE_READERS: Dict[Tuple[str, str], Callable[[str], List[Dict[str, Any]]]] = {}


def register_prediction_file_reader(benchmark: str, extension: str,
                                    reader: Callable[[str], List[Dict[str, Any]]]) -> None:
    PREDICTION_FILE_READERS[(benchmark, extension.lower())] = reader


class ForeignRecords(list):
    """Prediction records read from another harness's output, carrying what that output tells
    of the run's settings (``provenance``, the agreed provenance shape, unknown values None).

    Why a list: every consumer of records keeps working; scoring records the provenance."""

    def __init__(self, records: Iterable[Dict[str, Any]], provenance: Dict[str, Any]) -> None:
        super().__init__(records)
        self.provenance = provenance


#: readers of other harnesses' files, tried in order on any prediction file:
#: (name, accepts(path) -> bool from the name and the first record (utils.inputs.first_line), reader(path) -> records)
FOREIGN_READERS: List[Tuple[str, Callable[[str], bool], Callable[[str], List[Dict[str, Any]]]]] = []


def register_foreign_reader(name: str, accepts: Callable[[str], bool],
                            reader: Callable[[str], List[Dict[str, Any]]]) -> None:
    """Register a reader of another harness's output (e.g. lmms-eval's samples JSONL)."""
    FOREIGN_READERS[:] = [r for r in FOREIGN_READERS if r[0] != name] + [(name, accepts, reader)]


#: predicates naming files that belong to another harness's output without being predictions
#: (lmms-eval's ``<date>_results.json`` beside its samples): skipped when a folder is listed
FOREIGN_COMPANIONS: List[Callable[[str], bool]] = []


def register_foreign_companion(is_companion: Callable[[str], bool]) -> None:
    FOREIGN_COMPANIONS.append(is_companion)


def is_foreign_companion(path: str) -> bool:
    return any(pred(path) for pred in FOREIGN_COMPANIONS)


def foreign_reader(path: str) -> Optional[Tuple[str, Callable[[str], List[Dict[str, Any]]]]]:
    """(name, reader) of the first registered reader that accepts the file, else None."""
    if not os.path.isfile(path):
        return None
    for name, accepts, reader in FOREIGN_READERS:
        if accepts(path):
            return name, reader
    return None


def record_key(rec: Dict[str, Any]) -> RecordKey:
    return (str(rec["sample_id"]), int(rec.get("dup_index", 0)))


def prompt_hash(prompt: Any) -> str:
    """Short stable hash of a prompt (string or chat messages), kept in every record."""
    text = prompt if isinstance(prompt, str) else json.dumps(prompt, sort_keys=True, ensure_ascii=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def image_ids(sample: Dict[str, Any]) -> List[str]:
    """Paths for images given as paths, else ``<sample_id>#<index>``."""
    out = []
    for i, im in enumerate(sample.get("images", [])):
        out.append(im if isinstance(im, str) else f"{sample['sample_id']}#{i}")
    return out


def answer_text(sample: Dict[str, Any]) -> Optional[str]:
    """The correct answer as text: the option at ``answer`` (SingleChoice) or the reference."""
    ans = sample.get("answer")
    opts = sample.get("answer_options")
    if isinstance(opts, list) and isinstance(ans, int) and not isinstance(ans, bool) and 0 <= ans < len(opts):
        return str(opts[ans])
    return ans if isinstance(ans, str) else None


def make_record(sample: Dict[str, Any], prediction: Any, prompt: Any = None,
                scores: Optional[List[Tuple[float, int]]] = None,
                predictions: Optional[List[str]] = None) -> Dict[str, Any]:
    """A JSON-ready prediction record for one sample."""
    rec = {k: v for k, v in sample.items() if k not in HEAVY_KEYS and k != "prompt"}
    rec["image_ids"] = sample.get("image_ids") or image_ids(sample)
    text = answer_text(sample)
    if text is not None:
        rec["answer_text"] = text
    if prompt is not None:
        rec["prompt"] = prompt
        rec["prompt_sha"] = prompt_hash(prompt)
    rec["prediction"] = prediction
    if predictions is not None:
        rec["predictions"] = list(predictions)
    if scores is not None:
        rec["candidate_logprobs"] = [float(s[0]) for s in scores]
        rec["candidate_num_tokens"] = [int(s[1]) for s in scores]
    return rec


def dumps(obj: Any) -> str:
    return json.dumps(obj, ensure_ascii=False, sort_keys=False)


def shard_line(rec: Dict[str, Any], path: str) -> bytes:
    """One record as a UTF-8 JSONL line. Text UTF-8 cannot hold (lone surrogates, from a reply's
    ``"\\ud800"``) is stored as U+FFFD and counted in the record's ``replaced_chars``
    (``utils.surrogates``); a number JSON cannot hold (NaN, infinity) is refused naming the sample,
    since our own reader would refuse the line later, blaming the shard."""
    where = f"{path}: sample {rec.get('sample_id')!r} (duplicate {rec.get('dup_index', 0)})"
    try:
        text = json.dumps(rec, ensure_ascii=False, allow_nan=False)
    except ValueError as e:
        raise ReformError(f"{where}: the record holds a number JSON cannot store ({e}); nothing of it was "
                          "written") from None
    try:
        return (text + "\n").encode("utf-8")
    except UnicodeEncodeError:
        clean, n = clean_surrogates(rec)
        clean["replaced_chars"] = int(rec.get("replaced_chars", 0) or 0) + n
        logger.warning("%s: %d lone surrogate(s) stored as U+FFFD", where, n)
        return (json.dumps(clean, ensure_ascii=False, allow_nan=False) + "\n").encode("utf-8")


def ensure_writable_dir(path: str, flag: str = "output directory") -> None:
    """Create ``path`` (a directory results go to) and check it is writable: one line otherwise."""
    check_name(path, flag)
    if os.path.exists(path) and not os.path.isdir(path):
        raise ReformError(f"{path}: {flag} exists and is not a directory")
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as e:
        raise ReformError(f"{path}: cannot create {flag} ({e.strerror or e})") from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise ReformError(f"{path}: {flag} is not writable")


def temp_prefix(path: str) -> str:
    """Prefix of the temporary files this process creates beside ``path`` (append the pid)."""
    return owner_prefix(os.path.basename(path))


def remove_stale_temps(path: str) -> int:
    """Remove temporary files left by an interrupted write of ``path`` (whatever process made
    them: the caller holds the run lock); returns the count."""
    directory = os.path.dirname(os.path.abspath(path))
    base = os.path.basename(path)
    n = 0
    if os.path.isdir(directory):
        for name in os.listdir(directory):
            if name.startswith((f"{TMP_PREFIX}{base}~", f"{TMP_PREFIX}{base}-")):
                os.unlink(os.path.join(directory, name))
                n += 1
    return n


def write_json_atomic(path: str, obj: Any, indent: Optional[int] = 1) -> None:
    """Write one JSON file atomically (a one-file ``Commit``)."""
    with Commit(path) as c:
        c.write_json(path, obj, indent=indent)


def write_text_atomic(path: str, text: str) -> None:
    """Write one text file atomically (a one-file ``Commit``)."""
    with Commit(path) as c:
        c.write_text(path, text)


def read_predictions(path: str) -> List[Dict[str, Any]]:
    """Read a prediction file: a JSON array of records, or JSONL (one record per line), through
    the input boundary (``utils.inputs``: decoding, size, depth and number limits)."""
    check_name(path, "prediction file")
    if os.path.isdir(path):
        raise input_error("is a directory; pass --dataset_name for a benchmark whose results "
                          f"directory can be read ({', '.join(sorted(PREDICTION_DIR_READERS)) or 'none'})", file=path)
    if not os.path.lexists(path):
        raise input_error("prediction file not found", file=path)
    data = read_records(path, "prediction file")
    if not isinstance(data, list):
        raise input_error("expected a JSON array of prediction records", file=path)
    for i, rec in enumerate(data):
        if not isinstance(rec, dict):
            raise input_error("a prediction record must be a JSON object", file=path, record=i)
        if "sample_id" not in rec:
            raise input_error("missing", file=path, record=i, field="sample_id")
    return data


class ShardWriter:
    """Appends records to one JSONL shard, flushing after each batch.

    Every line carries the run identity (``run_id``), so a line from another run copied into
    the shard directory is refused at merge. The file is created at the first write: a run
    that fails before producing a record leaves no empty shard.
    """

    def __init__(self, path: str, run_id: Optional[str] = None) -> None:
        self.path = path
        self.run_id = run_id
        self._fd: Optional[int] = None
        self._lock = threading.Lock()  # an endpoint's window workers write side by side

    def write(self, records: Iterable[Dict[str, Any]]) -> None:
        """Append the records as whole lines; every line is encoded before the file is touched, so
        a record that cannot be stored leaves the shard as it was (never a created, empty one), and
        a write that fails (a full disk) is cut back: the shard keeps whole lines only."""
        data = b"".join(shard_line({**r, "run_id": self.run_id} if self.run_id else r, self.path) for r in records)
        if not data:
            return
        try:
            with self._lock:
                if self._fd is None:
                    os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
                    self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
                start = os.lseek(self._fd, 0, os.SEEK_END)
                view = memoryview(data)
                try:
                    while view:
                        view = view[os.write(self._fd, view):]
                except OSError:
                    try:
                        os.ftruncate(self._fd, start)  # this rank's own file: no torn line stays
                    except OSError:
                        pass
                    raise
        except OSError as e:
            if e.filename is None:
                e.filename = self.path
            reason = os_error_line(e) if e.errno in WORLD_ERRNOS else f"{self.path}: {e.strerror or e}"
            if "re-running the same command resumes" not in reason:
                reason += "; the records written before are kept, re-running the same command resumes"
            raise ReformError(reason) from None

    def close(self) -> None:
        """Close the shard; a failure here (disk full while the error is already being reported)
        loses nothing that was not already reported."""
        if self._fd is not None:
            try:
                os.close(self._fd)
            except OSError:
                pass
            self._fd = None

    def __enter__(self) -> "ShardWriter":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def trim_torn_line(path: str) -> None:
    """Drop a last line without its newline (a record torn by a kill) so appends stay valid."""
    with open(path, "rb+") as f:
        data = f.read()
        if data and not data.endswith(b"\n"):
            f.truncate(data.rfind(b"\n") + 1)


def read_shard_dir(directory: str, run_id: Optional[str] = None,
                   check: Optional[Callable[[Dict[str, Any], str], Any]] = None) -> Dict[RecordKey, Dict[str, Any]]:
    """All complete records in a shard directory, first occurrence of each key kept.

    With ``run_id``, a line of another run (or without an identity) is an error naming the
    shard file and line: shards of other arguments are never merged. ``check(record, where)``
    further checks each line against the current samples (run_eval's record checker).
    """
    done: Dict[RecordKey, Dict[str, Any]] = {}
    if not os.path.isdir(directory):
        return done
    for name in sorted(os.listdir(directory)):
        if not name.endswith(".jsonl"):
            continue
        path = os.path.join(directory, name)
        with open(path, "rb") as f:
            for lineno, raw in enumerate(f, 1):
                if not raw.endswith(b"\n"):
                    break  # torn by a kill; the sample will be redone
                fix = "delete that shard file (or pass --overwrite) and re-run"
                try:
                    rec = json.loads(raw.decode("utf-8"))
                except UnicodeDecodeError:
                    raise ReformError(f"{path}: line {lineno}: shard line is not UTF-8; {fix}") from None
                except (ValueError, RecursionError) as e:  # malformed, too deep, a huge integer
                    raise ReformError(f"{path}: line {lineno}: corrupt shard record "
                                      f"({getattr(e, 'msg', None) or 'nested too deeply'}); {fix}") from None
                check_record(rec, path, f"line {lineno}")
                if not isinstance(rec, dict) or "sample_id" not in rec:
                    raise ReformError(f"{path}: line {lineno}: not a prediction record; {fix}")
                if run_id is not None and rec.get("run_id") != run_id:
                    raise ReformError(f"{path}: line {lineno}: record of another run (run_id "
                                      f"{rec.get('run_id')!r}, this run is {run_id!r}); shards of other "
                                      f"arguments or data are never merged; {fix}")
                if check is not None:
                    check(rec, f"{path}: line {lineno}")
                try:
                    done.setdefault(record_key(rec), rec)
                except (TypeError, ValueError):
                    raise ReformError(f"{path}: line {lineno}: field 'dup_index' is not a number; {fix}") from None
    return done
