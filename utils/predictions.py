"""Prediction records and files: the single reader and the single writer.

* A *record* is the sample without heavy objects (images become ``image_ids``) plus
  ``prediction`` and, for likelihood, ``candidate_logprobs``/``candidate_num_tokens``.
* Shards are JSONL files appended (and flushed) one record at a time, so a killed run loses
  at most the batch in flight; a torn last line is ignored and trimmed on resume.
* Final files are JSON arrays written atomically (temp file + rename): a reader never sees a
  half-written file.
"""
from __future__ import annotations

import hashlib
import json
import os
import tempfile
from typing import Any, Callable, Dict, Iterable, List, Optional, Tuple

from build.schema import HEAVY_KEYS
from utils.errors import ReformError, input_error

RecordKey = Tuple[str, int]

#: benchmark -> reader(directory) -> records, for benchmarks whose own tools write a
#: directory of results (e.g. the official MME format). Registered by metric modules.
PREDICTION_DIR_READERS: Dict[str, Callable[[str], List[Dict[str, Any]]]] = {}


def register_prediction_dir_reader(benchmark: str, reader: Callable[[str], List[Dict[str, Any]]]) -> None:
    PREDICTION_DIR_READERS[benchmark] = reader


#: (benchmark, file extension) -> reader(path) -> records, for files that are not prediction
#: JSON (e.g. the MMMT-IF release CSV with its per-model scores). Registered by metric modules.
PREDICTION_FILE_READERS: Dict[Tuple[str, str], Callable[[str], List[Dict[str, Any]]]] = {}


def register_prediction_file_reader(benchmark: str, extension: str,
                                    reader: Callable[[str], List[Dict[str, Any]]]) -> None:
    PREDICTION_FILE_READERS[(benchmark, extension.lower())] = reader


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


def make_record(sample: Dict[str, Any], prediction: Any, prompt: Any = None,
                scores: Optional[List[Tuple[float, int]]] = None,
                predictions: Optional[List[str]] = None) -> Dict[str, Any]:
    """A JSON-ready prediction record for one sample."""
    rec = {k: v for k, v in sample.items() if k not in HEAVY_KEYS and k != "prompt"}
    rec["image_ids"] = sample.get("image_ids") or image_ids(sample)
    if prompt is not None:
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


def write_json_atomic(path: str, obj: Any, indent: Optional[int] = 1) -> None:
    """Write JSON so the file is either the old content or the complete new content."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".json", dir=directory)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(obj, f, ensure_ascii=False, indent=indent)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def read_predictions(path: str) -> List[Dict[str, Any]]:
    """Read a prediction file: a JSON array of records, or JSONL (one record per line)."""
    if os.path.isdir(path):
        raise input_error("is a directory; pass --dataset_name for a benchmark whose results "
                          f"directory can be read ({', '.join(sorted(PREDICTION_DIR_READERS)) or 'none'})", file=path)
    if not os.path.isfile(path):
        raise input_error("prediction file not found", file=path)
    with open(path, "r", encoding="utf-8") as f:
        text = f.read()
    stripped = text.lstrip()
    if stripped.startswith("["):
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise input_error(f"malformed JSON at line {e.lineno} column {e.colno}: {e.msg}", file=path) from None
    else:
        data = []
        for lineno, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                data.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise input_error(f"malformed JSON on line {lineno}: {e.msg}", file=path,
                                  record=len(data)) from None
    if not isinstance(data, list):
        raise input_error("expected a JSON array of prediction records", file=path)
    for i, rec in enumerate(data):
        if not isinstance(rec, dict):
            raise input_error("a prediction record must be a JSON object", file=path, record=i)
        if "sample_id" not in rec:
            raise input_error("missing", file=path, record=i, field="sample_id")
    return data


class ShardWriter:
    """Appends records to one JSONL shard, flushing after each batch."""

    def __init__(self, path: str) -> None:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        self.path = path
        self._f = open(path, "a", encoding="utf-8")

    def write(self, records: Iterable[Dict[str, Any]]) -> None:
        self._f.write("".join(dumps(r) + "\n" for r in records))
        self._f.flush()

    def close(self) -> None:
        self._f.close()

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


def read_shard_dir(directory: str) -> Dict[RecordKey, Dict[str, Any]]:
    """All complete records in a shard directory, first occurrence of each key kept."""
    done: Dict[RecordKey, Dict[str, Any]] = {}
    if not os.path.isdir(directory):
        return done
    for name in sorted(os.listdir(directory)):
        if not name.endswith(".jsonl"):
            continue
        path = os.path.join(directory, name)
        with open(path, "r", encoding="utf-8") as f:
            for lineno, line in enumerate(f, 1):
                if not line.endswith("\n"):
                    break  # torn by a kill; the sample will be redone
                try:
                    rec = json.loads(line)
                except json.JSONDecodeError as e:
                    raise ReformError(f"{path}: line {lineno}: corrupt shard record ({e.msg}); "
                                      "delete the shard directory or pass --overwrite") from None
                done.setdefault(record_key(rec), rec)
    return done
