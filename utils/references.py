"""Published results of well-known checkpoints (``configs/reference_results.yaml``): the one table
that docs/reference_results.md and the reports read.

Why: "does my number match the paper?" is the first question about a run; the report answers it
beside the run (the published value, its source, and how far the run is in units of the known
run-to-run spread), and the doc lists the same numbers, so the two cannot drift apart.
"""
from __future__ import annotations

import os
from typing import Any, Dict, List, Optional

import yaml

from .errors import input_error

DATA_FILE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "configs",
                         "reference_results.yaml")
#: how each metric is printed in the table (MME scores with their published precision)
METRIC_LABELS = {"perception_score": "MME perception", "cognition_score": "MME cognition", "pif": "MMMT-IF PIF"}


def load_references(path: str = DATA_FILE) -> Dict[str, Any]:
    """The reference table: ``{"references": [...], "sources": {...}}``, checked (every result
    names a known source and a number)."""
    try:
        with open(path, encoding="utf-8") as f:
            data = yaml.safe_load(f)
    except (OSError, yaml.YAMLError) as e:
        raise input_error(f"cannot read the reference table ({e})", file=path) from None
    refs = data.get("references") if isinstance(data, dict) else None
    sources = data.get("sources") if isinstance(data, dict) else None
    if not isinstance(refs, list) or not isinstance(sources, dict):
        raise input_error("must hold 'references' (a list) and 'sources' (a mapping)", file=path)
    for i, ref in enumerate(refs):
        for metric, values in (ref.get("results") or {}).items():
            for v in values:
                if v.get("source") not in sources or not isinstance(v.get("value"), (int, float)):
                    raise input_error(f"result of {metric} needs a number and a source of 'sources'",
                                      file=path, record=i, field="results")
    return data


def _names(name: str) -> List[str]:
    """A checkpoint name and its last path component, lower-cased (a local copy of
    ``llava-hf/llava-1.5-7b-hf`` in ``/models/llava-1.5-7b-hf`` matches by that component)."""
    n = str(name).strip().rstrip("/").lower()
    return [n, n.rsplit("/", 1)[-1]] if n else []


def match(checkpoint: Optional[str], benchmark: str, data: Optional[Dict[str, Any]] = None) -> Optional[Dict[str, Any]]:
    """The reference entry of ``benchmark`` whose checkpoint id or an alias names ``checkpoint``
    (case-insensitive; a path matches by its last component), else None."""
    if not checkpoint:
        return None
    data = data or load_references()
    wanted = set(_names(checkpoint))
    for ref in data["references"]:
        if str(ref.get("benchmark")) != benchmark:
            continue
        known = {n for alias in [ref["checkpoint"], *(ref.get("aliases") or [])] for n in _names(alias)}
        if wanted & known:
            return ref
    return None


def spread(ref: Dict[str, Any], metric: str) -> Optional[float]:
    """The known run-to-run spread of a metric: the largest difference between its published and
    rerun values (None with a single value)."""
    values = [float(v["value"]) for v in (ref.get("results") or {}).get(metric) or []]
    return max(values) - min(values) if len(values) > 1 else None


def published(ref: Dict[str, Any], metric: str) -> Optional[Dict[str, Any]]:
    """The authors' value of a metric (the first ``published`` one), else the first listed."""
    values = (ref.get("results") or {}).get(metric) or []
    return next((v for v in values if v.get("kind") == "published"), values[0] if values else None)


def beside(value: Optional[float], ref: Dict[str, Any], metric: str,
           data: Optional[Dict[str, Any]] = None) -> Optional[Dict[str, Any]]:
    """How a run's ``value`` of ``metric`` stands against the reference: the published value,
    its source, the difference, the spread and the difference in spreads (None without a spread)."""
    pub = published(ref, metric)
    if pub is None or value is None:
        return None
    data = data or load_references()
    diff = float(value) - float(pub["value"])
    sp = spread(ref, metric)
    src = data["sources"][pub["source"]]
    return {"checkpoint": ref["checkpoint"], "metric": metric, "value": float(value),
            "reference": float(pub["value"]), "source": pub["source"], "url": src["url"], "diff": diff,
            "spread": sp, "in_spreads": (diff / sp) if sp else None, "protocol": ref.get("protocol")}


def describe(row: Dict[str, Any]) -> str:
    """One sentence for a report: value, reference, source and distance in spreads."""
    label = METRIC_LABELS.get(row["metric"], row["metric"])
    ref = f"{row['reference']:g}"
    text = (f"{label} {row['value']:.2f} against the published {ref} for {row['checkpoint']} "
            f"({row['url']}): {row['diff']:+.2f}")
    if row["spread"]:
        return text + f", {row['in_spreads']:+.1f} times the known run-to-run spread of {row['spread']:.2f}."
    return text + "; no run-to-run spread is known for it."


def markdown_table(data: Optional[Dict[str, Any]] = None) -> str:
    """The reference table as docs/reference_results.md prints it (generated; kept equal by a test)."""
    data = data or load_references()
    lines = ["| checkpoint (aliases) | benchmark | metric | value | kind | source | spread |",
             "|---|---|---|---:|---|---|---:|"]
    for ref in data["references"]:
        names = ref["checkpoint"] + (f" ({', '.join(ref['aliases'])})" if ref.get("aliases") else "")
        for metric, values in ref["results"].items():
            sp = spread(ref, metric)
            for v in values:
                src = data["sources"][v["source"]]
                lines.append(f"| {names} | {ref['benchmark']} | {METRIC_LABELS.get(metric, metric)} | {v['value']} | "
                             f"{v['kind']} | [{v['source']}]({src['url']}) | {'-' if sp is None else f'{round(sp, 4):g}'} |")
    lines += ["", "| source | what it reports |", "|---|---|"]
    for sid, src in data["sources"].items():
        lines.append(f"| [{sid}]({src['url']}) | {src['reports']} |")
    return "\n".join(lines)
