"""iWISDM metric: accuracy overall and broken down the way the paper analyses models.

Why every breakdown carries a chance level, computed per sample: the paper defines chance as
"randomly guessing one of the applicable actions", so a sample's chance is 1 / the number of
answers it offers (SingleChoice: its ``answer_options``; Generation: ``meta.applicable_answers``,
which are also its likelihood candidates). A group's chance is the mean over its samples, the
accuracy the ``random`` baseline reaches in expectation.
"""
from __future__ import annotations

from collections import defaultdict
from typing import Any, Dict, List, Optional, Tuple

from ..build.iwisdm.presets import PRESETS
from . import ReportSpec, register_metric, register_report
from .single_choice import accuracy_summary, score_generation_match, score_single_choice
from ..utils.report import markdown_table

#: meta keys copied into every per_sample entry (the breakdowns and the trial's structure)
SAMPLE_FIELDS = ("complexity", "feature_group", "response_type", "n_and", "n_or", "n_is_same", "n_not_same",
                 "n_switch", "n_delay", "n_stimuli", "n_distractors")

#: (breakdown name, meta key) pairs reported for every run
BREAKDOWNS: Tuple[Tuple[str, str], ...] = (
    ("complexity", "complexity"),
    ("features", "feature_group"),
    ("n_and", "n_and"),
    ("n_or", "n_or"),
    ("n_is_same", "n_is_same"),
    ("n_not_same", "n_not_same"),
    ("n_switch", "n_switch"),
    ("n_delay", "n_delay"),
    ("n_stimuli", "n_stimuli"),
    ("response_type", "response_type"),
)


register_report("iwisdm", ReportSpec(family="accuracy", strata="complexity", breakdowns=BREAKDOWNS,
                                     group_order={"complexity": tuple(PRESETS)},
                                     per_sample_fields=SAMPLE_FIELDS + ("chance",)))


def sample_chance(rec: Dict[str, Any], formulation: str) -> float:
    """1 / the number of answers this sample offers (older records without them: ``meta.chance``)."""
    meta = rec.get("meta", {}) if isinstance(rec.get("meta"), dict) else {}
    offered = rec.get("answer_options") if formulation == "SingleChoice" else meta.get("applicable_answers")
    if isinstance(offered, list) and offered:
        return 1.0 / len(offered)
    return float(meta.get("chance", 0.0))


def _order(name: str):
    """Complexity rows in the presets' order (low, medium, high, ...), other keys sorted."""
    rank = {p: i for i, p in enumerate(PRESETS)}
    if name == "complexity":
        return lambda k: (rank.get(str(k), len(rank)), str(k))
    return lambda k: (str(type(k)), k)


def _group_table(title: str, groups: Dict[Any, List[Tuple[bool, float]]]) -> Tuple[Dict[str, Any], str]:
    rows = {}
    table_rows = []
    for key in sorted(groups, key=_order(title)):
        vals = groups[key]
        acc = sum(c for c, _ in vals) / len(vals)
        chance = sum(ch for _, ch in vals) / len(vals)
        rows[str(key)] = {"n": len(vals), "accuracy": acc, "chance": chance}
        table_rows.append((key, len(vals), acc, chance))
    return rows, markdown_table([title, "n", "accuracy", "chance"], table_rows)


def add_sample_fields(per_sample: List[Dict[str, Any]], records: List[Dict[str, Any]],
                      chances: List[float]) -> None:
    """Copy the trial's breakdown fields and the chance the metric used into its per_sample
    entry (the trial is its own cluster)."""
    for ps, rec, ch in zip(per_sample, records, chances):
        meta = rec.get("meta") or {}
        for key in SAMPLE_FIELDS:
            ps[key] = meta.get(key)
        ps["chance"] = ch


@register_metric("iwisdm", benchmarks={"iWISDM": ["SingleChoice", "Generation"]})
def iwisdm_metric(records: List[Dict[str, Any]], formulation: str = "Generation",
                  infer_method: str = "generation", eval_stability: bool = False,
                  likelihood_reduction: str = "sum", file: Optional[str] = None, **_: Any) -> Dict[str, Any]:
    """Accuracy with per-preset, per-feature, per-operator-count, per-delay and per-response-type tables."""
    if formulation == "SingleChoice":
        per_sample = score_single_choice(records, infer_method, likelihood_reduction, file)
    else:
        per_sample = score_generation_match(records, infer_method, likelihood_reduction, file,
                                            vocabulary_key="answer_vocabulary")
    metrics = accuracy_summary(per_sample, infer_method, eval_stability)
    chances = [sample_chance(r, formulation) for r in records]
    add_sample_fields(per_sample, records, chances)
    metrics["chance"] = sum(chances) / len(chances) if chances else 0.0
    tables: Dict[str, str] = {}
    by: Dict[str, Any] = {}
    for name, key in BREAKDOWNS:
        groups: Dict[Any, List[Tuple[bool, float]]] = defaultdict(list)
        for rec, ps, ch in zip(records, per_sample, chances):
            meta = rec.get("meta", {})
            if key in meta:
                groups[meta[key]].append((bool(ps["correct"]), ch))
        if groups:
            by[name], tables[f"iWISDM accuracy by {name}"] = _group_table(name, groups)
    metrics["by"] = by
    return {"metrics": metrics, "per_sample": per_sample, "tables": tables}
