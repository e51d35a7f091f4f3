"""``run_loader_eval --explain A B``: two runs from their files, each scored with its own recorded
settings, explained (``evaluation.reporting.explain``).

A and B may each be a prediction file, its results file (``<stem>[.<tag>].results.json``: the
scoring it names is the one used), its run file (``<stem>.run.json``), its report folder
(``<stem>.report/``), or a folder holding one prediction file. A prediction file is scored as
its run recorded: with ``<stem>.results.json`` (what ``run_eval --do_eval`` wrote), else its one
tagged results file (``<stem>.eval-*`` / ``<stem>.scored-*``), else the defaults (as
``run_loader_eval`` scores a file). Its run-level record (config, provenance, versions) comes
from that file, or from the run's own results or run file beside the predictions.
"""
from __future__ import annotations

import os
import re
from typing import Any, Dict, List, Optional, Tuple

from .explain import (SCORING_FIELDS, explain_runs, explanation_notes, explanation_tables,
                                          format_explanation, recorded_info, run_facts, scoring_of)
from .scoring import check_setting_flags, expand_prediction_files, load_records, results_paths, run_name, score_records
from ...utils.commit import Commit
from ...utils.errors import ReformError, input_error
from ...utils.inputs import check_name, list_dir, read_json
from ...utils.predictions import ensure_writable_dir
from ...utils.report import markdown_table, md_text

#: a tagged results file of a prediction file's stem: run_eval's ``eval-`` or run_loader_eval's ``scored-``
_TAGGED = r"\.(?:eval|scored)-[0-9a-f]{8}(?:\.[^/]+)?\.results\.json$"


def _real(path: Optional[str]) -> Optional[str]:
    """A file as one name, however it was typed (relative, absolute, through a link); None stays None."""
    return os.path.realpath(path) if path else None


def _read_object(path: str, what: str) -> Dict[str, Any]:
    value = read_json(path, what)
    if not isinstance(value, dict):
        raise input_error("must be a JSON object", file=path)
    return value


def _prediction_of(info: Dict[str, Any], path: str) -> str:
    """The prediction file a results or run file names (or the same name beside it, for a
    folder that was moved)."""
    pred = info.get("prediction_file")
    if not isinstance(pred, str) or not pred:
        raise input_error("missing (the results file does not name its prediction file)", file=path,
                          field="prediction_file")
    if os.path.exists(pred):
        return pred
    beside = os.path.join(os.path.dirname(os.path.abspath(path)), os.path.basename(pred))
    if os.path.exists(beside):
        return beside
    raise input_error(f"names {pred}, which does not exist (nor beside the results file)", file=path,
                      field="prediction_file")


def results_of(prediction_file: str) -> Optional[str]:
    """The results file whose scoring a prediction file is explained with (see module docstring)."""
    own = results_paths(prediction_file)
    if os.path.isfile(own["json"]):
        return own["json"]
    pattern = re.compile("^" + re.escape(own["stem"]) + _TAGGED)
    tagged = [os.path.join(own["dir"], n) for n in list_dir(own["dir"], "prediction folder") if pattern.match(n)]
    if len(tagged) > 1:
        raise ReformError(f"{prediction_file}: scored {len(tagged)} ways ({', '.join(sorted(map(os.path.basename, tagged))[:3])}"
                          f"{' ...' if len(tagged) > 3 else ''}); pass the results file whose scoring you mean")
    return tagged[0] if tagged else None


def resolve(path: str) -> Tuple[str, Optional[str]]:
    """(prediction file, results file or None) that ``path`` stands for."""
    check_name(path, "--explain")
    if not os.path.exists(path):
        raise input_error("does not exist", file=path)
    base = os.path.basename(os.path.normpath(path))
    if os.path.isdir(path) and os.path.isfile(os.path.join(path, "comparison.json")) and base.endswith(".report"):
        models = _read_object(os.path.join(path, "comparison.json"), "comparison").get("models")
        if not isinstance(models, list) or len(models) != 1 or not isinstance(models[0], dict):
            raise input_error("must list the one run this report shows", file=os.path.join(path, "comparison.json"),
                              field="models")
        pred = _prediction_of(models[0], os.path.join(path, "comparison.json"))
        return pred, results_of(pred)
    if os.path.isfile(path) and base.endswith((".results.json", ".run.json")):
        return _prediction_of(_read_object(path, "results file"), path), path
    if os.path.isfile(path) and base.endswith((".per_sample.json", ".results.md")):
        raise input_error("is a file this tool writes; pass the prediction file or its results file", file=path)
    files = expand_prediction_files([path])
    if len(files) != 1:
        raise input_error(f"holds {len(files)} prediction files; pass the one to explain", file=path)
    return files[0], results_of(files[0]) if os.path.isfile(files[0]) else None


def load_run(path: str, dataset_name: Optional[str] = None, formulation: Optional[str] = None,
             infer_method: Optional[str] = None) -> Dict[str, Any]:
    """A run for ``explain_runs``: its records, scored with its own recorded settings, and its
    run-level record."""
    pred, results = resolve(path)
    info: Dict[str, Any] = _read_object(results, "results file") if results else {}
    source = results or pred
    options = info.get("metric_options") or {}
    if not isinstance(options, dict):
        raise input_error(f"must be an object, got {type(options).__name__}", file=source, field="metric_options")
    reduction = info.get("likelihood_reduction") or "sum"
    if reduction not in ("sum", "mean"):
        raise input_error(f"must be sum or mean, got {reduction!r}", file=source, field="likelihood_reduction")
    for field, valid in (("formulation", ("SingleChoice", "Generation")), ("infer_method", ("generation", "likelihood"))):
        if info.get(field) is not None and info[field] not in valid:
            raise input_error(f"must be {' or '.join(valid)}, got {info[field]!r}", file=source, field=field)
    records = load_records(pred, dataset_name)
    if not records:
        raise ReformError(f"{pred}: holds no prediction records")
    formulation, infer_method = check_setting_flags(info, formulation, infer_method, source)
    result = score_records(records, formulation, infer_method,
                           likelihood_reduction=reduction, prediction_file=pred, metric_options=dict(options),
                           write=False, quiet=True)
    if info.get("provenance") is None and info.get("config") is None:  # scored by run_loader_eval, or not at all
        own, own_file = recorded_info(pred)
        if not own and isinstance(getattr(records, "provenance", None), dict):
            own = {"provenance": getattr(records, "provenance")}  # another harness's log: what its reader tells of the run
        info, source = {**own, **{k: info[k] for k in SCORING_FIELDS if k in info}}, own_file or source
    run_info = {**info, **scoring_of(result)}
    run_facts(run_info, source)  # a malformed record is refused now, naming its file
    return {"name": run_name(records, pred), "records": records, "result": result, "info": run_info,
            "source": source, "scored_with": results}


def markdown(exp: Dict[str, Any]) -> str:
    """explain.md: the tables and the notes, ending with the summary line."""
    lines = [f"# Explanation: {md_text(exp['b']['name'])} against {md_text(exp['a']['name'])}", "",
             f"- A: {md_text(exp['a']['prediction_file'])}", f"- B: {md_text(exp['b']['prediction_file'])}", ""]
    for title, header, rows in explanation_tables(exp, max_rows=len(exp["flips"]) or 1):
        lines += [f"## {md_text(title)}", "", markdown_table(header, rows), ""]
    return "\n".join(lines + [md_text(n) + "\n" for n in explanation_notes(exp)])


def explain_files(a: str, b: str, dataset_name: Optional[str] = None, output_dir: Optional[str] = None,
                  formulation: Optional[str] = None, infer_method: Optional[str] = None,
                  quiet: bool = False, scoring_flags: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    """Explain run B against run A (paths as the module docstring says); print the explanation
    unless ``quiet``; with ``output_dir``, write ``explain.md`` and ``explain.json`` there.
    Both runs are read and checked before anything is written. ``scoring_flags`` (flag -> value
    given): any set is refused, each run being scored with the settings its results record."""
    given = [flag for flag, on in (scoring_flags or {}).items() if on]
    if given:
        raise ReformError(f"--explain scores each run with the settings its results file records; leave out "
                          f"{', '.join(given)} (re-score a run with them first, then explain its results file)")
    runs: List[Dict[str, Any]] = [load_run(p, dataset_name, formulation, infer_method) for p in (a, b)]
    if len({_real(run["result"]["prediction_file"]) for run in runs}) == 1 \
            and len({_real(run["scored_with"]) for run in runs}) == 1:
        raise ReformError(f"--explain: {a} and {b} are the same run scored the same way; nothing to explain")
    exp = explain_runs(runs[0], runs[1])
    for side, run in zip(("a", "b"), runs):
        exp[side]["scored_with"] = run["scored_with"]
    if output_dir:
        ensure_writable_dir(output_dir, "--output_dir")
        with Commit(f"explanation in {output_dir}") as c:
            c.write_text(os.path.join(output_dir, "explain.md"), markdown(exp))
            c.write_json(os.path.join(output_dir, "explain.json"), exp, last=True)
        exp["files"] = {"md": os.path.join(output_dir, "explain.md"), "json": os.path.join(output_dir, "explain.json")}
    if not quiet:
        print(format_explanation(exp))
    return exp
