"""VLMEvalKit's MME prediction file (``<model>_MME.xlsx``, or ``.tsv`` with ``PRED_FORMAT=tsv``),
read as prediction records and scored by our MME scorer.

Why: a user with VLMEvalKit's predictions can score them exactly as ours, and pair them with our
run of the same checkpoint, question by question. VLMEvalKit is never imported: its file is read.

The layout (VLMEvalKit ``vlmeval/inference.py``, ``infer_data_job``): the rows of its ``MME.tsv``
without the ``image`` column, plus ``prediction``; written by pandas, xlsx with the xlsxwriter
engine, tsv tab-separated with every field quoted. Columns read here (docs/foreign_logs.md):

  index       the row's id in MME.tsv (kept in ``meta.vlmevalkit_index``; never used to match)
  category    the MME subtask (``OCR``, ``artwork``, ...)
  image_path  the image; its last path component is the image file name we key on
  question    the question as VLMEvalKit asked it
  answer      Yes / No
  prediction  the model's response
  extracted, score  (optional, VLMEvalKit's ``_auxmatch`` file) kept in ``meta`` for comparison

Rows map to our items by (category, image file name, question) (``metrics.mme.item_key``), never
by position. The records are scored with VLMEvalKit's own exact-matching rule (``YOrN_Extraction``,
our ``--mme_parse vlmevalkit``, quirks included) unless another rule is asked for.
"""
from __future__ import annotations

import contextlib
import math
import os
from typing import Any, ContextManager, Dict, Iterator, List, Optional, Tuple

from ..build.mme import canonical_subtask, normalize_gt
from .mme import check_unique_items, foreign_record
from ..utils.errors import ReformError, input_error
from ..utils.inputs import check_zip, first_line, read_csv
from ..utils.predictions import ForeignRecords, register_foreign_reader

HARNESS = "VLMEvalKit"
COLUMNS = ("index", "category", "image_path", "question", "answer", "prediction")
#: VLMEvalKit's exact-matching answer extraction (``YOrN_Extraction``): our ``vlmevalkit`` rule
PARSE_RULE = "vlmevalkit"


def accepts(path: str) -> bool:
    """An ``.xlsx`` (we write none), or a ``.tsv`` whose header has VLMEvalKit's prediction columns."""
    low = path.lower()
    if low.endswith(".xlsx"):
        return True
    if not low.endswith(".tsv"):
        return False
    header = first_line(path)
    names = {c.strip().strip('"') for c in header.split("\t")}
    return {"index", "question", "prediction"} <= names


def _cell(value: Any) -> Any:
    """A spreadsheet cell as pandas would give it to VLMEvalKit: None and NaN are missing."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    return value


#: widest row read from a sheet (VLMEvalKit's MME file has 6 to 9 columns): a cell far out (column
#: XFD is 16,384) would make openpyxl pad every row to it, a CPU bomb of a few kilobytes
MAX_XLSX_COLUMNS = 1024


@contextlib.contextmanager
def _xlsx_rows(path: str) -> Iterator[Tuple[List[str], Iterator[Tuple[int, Dict[str, Any]]]]]:
    """(header, rows) of the first sheet, the rows read as they are consumed (a bad row stops the
    read there); openpyxl only here (it is optional: tsv needs nothing). The archive is checked
    first: an .xlsx is a zip, whose sheet may inflate far past the file. The sheet's declared
    ``<dimension>`` is not believed (pandas, which VLMEvalKit reads with, resets it too): a
    dimension that understates the sheet would drop rows silently."""
    try:
        import openpyxl  # optional dependency, needed for .xlsx only
    except ImportError:
        raise ReformError(f"{path}: reading .xlsx needs openpyxl (pip install openpyxl), or write VLMEvalKit's "
                          "predictions as tsv (PRED_FORMAT=tsv)") from None
    check_zip(path, "VLMEvalKit prediction file (.xlsx)")  # its size, and what its members inflate to
    try:  # openpyxl raises many kinds for a file that is not a workbook, or a member that fails its CRC
        wb = openpyxl.load_workbook(path, read_only=True, data_only=True)
    except Exception as e:
        raise input_error(f"not a readable xlsx workbook ({type(e).__name__}: {e})", file=path) from None
    try:
        try:
            sheet = wb.worksheets[0]
            sheet.reset_dimensions()  # read every row there is, and each only as wide as its cells
            raw = sheet.iter_rows(values_only=True)
            first = list(next(raw, ()))
        except Exception as e:
            raise input_error(f"not a readable xlsx workbook ({type(e).__name__}: {e})", file=path) from None
        while first and first[-1] is None:
            first.pop()
        _check_width(first, len(first), path, 1)
        header = [str(c) if c is not None else "" for c in first]
        yield header, _xlsx_records(raw, header, path)
    finally:
        wb.close()


def _check_width(row: Any, width: int, path: str, no: int) -> None:
    """Refuse a row with a value right of the header (pandas would shift the columns) or with
    cells, even empty, past ``MAX_XLSX_COLUMNS``."""
    beyond = next((k for k in range(width, len(row)) if row[k] is not None), None)
    if beyond is not None:
        raise input_error(f"holds a value in column {_column_letter(beyond + 1)}, right of the header's last "
                          f"column {_column_letter(width) if width else '(none)'}", file=path, record=f"row {no}")
    if len(row) > MAX_XLSX_COLUMNS:
        raise input_error(f"reaches column {_column_letter(len(row))}, over {MAX_XLSX_COLUMNS} columns (not a "
                          "VLMEvalKit prediction sheet)", file=path, record=f"row {no}")


def _column_letter(n: int) -> str:
    """The spreadsheet name of 1-based column ``n`` (1 -> A, 16384 -> XFD)."""
    out = ""
    while n > 0:
        n, r = divmod(n - 1, 26)
        out = chr(65 + r) + out
    return out


def _xlsx_records(raw: Iterator[Any], header: List[str], path: str) -> Iterator[Tuple[int, Dict[str, Any]]]:
    """(row number, the row as a dict by header name), each checked for width as it is read; empty rows skipped."""
    no = 1
    while True:
        try:
            row = next(raw, None)
        except Exception as e:
            raise input_error(f"not a readable xlsx workbook ({type(e).__name__}: {e})", file=path,
                              record=f"row {no + 1}") from None
        if row is None:
            return
        no += 1
        _check_width(row, len(header), path, no)
        if any(v is not None for v in row):
            yield no, dict(zip(header, (_cell(v) for v in row)))


def _text(row: Dict[str, Any], column: str, path: str, no: int, required: bool = True) -> str:
    value = row.get(column)
    if value is None or (isinstance(value, str) and not value.strip()):
        if required:
            raise input_error("is empty", file=path, record=f"row {no}", field=column)
        return ""
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return str(value)


def read_vlmevalkit_predictions(path: str) -> ForeignRecords:
    """VLMEvalKit's MME prediction file -> prediction records (one per row) with the run's
    provenance (what the file tells: the model name in its file name, the answer rule)."""
    sheet: ContextManager[Tuple[List[str], Iterator[Tuple[int, Dict[str, Any]]]]]
    if path.lower().endswith(".xlsx"):
        sheet = _xlsx_rows(path)
    else:
        names, table = read_csv(path, "VLMEvalKit prediction file", delimiter="\t")
        sheet = contextlib.nullcontext((names, iter(enumerate(table, start=2))))
    with sheet as (header, rows):
        missing = [c for c in COLUMNS if c not in header]
        if missing:
            raise input_error(f"missing column(s) {', '.join(missing)} of VLMEvalKit's MME prediction file "
                              f"(has {', '.join(h for h in header if h) or 'none'})", file=path,
                              record="row 1", field=missing[0])
        stem = os.path.splitext(os.path.basename(path))[0]
        model = stem[: -len("_MME")] if stem.endswith("_MME") else stem
        records = []
        for no, row in rows:  # the header is row 1, as a spreadsheet numbers them
            raw_cat = _text(row, "category", path, no)
            sub = canonical_subtask(raw_cat)
            if sub is None:
                raise input_error(f"{raw_cat!r} is not an MME subtask", file=path, record=f"row {no}", field="category")
            image = os.path.basename(_text(row, "image_path", path, no).strip().replace("\\", "/"))
            if not image:
                raise input_error("names no image file", file=path, record=f"row {no}", field="image_path")
            gt = normalize_gt(_text(row, "answer", path, no))
            if gt is None:
                raise input_error(f"must be Yes or No, got {row.get('answer')!r}", file=path, record=f"row {no}",
                                  field="answer")
            meta: Dict[str, Any] = {"vlmevalkit_index": _text(row, "index", path, no)}
            for extra in ("extracted", "score"):
                if row.get(extra) is not None:
                    meta[f"vlmevalkit_{extra}"] = row[extra]
            records.append(foreign_record(HARNESS, sub, image, _text(row, "question", path, no), gt,
                                          _text(row, "prediction", path, no, required=False), path, no,
                                          model=f"{model} (VLMEvalKit)", parse_rule=PARSE_RULE, meta=meta))
    if not records:
        raise input_error("holds no prediction rows", file=path)
    check_unique_items(records, path, unit="row")
    return ForeignRecords(records, provenance(path, model))


def provenance(path: str, model: Optional[str]) -> Dict[str, Any]:
    """The run-level provenance VLMEvalKit's prediction file tells: little (no settings are
    written there); every unknown value is None."""
    return {"engine": None, "model_class": None, "dtype": None, "device": None, "attn_implementation": None,
            "chat_template_sha": None, "system_line": None, "preprocessor": None, "bos_token": None,
            "adds_bos": None, "image_processor": {"class": None, "backend": None, "output_size": None},
            "versions": {"torch": None, "transformers": None, "accelerate": None, "vllm": None},
            "generation": None, "parse_mode": PARSE_RULE,
            "harness": {"name": HARNESS, "version": None, "model": model, "file": os.path.abspath(path),
                        "layout": "xlsx" if path.lower().endswith(".xlsx") else "tsv"}}


register_foreign_reader("vlmevalkit-mme", accepts, read_vlmevalkit_predictions)
