"""The one scoring path: validate records, score them, and write results named after their file.

``run_eval --do_eval`` and ``run_loader_eval`` both end here, so the two always agree.
Results belong to their prediction file, never to the directory:

* ``<stem>.results.json``  metrics, the full configuration, seeds, versions, timing
* ``<stem>.results.md``    the printed tables
* ``<stem>.per_sample.json`` every verdict with its extracted answer

``run_loader_eval`` adds a tag (``<stem>.scored-<options hash>``) so re-scoring a file with
other options never replaces the results ``run_eval`` wrote. Every write is appended as one
line to ``runs.jsonl`` in the directory: an index that is never rewritten.
"""
from __future__ import annotations

import glob
import hashlib
import json
import logging
import math
import os
import re
import time
from typing import Any, Dict, List, Optional, Sequence, Tuple

from ... import build  # noqa: F401  (registers the builders, for dataset-name lookups)
from ... import metrics as _metrics  # noqa: F401  (metric modules register readers and exporters)
from ...build.registry import canonical_benchmark, get_builder_class
from .bootstrap import N_BOOT, interval_table, interval_title
from .image_dependence import ablation_mode
from .report import compare_runs
from .compare import headline_markdown
from ...metrics import evaluate
from ...metrics.mmmt_if_release import in_release_setting, print_release_report, reference_records_from
from ...metrics.single_choice import check_stability
from ...utils.answer_text import option_collision
from ...utils.commit import Commit, check_names, clean_stale_temps
from ...utils.errors import ReformError, input_error
from ...utils.inputs import check_name, list_dir, read_json
from ...utils.predictions import (PREDICTION_DIR_READERS, PREDICTION_FILE_READERS, RESULTS_EXPORTERS,
                               ensure_writable_dir, foreign_reader, is_foreign_companion, read_predictions,
                               record_key)
from ...utils.report import headline_report, markdown_table, metrics_report
from ...utils.secrets import redact
from ...utils.usage import usage_totals

logger = logging.getLogger(__name__)

RUN_INDEX = "runs.jsonl"


# --------------------------------------------------------------------------- validation
def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def validate_records(records: List[Dict[str, Any]], file: Optional[str] = None) -> None:
    """Refuse records that would score silently wrong: duplicated keys, mixed formulations or
    methods, malformed or non-finite candidate scores, answers outside the options."""
    seen: Dict[Any, int] = {}
    kinds: Dict[str, Dict[str, int]] = {"formulation": {}, "inference_method": {}}
    for i, rec in enumerate(records):
        if not isinstance(rec, dict):
            raise input_error("a prediction record must be a JSON object", file=file, record=i)
        if "sample_id" not in rec:
            raise input_error("missing", file=file, record=i, field="sample_id")
        if not isinstance(rec["sample_id"], (str, int)) or isinstance(rec["sample_id"], bool):
            raise input_error("must be a string", file=file, record=i, field="sample_id")
        dup = rec.get("dup_index", 0)
        if not isinstance(dup, int) or isinstance(dup, bool) or dup < 0:
            raise input_error(f"must be a non-negative integer, got {dup!r}", file=file, record=i, field="dup_index")
        key = record_key(rec)
        if key in seen:
            raise input_error(f"duplicate record for sample {key[0]!r} duplicate {key[1]} (first at record "
                              f"{seen[key]}); a sample must be scored once", file=file, record=i, field="sample_id")
        seen[key] = i
        for name in kinds:
            if rec.get(name) is not None:
                kinds[name].setdefault(str(rec[name]), i)
        if "meta" in rec and not isinstance(rec["meta"], dict):
            raise input_error(f"must be an object, got {type(rec['meta']).__name__}", file=file, record=i, field="meta")
        if rec.get("skipped"):
            continue
        opts = rec.get("answer_options")
        if opts is not None:
            if not isinstance(opts, list) or not all(isinstance(o, (str, int, float)) for o in opts):
                raise input_error("must be a list of option texts", file=file, record=i, field="answer_options")
            if "answer" not in rec:
                raise input_error("missing", file=file, record=i, field="answer")
            ans = rec.get("answer")
            if rec.get("formulation") == "SingleChoice" and (
                    not isinstance(ans, int) or isinstance(ans, bool) or not 0 <= ans < len(opts)):
                raise input_error(f"must be an option index in 0..{len(opts) - 1}, got {ans!r}",
                                  file=file, record=i, field="answer")
        if isinstance(opts, list) and len({str(o).strip().lower() for o in opts}) != len(opts):
            raise input_error("options must differ (two options with one text cannot be told apart)",
                              file=file, record=i, field="answer_options")
        marks = rec.get("option_marks")
        if marks is not None and (not isinstance(marks, list) or not all(isinstance(m, str) for m in marks)
                                  or (isinstance(opts, list) and len(marks) != len(opts))):
            raise input_error(f"must be a list of {len(opts) if isinstance(opts, list) else 'the'} option marks",
                              file=file, record=i, field="option_marks")
        if marks is not None and (len({m.strip().lower() for m in marks}) != len(marks)
                                  or not all(m.strip() and m.strip().isalnum() for m in marks)):
            raise input_error(f"option marks must be distinct letters or numbers, got {marks!r} (a reply's mark "
                              "would name more than one option)", file=file, record=i, field="option_marks")
        cands = rec.get("candidates")
        if cands is not None:
            if not isinstance(cands, list) or not cands or not all(isinstance(c, (str, int, float)) for c in cands):
                raise input_error("must be a non-empty list of candidate texts", file=file, record=i, field="candidates")
            problem = option_collision(cands)
            if problem:
                raise input_error(problem, file=file, record=i, field="candidates")
            idx = rec.get("answer_index")
            if idx is not None and (not isinstance(idx, int) or isinstance(idx, bool) or not 0 <= idx < len(cands)):
                raise input_error(f"must be a candidate index in 0..{len(cands) - 1}, got {idx!r}", file=file,
                                  record=i, field="answer_index")
        if rec.get("formulation") == "Generation" and "answer" in rec and (
                isinstance(rec["answer"], (list, dict, bool))):
            raise input_error(f"must be the reference text, got {type(rec['answer']).__name__}", file=file,
                              record=i, field="answer")
        if "candidate_logprobs" in rec or "candidate_num_tokens" in rec:
            _check_scores(rec, i, file)
    for name, values in kinds.items():
        if len(values) > 1:
            (a, ia), (b, ib) = sorted(values.items(), key=lambda kv: kv[1])[:2]
            raise input_error(f"records mix {name}s ({a!r} at record {ia}, {b!r} at record {ib}); "
                              "score each kind separately", file=file, record=ib, field=name)


def _check_scores(rec: Dict[str, Any], i: int, file: Optional[str]) -> None:
    lp, nt = rec.get("candidate_logprobs"), rec.get("candidate_num_tokens")
    if not isinstance(lp, list) or not lp:
        raise input_error("must be a non-empty list of numbers", file=file, record=i, field="candidate_logprobs")
    for v in lp:
        if not _is_number(v) or not math.isfinite(v):
            raise input_error(f"holds {v!r}; every candidate score must be a finite number", file=file,
                              record=i, field="candidate_logprobs")
    if not isinstance(nt, list) or len(nt) != len(lp) or not all(
            isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in nt):
        raise input_error(f"must be a list of {len(lp)} token counts (one per candidate score)", file=file,
                          record=i, field="candidate_num_tokens")
    options = rec.get("answer_options") if rec.get("formulation") != "Generation" else rec.get("candidates")
    if options is None:
        options = rec.get("candidates") or rec.get("answer_options")
    if isinstance(options, list) and len(options) != len(lp):
        raise input_error(f"has {len(lp)} scores for {len(options)} options", file=file, record=i,
                          field="candidate_logprobs")
    pred = rec.get("prediction")
    if _is_number(pred) and isinstance(options, list) and not (isinstance(pred, int) and 0 <= pred < len(options)):
        raise input_error(f"index {pred!r} is outside the {len(options)} options", file=file, record=i,
                          field="prediction")


# --------------------------------------------------------------------------- results files
def results_paths(prediction_file: str, output_dir: Optional[str] = None, tag: Optional[str] = None) -> Dict[str, str]:
    """Where the results of ``prediction_file`` go (named after it, never shared)."""
    base = os.path.basename(os.path.normpath(prediction_file))
    for ext in (".jsonl", ".json", ".csv", ".tsv", ".xlsx"):
        if base.endswith(ext):
            base = base[: -len(ext)]
            break
    if tag:
        base = f"{base}.{tag}"
    directory = output_dir or os.path.dirname(os.path.abspath(os.path.normpath(prediction_file)))
    return {"json": os.path.join(directory, f"{base}.results.json"),
            "md": os.path.join(directory, f"{base}.results.md"),
            "per_sample": os.path.join(directory, f"{base}.per_sample.json"),
            "run": os.path.join(directory, f"{base}.run.json"),
            "report": os.path.join(directory, f"{base}.report"),
            "dir": directory, "stem": base}


def prediction_files(directory: "str | os.PathLike[str]") -> List[str]:
    """The prediction files of the runs in an output folder (``<stem>.json``/``.jsonl``), sorted:
    never what this tool writes beside them (results, per-sample and run files, ``<stem>.report/``
    folders, indexes, temporaries, another harness's companion files). The one lookup of a run's
    files for the library, tests and bench/ scripts; the names of what belongs to each come from
    ``results_paths``."""
    directory = os.fspath(directory)
    paths = [os.path.join(directory, n) for n in list_dir(directory, "prediction folder", suffix=(".json", ".jsonl"),
                                                          kind="file")]
    return [p for p in paths if not is_derived(p) and not is_foreign_companion(p)]


def results_files(prediction_file: str) -> List[str]:
    """Every results file written for ``prediction_file``, sorted: ``<stem>.results.json`` and the
    tagged ones (``<stem>.eval-<hash>.results.json`` from ``run_eval --do_eval`` with other scoring
    options, ``<stem>.scored-<hash>.results.json`` from ``run_loader_eval``)."""
    paths = results_paths(prediction_file)
    pattern = os.path.join(glob.escape(paths["dir"]), glob.escape(paths["stem"]) + ".*results.json")
    return sorted(p for p in glob.glob(pattern)
                  if p == paths["json"] or _TAG_RE.fullmatch(os.path.basename(p)[len(paths["stem"]) + 1:]))


#: a results tag written by ``options_tag`` and what follows it
_TAG_RE = re.compile(r"(?:eval|scored)-[0-9a-f]{8}\.results\.json")


def options_tag(prefix: str = "scored", **options: Any) -> str:
    """``<prefix>-<hash>`` of the scoring options: ``scored-`` for results written by
    ``run_loader_eval``, ``eval-`` for ``run_eval --do_eval`` with non-default scoring options."""
    blob = json.dumps(options, sort_keys=True, default=str).encode("utf-8")
    return f"{prefix}-" + hashlib.sha256(blob).hexdigest()[:8]


def run_eval_tag(likelihood_reduction: str = "sum", eval_stability: bool = False,
                 metric_options: Optional[Dict[str, Any]] = None) -> Optional[str]:
    """The results tag of ``run_eval --do_eval``: none for the default scoring options, else a
    hash of them, so scoring one prediction file two ways never replaces the other results."""
    if likelihood_reduction == "sum" and not eval_stability and not metric_options:
        return None
    return options_tag("eval", likelihood_reduction=likelihood_reduction, eval_stability=eval_stability,
                       metric_options=metric_options or {})


def index_entry(entry: Dict[str, Any]) -> Dict[str, Any]:
    """One line of the run index (appended by ``Commit.append_line``, journaled with the outputs
    it names): the time, then ``entry``."""
    return {"time": time.strftime("%Y-%m-%dT%H:%M:%S"), **entry}


def headline(metrics: Dict[str, Any]) -> Dict[str, Any]:
    """The scalar top-level metrics (what the index and comparison tables show)."""
    return {k: v for k, v in metrics.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}


# --------------------------------------------------------------------------- scoring
def _infer(records: List[Dict[str, Any]], key: str, given: Optional[str], flag: str, source: str = "the records"
           ) -> str:
    """The records' formulation or method; a flag may name it but never contradict the records
    (nor ``source``, what holds them: a results file's recorded setting)."""
    values = {r.get(key) for r in records if r.get(key)}
    if given:
        valid = ("SingleChoice", "Generation") if key == "formulation" else ("generation", "likelihood")
        match = [v for v in valid if v.lower() == str(given).lower()]
        if not match:
            raise ReformError(f"{flag} {given!r}: valid values are {', '.join(valid)}")
        if values and values != {match[0]}:
            raise ReformError(f"{flag} {given!r} contradicts {source}, which {'are' if source == 'the records' else 'records'} "
                              f"{sorted(map(str, values))[0]!r}; "
                              f"leave {flag} out to read it from {source}")
        return match[0]
    if len(values) == 1:
        return str(values.pop())
    raise ReformError(f"cannot tell {flag} from the records ({sorted(map(str, values)) or 'none given'}); pass {flag}")


def check_setting_flags(recorded: Dict[str, Any], formulation: Optional[str], infer_method: Optional[str],
                        source: str) -> Tuple[Optional[str], Optional[str]]:
    """(formulation, infer_method) to score with: the flags where given, else what ``recorded``
    (a results file's ``formulation``/``infer_method``) says; a flag that contradicts the record is
    refused as one that contradicts the records is (``score_records`` then checks the records)."""
    out = []
    for key, field, given, flag in (("formulation", "formulation", formulation, "--formulation"),
                                    ("inference_method", "infer_method", infer_method, "--infer_method")):
        have = recorded.get(field)
        out.append(_infer([{key: have}], key, given, flag, source) if given else have)
    return out[0], out[1]


def score_records(records: List[Dict[str, Any]], formulation: Optional[str] = None,
                  infer_method: Optional[str] = None, eval_stability: bool = False,
                  likelihood_reduction: str = "sum", prediction_file: Optional[str] = None,
                  output_dir: Optional[str] = None, metric_options: Optional[Dict[str, Any]] = None,
                  extra: Optional[Dict[str, Any]] = None, metric: Optional[str] = None,
                  write: bool = True, quiet: bool = False, tag: Optional[str] = None,
                  tool: str = "library", commit: Optional[Commit] = None) -> Dict[str, Any]:
    """Validate, score, print the tables and (``write``) write the results named after the file.

    The three results files are written as one unit (``utils.commit``), then one line is
    appended to the run index; with ``commit`` they join that caller's unit instead (its
    ``commit()`` puts them in place)."""

    validate_records(records, prediction_file)
    if eval_stability:
        check_stability(records, prediction_file)
    unknown = [flag for key, given, flag in (("formulation", formulation, "--formulation"),
                                             ("inference_method", infer_method, "--infer_method"))
               if not given and len({r.get(key) for r in records if r.get(key)}) != 1]
    if len(unknown) > 1:  # one error names everything missing (a hand-written file often lacks both)
        raise ReformError(f"{prediction_file or 'records'}: cannot tell {' and '.join(unknown)} from the records "
                          f"(fields 'formulation' and 'inference_method'); pass {' and '.join(unknown)}")
    formulation = _infer(records, "formulation", formulation, "--formulation")
    infer_method = _infer(records, "inference_method", infer_method, "--infer_method")
    result = evaluate(records, formulation, infer_method, eval_stability=eval_stability,
                      likelihood_reduction=likelihood_reduction, metric=metric,
                      file=prediction_file, **(metric_options or {}))
    summary: Dict[str, Any] = {
        "metrics": result["metrics"], "metric": result["metric"], "formulation": formulation,
        "infer_method": infer_method, "likelihood_reduction": likelihood_reduction,
        "eval_stability": eval_stability, "metric_options": dict(metric_options or {}),
        "prediction_file": os.path.abspath(prediction_file) if prediction_file else None,
        "num_records": len(records)}
    if result.get("notes"):  # said beside a number (a subsample total's missing subtasks)
        summary["notes"] = result["notes"]
    # one interval method on every surface: the report's cluster bootstrap, in results.md too
    result["tables"][interval_title(N_BOOT, 0)] = interval_table(
        result.get("per_sample", []), {"metric": result["metric"], "infer_method": infer_method},
        key=str(records[0].get("benchmark") or ""), n_boot=N_BOOT)
    if extra:
        summary = {**extra, **summary}
        if "provenance" in summary:  # a server's or a foreign log's words about itself may echo a credential
            summary["provenance"] = redact(summary["provenance"])
    if "usage" not in summary and any("usage" in r or "generated_tokens" in r for r in records):
        summary["usage"] = usage_totals(records)
    if summary.get("usage"):
        result.setdefault("tables", {})["Token usage"] = markdown_table(
            ["field", "value"], [(k, v) for k, v in summary["usage"].items()])
    title = f"{records[0].get('benchmark', '')} {formulation} {infer_method}".strip()
    report = metrics_report(result, title=title)
    if not quiet:  # the headline table, as run_eval --do_eval prints it; every table is in the .md
        print(headline_report(result, title=title) + "\n")
    if write:
        paths = results_paths(prediction_file or "results", output_dir, tag)
        summary["results_files"] = {k: paths[k] for k in ("json", "md", "per_sample")}
        own = commit is None
        check_names([paths["md"], paths["per_sample"], paths["json"]], "results file")  # before the first write
        c = commit if commit is not None else Commit(f"results of {prediction_file or 'records'}")
        try:
            c.write_text(paths["md"], report)
            c.write_json(paths["per_sample"], result.get("per_sample", []), indent=None)
            c.write_json(paths["json"], summary, last=True)  # the commit point: it names the other two
        except BaseException:
            c.abort()
            raise
        c.append_line(os.path.join(paths["dir"], RUN_INDEX), index_entry({
            "tool": tool, "prediction_file": summary["prediction_file"], "results": paths["json"],
            "run_id": summary.get("run_id"), "metric": result["metric"], "headline": headline(result["metrics"])}))
        if own:
            c.commit()
    summary["tables"] = result.get("tables", {})
    summary["per_sample"] = result.get("per_sample", [])
    return summary


# --------------------------------------------------------------------------- files -> records
def expand_prediction_files(paths: Sequence[str]) -> List[str]:
    """Files, directories of prediction files, and globs -> prediction files, in order.

    A path that exists is taken as it is, before any glob is tried (``model[v2].json`` is a
    file name, not a pattern). What this tool writes (``is_our_output``: results, per-sample and
    run files, indexes, report folders, exports, temporaries) is skipped where the names come
    from a glob, a folder or a list (names a shell expanded from a glob), with one line saying
    what was skipped; one path named alone is taken as meant (an MME export folder is scored),
    except a file that holds no predictions, which is refused in one line. A directory that a
    benchmark's reader understands (official MME results) stays one entry; otherwise it
    contributes its ``*.json``/``*.jsonl`` prediction files.
    """
    out: List[str] = []
    skipped: List[str] = []
    alone = len(paths) == 1
    for p in paths:
        check_name(p, "--prediction_file")
        named = os.path.lexists(p)
        if named:
            matches = [p]
        elif any(ch in p for ch in "*?["):
            matches = sorted(glob.glob(p))
        else:
            matches = []
        if alone and named:
            if is_derived(p) or _is_report_dir(p):
                raise input_error("is a file this tool writes (results, per-sample, run or report), not "
                                  "predictions; pass the prediction file or its folder", file=p)
        else:
            skipped += [m for m in matches if is_our_output(m)]
            matches = [m for m in matches if not is_our_output(m)]
        if not matches and not (skipped and named):
            raise input_error("matches no prediction file", file=p)
        for m in matches:
            if os.path.isdir(m) and not _is_results_dir(m):
                found = prediction_files(m)
                if not found:
                    raise input_error("holds no prediction files", file=m)
                out.extend(found)
            else:
                out.append(m)
    if not out:
        raise input_error("are files this tool writes (results, per-sample, run or report), not predictions",
                          file=", ".join(skipped[:3]) + (" ..." if len(skipped) > 3 else ""))
    if skipped:
        logger.warning("skipped %d path(s) this tool wrote (results, per-sample, run files, reports, exports): %s%s",
                       len(skipped), ", ".join(skipped[:3]), " ..." if len(skipped) > 3 else "")
    return out


#: endings of the files this tool writes beside a prediction file (``<stem>.results.json``, ...)
DERIVED_SUFFIXES = (".results.json", ".results.md", ".per_sample.json", ".run.json", ".report")
#: whole names of the files and folders it writes into an output or report folder
DERIVED_NAMES = ("runs.jsonl", "comparison.json", "comparison.md", "report.html", "log.txt", "plots", "images")
#: a folder holding one of these (and no predictions) is a report this tool wrote
REPORT_MARKERS = ("comparison.json", "report.html")


def is_derived(path: str) -> bool:
    """Files this tool writes beside prediction files (results, reports, indexes, temporaries):
    a hidden name, a derived ending, or one of the exact names it uses; a user's
    ``random_runs.jsonl`` is not one."""
    name = os.path.basename(os.path.normpath(path))
    return name.startswith(".") or name.endswith(DERIVED_SUFFIXES) or name in DERIVED_NAMES


def _is_report_dir(path: str) -> bool:
    """A folder holding a report this tool wrote and no prediction files (a comparison written
    into the folder of its predictions leaves that folder a prediction folder)."""
    return (os.path.isdir(path) and any(os.path.isfile(os.path.join(path, n)) for n in REPORT_MARKERS)
            and not any(n.endswith((".json", ".jsonl")) and not is_derived(n) for n in list_dir(path, "folder")))


def is_our_output(path: str) -> bool:
    """What this tool writes: a derived file (``is_derived``), a report folder, an export folder."""
    return is_derived(path) or _is_report_dir(path) or (
        os.path.isdir(path) and os.path.isfile(os.path.join(path, EXPORT_MARKER)))


def _is_results_dir(path: str) -> bool:
    """A directory in a benchmark's own results format (no JSON prediction files in it)."""
    return not any(n.endswith((".json", ".jsonl")) and not is_derived(n) for n in list_dir(path, "prediction folder"))


def load_records(prediction_file: str, dataset_name: Optional[str] = None) -> List[Dict[str, Any]]:
    """Records from a file, or from a results directory read by the benchmark's registered reader.
    ``dataset_name`` picks a benchmark's reader; it may name the records' benchmark, never
    contradict it (``check_dataset``)."""
    records = _read_records(prediction_file, dataset_name)
    check_dataset(records, dataset_name, prediction_file)
    return records


def check_dataset(records: List[Dict[str, Any]], dataset_name: Optional[str], prediction_file: str) -> None:
    """The records' benchmark, one name for each: every ``benchmark`` a builder registers is
    written as registered (matched case-insensitively: "mme" is MME, scored by MME's metric);
    ``--dataset_name`` may name it, never contradict it (as a contradicting ``--formulation`` is
    refused: the records would be scored as theirs, under a title the reader did not ask for),
    and records that name no benchmark are the one it names (its metric scores them)."""
    for r in records:
        if isinstance(r, dict) and r.get("benchmark"):
            r["benchmark"] = canonical_benchmark(r["benchmark"]) or r["benchmark"]
    if not dataset_name:
        return
    name = get_builder_class(dataset_name).name
    found = sorted({str(r["benchmark"]) for r in records if isinstance(r, dict) and r.get("benchmark")})
    if found and found != [name]:
        raise ReformError(f"{prediction_file}: --dataset_name {dataset_name!r} contradicts the records, which are "
                          f"{', '.join(repr(b) for b in found)}; leave --dataset_name out to read it from the records")
    for r in records:
        if isinstance(r, dict) and not r.get("benchmark"):
            r["benchmark"] = name


def _read_records(prediction_file: str, dataset_name: Optional[str]) -> List[Dict[str, Any]]:
    if os.path.isdir(prediction_file) and dataset_name:
        name = get_builder_class(dataset_name).name
        if name not in PREDICTION_DIR_READERS:
            raise ReformError(f"{prediction_file}: is a directory, and {name} has no results-directory reader")
        return PREDICTION_DIR_READERS[name](prediction_file)
    if dataset_name and os.path.isfile(prediction_file):
        ext = os.path.splitext(prediction_file)[1].lower()
        reader = PREDICTION_FILE_READERS.get((get_builder_class(dataset_name).name, ext))
        if reader is not None:
            return reader(prediction_file)
    found = foreign_reader(prediction_file)  # another harness's output (lmms-eval, VLMEvalKit)
    if found is not None:
        return found[1](prediction_file)
    return read_predictions(prediction_file)


def provenance_extra(records: List[Dict[str, Any]]) -> Optional[Dict[str, Any]]:
    """``{"provenance": ...}`` for records read from another harness's output (what its files
    tell of the run's settings), for the results file; None for our own prediction files."""
    prov = getattr(records, "provenance", None)
    return {"provenance": prov} if prov is not None else None


#: the marker an export folder holds: which prediction file (and model) it was written from
EXPORT_MARKER = ".reform_export.json"


def check_export(records: List[Dict[str, Any]], benchmark: str, directory: str,
                 prediction_file: Optional[str] = None) -> None:
    """Before anything is written: refuse an export of records of another benchmark, or into a
    folder that holds anything but an earlier export of the same prediction file (two models'
    subtask files would mix). ``run_eval`` calls this before its first write."""
    if benchmark not in RESULTS_EXPORTERS:
        raise ReformError(f"{benchmark} has no official results format to export "
                          f"(available: {', '.join(sorted(RESULTS_EXPORTERS)) or 'none'})")
    other = sorted({str(r.get("benchmark")) for r in records if r.get("benchmark") != benchmark})
    if other:
        raise ReformError(f"{prediction_file or 'records'}: --export_{benchmark.lower()}_results needs {benchmark} "
                          f"records, these are {', '.join(other)}; nothing was written")
    check_name(directory, "export folder")
    if os.path.lexists(directory) and not os.path.isdir(directory):
        raise ReformError(f"{directory}: export folder exists and is not a folder; nothing was written")
    if not os.path.isdir(directory):
        return
    names = [n for n in list_dir(directory, "export folder") if not n.startswith(".tmp-")]
    if not names:
        return
    source = os.path.abspath(prediction_file) if prediction_file else None
    marker = os.path.join(directory, EXPORT_MARKER)
    previous = read_json(marker, "export marker").get("prediction_file") if os.path.isfile(marker) else None
    if previous is None or previous != source:
        whose = f"the export of {previous}" if previous else f"{len(names)} other file(s) ({names[0]}, ...)"
        raise ReformError(f"{directory}: export folder already holds {whose}; an export folder holds one "
                          "prediction file's results: choose an empty or new folder; nothing was written")


def export_results(records: List[Dict[str, Any]], benchmark: str, directory: str,
                   prediction_file: Optional[str] = None, commit: Optional[Commit] = None, **options: Any) -> None:
    """Write records in a benchmark's own results format (registered by its metric module) into a
    staged folder that replaces ``directory`` whole at commit (see ``check_export``)."""
    check_export(records, benchmark, directory, prediction_file)
    own = commit is None
    c = commit if commit is not None else Commit(f"{benchmark} export")
    try:
        staged = c.folder(directory)
        RESULTS_EXPORTERS[benchmark](records, staged, **options)
        with open(os.path.join(staged, EXPORT_MARKER), "w", encoding="utf-8") as f:
            json.dump({"prediction_file": os.path.abspath(prediction_file) if prediction_file else None,
                       "models": sorted({str(r["model"]) for r in records if r.get("model")})}, f)
    except OSError as e:
        c.abort()
        raise ReformError(f"{directory}: cannot write the {benchmark} export ({e.strerror or e}); "
                          "nothing was written") from None
    except BaseException:
        c.abort()
        raise
    if own:
        c.commit()


def run_name(records: List[Dict[str, Any]], prediction_file: str) -> str:
    """The label of a run in comparisons: the model named in its records, else the file stem; a run
    made with ``--image_ablation`` says which (``llava:tiny (images: blank)``)."""
    models = sorted({str(r["model"]) for r in records if r.get("model")})
    stem = results_paths(prediction_file)["stem"]
    name = models[0] if len(models) == 1 else stem
    mode = ablation_mode(records)
    return f"{name} (images: {mode})" if mode else name


def clean_output_temps(*directories: Optional[str]) -> None:
    """Our temporaries left by a killed command (``.tmp-*``) in these folders and one level
    below (``plots/``, ``<stem>.report/``), removed at the start of the next command."""
    for d in directories:
        if d and os.path.isdir(d):
            clean_stale_temps(d, depth=1)


def loader_eval(prediction_file: str, formulation: Optional[str] = None, infer_method: Optional[str] = None,
                eval_stability: bool = False, likelihood_reduction: str = "sum",
                dataset_name: Optional[str] = None, output_dir: Optional[str] = None,
                metric_options: Optional[Dict[str, Any]] = None, write: bool = True,
                quiet: bool = False, export_mme_results: Optional[str] = None) -> Dict[str, Any]:
    """Python API: score one prediction file; returns the results dict (as written to its results file).

    Results are written as ``<stem>.scored-<hash>.results.json`` (never replacing run_eval's).
    ``export_mme_results``: also write the records in the official MME tool's results format there.
    Every check that needs no scoring runs first; the outputs are then written as one unit.
    """
    check_name(prediction_file, "prediction file")
    records = load_records(prediction_file, dataset_name)
    if not records:
        raise ReformError(f"{prediction_file}: holds no prediction records")
    if any(r.get("release_reference") for r in records):
        return print_release_report(records, prediction_file, output_dir, write=write, quiet=quiet)
    if export_mme_results:
        check_export(records, "MME", export_mme_results, prediction_file)
    tag = options_tag(formulation=formulation, infer_method=infer_method, eval_stability=eval_stability,
                      likelihood_reduction=likelihood_reduction, metric_options=metric_options,
                      prediction_file=os.path.abspath(prediction_file))
    if output_dir:
        ensure_writable_dir(output_dir, "--output_dir")
    if write:
        clean_output_temps(output_dir or os.path.dirname(os.path.abspath(prediction_file)),
                           os.path.dirname(os.path.abspath(export_mme_results)) if export_mme_results else None)
    with Commit(f"results of {prediction_file}") as c:
        result = score_records(records, formulation, infer_method, eval_stability, likelihood_reduction,
                               prediction_file=prediction_file, output_dir=output_dir,
                               metric_options=metric_options, write=write, quiet=quiet, tag=tag,
                               tool="run_loader_eval", commit=c, extra=provenance_extra(records))
        if export_mme_results:
            export_results(records, "MME", export_mme_results, prediction_file=prediction_file, commit=c,
                           likelihood_reduction=likelihood_reduction)
    result["records"] = records
    return result


def evaluate_files(paths: Sequence[str], formulation: Optional[str] = None, infer_method: Optional[str] = None,
                   eval_stability: bool = False, likelihood_reduction: str = "sum",
                   dataset_name: Optional[str] = None, output_dir: Optional[str] = None,
                   metric_options: Optional[Dict[str, Any]] = None, export_mme_results: Optional[str] = None,
                   seed: int = 0, n_boot: int = 1000, quiet: bool = False) -> Dict[str, Any]:
    """Score every prediction file (each gets its own results); with several runs, compare them.

    A file that holds several models' records (the MMMT-IF release CSV) is split into one run
    per model. Returns ``{"runs": [...], "comparison": ... or None}``.

    Order, so that a failure leaves the previous state: every file is read and checked (and the
    export target) before anything is scored; everything is scored and staged before anything
    is renamed into place (one ``Commit``); the run index lines are appended last.
    """
    files = expand_prediction_files(paths)
    real = [os.path.realpath(f) for f in files]  # a link to a given file is that file
    if len(set(real)) != len(files):
        twice = next(f for f, r in zip(files, real) if real.count(r) > 1)
        raise ReformError(f"the same prediction file is given twice: {twice}")
    loaded = []
    for path in files:  # every file read and checked before anything is written
        records = load_records(path, dataset_name)
        if not records:
            raise ReformError(f"{path}: holds no prediction records")
        for group in split_by_model(records).values():  # a file may hold several models' records
            validate_records(group, path)
        if export_mme_results:
            check_export(records, "MME", export_mme_results, path)
        loaded.append((path, records))
    if export_mme_results and len(files) > 1:
        raise ReformError(f"{export_mme_results}: --export_mme_results takes one prediction file "
                          f"({len(files)} given): an export folder holds one run's results")
    if len(files) == 1 and any(r.get("release_reference") for r in loaded[0][1]):
        # the MMMT-IF release CSV: the paper's analyses of its three models
        return {"runs": [], "comparison": None,
                "release_report": print_release_report(loaded[0][1], loaded[0][0], output_dir, quiet=quiet)}
    if output_dir:  # made only now: every file was read and checked
        ensure_writable_dir(output_dir, "--output_dir")
    compare_dir = output_dir or _common_dir(files)
    clean_output_temps(compare_dir, *{os.path.dirname(os.path.abspath(f)) for f in files},
                       os.path.dirname(os.path.abspath(export_mme_results)) if export_mme_results else None)
    runs: List[Dict[str, Any]] = []
    comparison = None
    with Commit("run_loader_eval outputs") as c:
        for path, records in loaded:
            groups = split_by_model(records)
            tag = options_tag(formulation=formulation, infer_method=infer_method, eval_stability=eval_stability,
                              likelihood_reduction=likelihood_reduction, metric_options=metric_options,
                              prediction_file=os.path.abspath(path))
            for model, recs in groups.items():
                sub_tag = tag if len(groups) == 1 else f"{tag}.{_slug(model)}"
                result = score_records(recs, formulation, infer_method, eval_stability, likelihood_reduction,
                                       prediction_file=path, output_dir=output_dir,
                                       metric_options=metric_options,
                                       quiet=quiet or len(files) > 1 or len(groups) > 1,
                                       tag=sub_tag, tool="run_loader_eval", commit=c,
                                       extra=provenance_extra(records))
                runs.append({"name": model if len(groups) > 1 else run_name(recs, path), "records": recs,
                             "result": result})
            if export_mme_results:
                export_results(records, "MME", export_mme_results, prediction_file=path, commit=c,
                               likelihood_reduction=likelihood_reduction)
        runs += release_reference_runs(runs)
        _unique_names(runs)
        if len(runs) > 1:
            comparison = compare_runs(runs, compare_dir, seed=seed, n_boot=n_boot, commit=c)
    if comparison is not None and not quiet:  # the headline table; the rest is one path away
        print(headline_markdown(comparison) + "\n")
        print(f"comparison of {len(runs)} runs: {comparison['files'].get('report_html')} (every table: "
              f"{comparison['files']['comparison_md']})")
    elif not quiet:
        files = runs[0]["result"].get("results_files", {})
        print(f"results: {files.get('json')} (every table: {files.get('md')})")
    return {"runs": runs, "comparison": comparison}


def release_reference_runs(runs: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """For MMMT-IF runs built from the release: the three released models' per-turn PIF on the
    same turns, as extra runs beside the user's (paired on (chat, turn))."""
    if not runs or any(str(r["records"][0].get("benchmark")) != "MMMT-IF" for r in runs):
        return []
    if any(r["records"][0].get("release_reference") for r in runs):
        return []
    # the rows come from a run asked as the release was (they pair with it), else from the first
    source = next((r for r in runs if any(in_release_setting(x) for x in r["records"])), runs[0])
    refs = reference_records_from(source["records"])
    if not refs:
        return []
    out = []
    for model, recs in split_by_model(refs).items():
        result = score_records(recs, write=False, quiet=True)
        out.append({"name": f"{model} (release)", "records": recs, "result": result})
    return out


def split_by_model(records: List[Dict[str, Any]]) -> Dict[str, List[Dict[str, Any]]]:
    """Records grouped by their ``model`` field (one group when it is absent or single)."""
    groups: Dict[str, List[Dict[str, Any]]] = {}
    for r in records:
        groups.setdefault(str(r.get("model") or ""), []).append(r)
    return groups if len(groups) > 1 else {next(iter(groups)): records}


def _slug(text: str) -> str:
    """A file-name-safe label: the first 40 characters, plus a hash of the whole text, so two
    names that differ anywhere (also after character 40, or only in replaced characters) never
    share a results file."""
    readable = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in text)[:40]
    return f"{readable}-{hashlib.sha256(text.encode('utf-8', 'surrogatepass')).hexdigest()[:8]}"


def _unique_names(runs: List[Dict[str, Any]]) -> None:
    """Runs of one model get told apart: by inference method where that suffices, else by file stem."""
    def dupes() -> Dict[str, int]:
        counts: Dict[str, int] = {}
        for r in runs:
            counts[r["name"]] = counts.get(r["name"], 0) + 1
        return counts
    counts = dupes()
    for r in runs:
        if counts[r["name"]] > 1 and r["result"].get("infer_method"):
            r["name"] = f"{r['name']} {r['result']['infer_method']}"
    counts = dupes()
    for r in runs:
        if counts[r["name"]] > 1 and r["result"].get("prediction_file"):
            r["name"] = f"{r['name']} ({results_paths(r['result']['prediction_file'])['stem']})"
    counts = dupes()
    for r in runs:  # same stem in other folders: the folder tells them apart
        if counts[r["name"]] > 1 and r["result"].get("prediction_file"):
            folder = os.path.basename(os.path.dirname(os.path.abspath(r["result"]["prediction_file"])))
            r["name"] = f"{r['name']} [{folder}]"
    counts = dupes()
    seen: Dict[str, int] = {}
    for r in runs:  # anything still alike is numbered in the order given
        if counts[r["name"]] > 1:
            seen[r["name"]] = seen.get(r["name"], 0) + 1
            r["name"] = f"{r['name']} #{seen[r['name']]}"


def _common_dir(files: Sequence[str]) -> str:
    dirs = [os.path.dirname(os.path.abspath(os.path.normpath(f))) for f in files]
    return os.path.commonpath(dirs) if dirs else "."


def summary_table(runs: List[Dict[str, Any]], breakdown: str = "complexity") -> str:
    """One compact markdown table of several runs: the headline accuracy (or PIF / MME score),
    the chance level, the format hit rate and one column per group of ``breakdown``."""
    groups: List[str] = []
    for r in runs:
        for g in (r["result"]["metrics"].get("by", {}).get(breakdown) or {}):
            if g not in groups:
                groups.append(g)
    header = ["model", "method"] + [f"{breakdown} {g}" for g in groups] + ["overall", "chance", "format hit rate"]
    rows = []
    for r in runs:
        m = r["result"]["metrics"]
        by = m.get("by", {}).get(breakdown) or {}
        overall = m.get("accuracy", m.get("pif", m.get("total_score")))
        rows.append([r["name"], r["result"].get("infer_method", "")] +
                    [by[g]["accuracy"] if g in by else "" for g in groups] +
                    [overall, m.get("chance", ""), "n/a" if m.get("format_hit_rate") is None else m["format_hit_rate"]])
    return markdown_table(header, rows)
