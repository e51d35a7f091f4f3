"""Metric registry and the one scoring entry point shared by run_eval and run_loader_eval.

A metric is a function ``fn(records, **options) -> dict`` returning
``{"metrics": {...}, "per_sample": [...], "tables": {title: markdown}}``; per-sample
entries keep the extracted answer beside the verdict so every score can be explained.
"""
from __future__ import annotations

if not __name__.startswith("reform_eval."):  # this folder reached under its short name: one copy only
    from reform_eval import refuse_short_name
    refuse_short_name(__name__)

import importlib
import inspect
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from .reasoning import strip_reasoning_records
from ..utils.errors import ReformError, unknown_name
from ..utils.report import markdown_table

METRICS: Dict[str, Callable[..., Dict[str, Any]]] = {}

#: benchmark name -> {formulation: metric name}; set by register_metric(benchmarks=...)
BENCHMARK_METRICS: Dict[str, Dict[str, str]] = {}

#: generic metric per formulation when a benchmark registers none
DEFAULT_METRICS = {"SingleChoice": "single_choice", "Generation": "exact_match"}

METRIC_MODULES = ("reform_eval.metrics.single_choice", "reform_eval.metrics.iwisdm", "reform_eval.metrics.mme", "reform_eval.metrics.pif",
                  "reform_eval.metrics.mme_lmms_eval", "reform_eval.metrics.mme_vlmevalkit")  # the last two: other harnesses' MME files


def register_metric(name: str, benchmarks: Optional[Dict[str, List[str]]] = None):
    """Register a metric; ``benchmarks`` maps a benchmark name to the formulations it scores."""
    def deco(fn: Callable[..., Dict[str, Any]]):
        METRICS[name] = fn
        for bench, forms in (benchmarks or {}).items():
            for form in forms:
                BENCHMARK_METRICS.setdefault(bench, {})[form] = name
        return fn
    return deco


#: option name -> its valid values, for metric options whose default (None) tells nothing;
#: registered by the metric module (``register_option_choices``) so a bad value fails before inference
OPTION_CHOICES: Dict[str, tuple] = {}


def register_option_choices(option: str, choices: tuple) -> None:
    OPTION_CHOICES[option] = tuple(choices)


@dataclass(frozen=True)
class ReportSpec:
    """What reporting needs to know about one metric's per-sample entries, so that reporting
    (bootstrap, comparison, plots) names no benchmark: the metric registers it beside itself.

    ``family`` picks how the bootstrap recomputes the numbers: "accuracy" (the mean of
    ``correct``), "mme" (per-subtask acc + acc+ summed into ``score_groups``) or "pif" (per-turn
    scores with per-item verdicts). ``strata``: the per-sample field whose values the design
    fixes (resampled within). ``breakdowns``: (name, per-sample field) pairs; ``group_order``:
    breakdown name -> its groups' preferred order (others follow, sorted). ``subtasks``: the
    stratum values in report order (all of them, so a subsample's missing ones can be named),
    ``subtask_sizes`` their full sizes (entries) so short ones are named too;
    ``score_groups``: headline name -> the subtasks whose scores it sums. ``items``: the named
    items of an item breakdown (instruction ids), in report order; ``spread``: the per-entry
    spread of repeated samples (PIF-IQR-N). ``per_sample_fields``: fields the metric copies into
    each per-sample entry for the breakdowns and the per-sample browser. ``chance``: statistic ->
    the value a uniform guesser reaches in every group (plots draw it as the chance line).
    """
    family: str = "accuracy"
    strata: Optional[str] = None
    breakdowns: Tuple[Tuple[str, str], ...] = ()
    group_order: Dict[str, Tuple[str, ...]] = field(default_factory=dict)
    subtasks: Tuple[str, ...] = ()
    subtask_sizes: Dict[str, int] = field(default_factory=dict)
    score_groups: Tuple[Tuple[str, Tuple[str, ...]], ...] = ()
    items: Tuple[str, ...] = ()
    spread: Optional[Callable[[Sequence[float]], float]] = None
    per_sample_fields: Tuple[str, ...] = ()
    chance: Dict[str, float] = field(default_factory=dict)


def coverage_note(counts: Dict[str, int], members: Sequence[str], sizes: Dict[str, int]) -> Optional[str]:
    """"3 of 14 subtasks missing, 2 incomplete" for a total summed over ``members`` when some have
    no entries (``counts``) or fewer than their full size (``sizes``); None when the total is whole.
    Why: a subsample's total reads as a full score unless it says what it lacks."""
    missing = [s for s in members if counts.get(s, 0) == 0]
    short = [s for s in members if 0 < counts.get(s, 0) < sizes.get(s, 0)]
    parts = ([f"{len(missing)} of {len(members)} subtasks missing"] if missing else []) + (
        [f"{len(short)} incomplete"] if short else [])
    return ", ".join(parts) or None


#: metric name -> its ReportSpec; metrics that register none are reported as plain accuracy
REPORT_SPECS: Dict[str, ReportSpec] = {}


def register_report(metric: str, spec: ReportSpec) -> None:
    """Tell reporting how to read a metric's per-sample entries (one line beside the metric)."""
    REPORT_SPECS[metric] = spec


def report_spec(metric: Optional[str]) -> ReportSpec:
    """The metric's ReportSpec (the plain accuracy one when it registered none)."""
    return REPORT_SPECS.get(str(metric), ReportSpec())


for _mod in METRIC_MODULES:
    try:
        importlib.import_module(_mod)
    except ModuleNotFoundError as e:
        if e.name != _mod:
            raise


def get_metric(name: str) -> Callable[..., Dict[str, Any]]:
    if name not in METRICS:
        raise unknown_name("metric", name, METRICS)
    return METRICS[name]


#: options every metric takes, applied here before the metric runs: name -> default
COMMON_OPTIONS: Dict[str, Any] = {"strip_reasoning": False}

#: keyword arguments every metric receives from the scoring path (not user options)
STANDARD_ARGS = ("records", "formulation", "infer_method", "eval_stability", "likelihood_reduction", "file")


def check_metric_options(name: str, options: Dict[str, Any]) -> None:
    """``--metric_option`` keys must be parameters of the metric, and values of the default's type."""
    params = {p.name: p for p in inspect.signature(get_metric(name)).parameters.values()
              if p.kind is p.KEYWORD_ONLY or p.kind is p.POSITIONAL_OR_KEYWORD}
    valid = {k: p.default for k, p in params.items() if k not in STANDARD_ARGS}
    valid.update(COMMON_OPTIONS)
    for key, value in options.items():
        if key not in valid:
            raise ReformError(f"--metric_option: unknown option '{key}' for metric '{name}'; valid options: "
                              f"{', '.join(sorted(valid)) or 'none'}")
        default = valid[key]
        if key in OPTION_CHOICES and value not in OPTION_CHOICES[key]:
            raise ReformError(f"--metric_option {key}: must be one of {', '.join(map(str, OPTION_CHOICES[key]))}, "
                              f"got {value!r}")
        if isinstance(default, bool) and not isinstance(value, bool):
            raise ReformError(f"--metric_option {key}: expected true or false, got {value!r}")
        if isinstance(default, (int, float)) and not isinstance(default, bool) and (
                isinstance(value, bool) or not isinstance(value, (int, float))):
            raise ReformError(f"--metric_option {key}: expected a number, got {value!r}")


def metric_for(benchmark: Optional[str], formulation: str) -> str:
    """The metric name that scores ``benchmark`` under ``formulation``."""
    if benchmark and formulation in BENCHMARK_METRICS.get(benchmark, {}):
        return BENCHMARK_METRICS[benchmark][formulation]
    if formulation not in DEFAULT_METRICS:
        raise unknown_name("formulation", formulation, DEFAULT_METRICS)
    return DEFAULT_METRICS[formulation]


def evaluate(records: List[Dict[str, Any]], formulation: str, infer_method: str,
             eval_stability: bool = False, likelihood_reduction: str = "sum",
             metric: Optional[str] = None, **options: Any) -> Dict[str, Any]:
    """Score prediction records. Dispatches on the records' ``benchmark`` unless ``metric`` is given.

    Records marked ``skipped`` (``--context_policy skip``) are excluded from every metric
    and counted: ``metrics["skipped_samples"]`` and a "Skipped samples" table.
    """
    if not records:
        raise ReformError("no prediction records to score")
    records, skipped = split_skipped(records)
    if not records:
        raise ReformError(f"all {sum(skipped.values())} prediction records were skipped "
                          f"({', '.join(sorted(skipped))}); nothing to score")
    benchmarks = sorted({str(r.get("benchmark")) for r in records if r.get("benchmark")})
    if len(benchmarks) > 1:
        raise ReformError(f"prediction records mix benchmarks {benchmarks}; score them separately")
    name = metric or metric_for(benchmarks[0] if benchmarks else None, formulation)
    check_metric_options(name, {k: v for k, v in options.items() if k not in STANDARD_ARGS})
    originals = records
    if options.pop("strip_reasoning", False):
        records = strip_reasoning_records(records)
    result = get_metric(name)(records, formulation=formulation, infer_method=infer_method,
                              eval_stability=eval_stability, likelihood_reduction=likelihood_reduction,
                              **options)
    keep_responses_whole(result.get("per_sample") or [], originals)
    result.setdefault("tables", {})
    result["metric"] = name
    if skipped:
        n = sum(skipped.values())
        result["metrics"]["skipped_samples"] = n
        result["tables"]["Skipped samples (excluded from every metric)"] = markdown_table(
            ["reason", "samples"], sorted(skipped.items()) + [("total", n)])
    return result


def keep_responses_whole(per_sample: List[Dict[str, Any]], records: Sequence[Dict[str, Any]]) -> None:
    """Every response whole in the per-sample verdicts, whatever the metric read: ``prediction`` is
    the text scored; where that is less than the model wrote (``--strip_reasoning``, a reasoning
    block cut off with the answer) the entry adds ``raw_prediction``, the record's whole text;
    with several responses per sample, ``predictions`` (each whole, as the record holds them)."""
    by_key = {(str(r.get("sample_id")), int(r.get("dup_index", 0) or 0)): r for r in records}
    for p in per_sample:
        rec = by_key.get((str(p.get("sample_id")), int(p.get("dup_index", 0) or 0)))
        if rec is None:
            continue
        raw = rec.get("prediction")
        if isinstance(raw, str) and p.get("prediction") != raw:
            p["raw_prediction"] = raw
        many = rec.get("predictions")
        if isinstance(many, list) and len(many) > 1 and "predictions" not in p:
            p["predictions"] = list(many)


def split_skipped(records: Sequence[Dict[str, Any]]) -> Tuple[List[Dict[str, Any]], Dict[str, int]]:
    """(records to score, {reason: count} of skipped records)."""
    kept: List[Dict[str, Any]] = []
    reasons: Dict[str, int] = {}
    for r in records:
        if r.get("skipped"):
            key = str(r["skipped"]).split(":")[0]
            reasons[key] = reasons.get(key, 0) + 1
        else:
            kept.append(r)
    return kept, reasons
