"""PIF over a corpus: the registered ``pif`` metric, its breakdowns and statistics.

Why apart from the checkers: aggregation (PIF by turn with Bernoulli CIs, by instruction,
by number of instructions, PIF-N-K, PIF-IQR-N, the ECDF) is the paper's Section 4 and does
not depend on how a response is read; metrics/mmmt_if_release.py reuses it for the
release's own scores.
"""
from __future__ import annotations

import logging
import math
from collections import defaultdict
from typing import Any, Dict, Final, List, Optional, Sequence, Tuple

from ..build.mmmt_if_instructions import CATEGORY_OF, INSTRUCTION_IDS, instruction_id
from . import ReportSpec, register_metric, register_report
from .pif_checkers import check_instructions, verdicts
from ..utils.errors import ReformError, input_error

logger = logging.getLogger(__name__)


def bernoulli_ci(values: Sequence[float], z: float = 1.96) -> Tuple[float, float, float]:
    """(mean, low, high): normal approximation with the Bernoulli variance p(1-p)/n.

    Why Bernoulli: among distributions on [0, 1] with a given mean it has the largest
    variance, so the interval is conservative (as in the paper).
    """
    n = len(values)
    if n == 0:
        return float("nan"), float("nan"), float("nan")
    p = float(sum(values)) / n
    half = z * math.sqrt(max(p * (1.0 - p), 0.0) / n)
    return p, max(0.0, p - half), min(1.0, p + half)


def pif_n_k(pif_lists: Sequence[Sequence[float]], n: Optional[int] = None) -> Dict[int, float]:
    """PIF-N-K for K = 1..N: the fraction of turns where at least K of N responses have PIF 1."""
    if not pif_lists:
        return {}
    n = n or min(len(x) for x in pif_lists)
    perfect = [sum(1 for v in x[:n] if v >= 1.0 - 1e-12) for x in pif_lists]
    return {k: sum(1 for c in perfect if c >= k) / len(perfect) for k in range(1, n + 1)}


#: numpy percentile method used for PIF-IQR-N (Hyndman & Fan type 7, numpy's default)
IQR_METHOD: Final = "linear"


def iqr(values: Sequence[float]) -> float:
    """Interquartile range Q3 - Q1 with linear interpolation between order statistics."""
    import numpy as np  # (not at every start of run_eval: numpy and its BLAS threads cost 0.2 CPU s)

    q1, q3 = np.percentile(np.asarray(values, dtype=float), [25, 75], method=IQR_METHOD)
    return float(q3 - q1)


def ecdf(values: Sequence[float]) -> List[List[float]]:
    """Empirical CDF as [[x, P(PIF <= x)], ...] at each distinct value x."""
    if not values:
        return []
    xs = sorted(values)
    n = len(xs)
    out: List[List[float]] = []
    for i, x in enumerate(xs):
        if i + 1 < n and xs[i + 1] == x:
            continue
        out.append([round(x, 6), (i + 1) / n])
    return out


def _fmt(x: Any) -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.3f}"


def _record_responses(rec: Dict[str, Any]) -> List[str]:
    preds = rec.get("predictions")
    if isinstance(preds, list) and preds:
        return [p if isinstance(p, str) else "" for p in preds]
    p = rec.get("prediction")
    return [p if isinstance(p, str) else ""]


def _record_instructions(rec: Dict[str, Any], i: int) -> List[str]:
    meta = rec.get("meta") or {}
    if "instructions" not in meta:
        raise input_error("MMMT-IF prediction record has no meta.instructions",
                          record=rec.get("sample_id", i), field="meta.instructions")
    try:
        return [instruction_id(x) for x in meta["instructions"]]
    except ReformError as e:
        raise input_error(str(e), record=rec.get("sample_id", i), field="meta.instructions") from None


def sample_fields(rec: Dict[str, Any], response: str) -> Dict[str, Any]:
    """The per_sample fields shared with the accuracy metrics; the chat is the bootstrap unit
    and the checked response is what was 'extracted'."""
    meta = rec.get("meta") or {}
    answer = rec.get("answer_text", rec.get("answer"))
    return {"sample_id": rec.get("sample_id"), "dup_index": int(rec.get("dup_index", 0) or 0),
            "cluster": str(meta.get("chat_id", rec.get("sample_id"))), "question": rec.get("question"),
            "answer_text": None if answer is None else str(answer), "prediction": rec.get("prediction"),
            "extracted": response}


def _reported_pif(rec: Dict[str, Any], i: int = 0) -> Optional[float]:
    """A precomputed per-turn PIF (release reference rows), used when there is no response."""
    v = rec.get("reported_pif")
    if v is None or rec.get("prediction") is not None or rec.get("predictions"):
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0.0 <= float(v) <= 1.0:
        raise input_error(f"reported_pif must be a number in [0, 1], got {v!r}",
                          record=rec.get("sample_id", i), field="reported_pif")
    return float(v)


register_report("pif", ReportSpec(family="pif", breakdowns=(("turn", "turn"), ("num_instructions", "num_instructions")),
                                  items=INSTRUCTION_IDS, spread=iqr,
                                  per_sample_fields=("chat_id", "turn", "instructions", "followed", "checks")))


@register_metric("pif", benchmarks={"MMMT-IF": ["Generation"]})
def pif_metric(records: List[Dict[str, Any]], number_words: bool = False, **_: Any) -> Dict[str, Any]:
    """Score MMMT-IF predictions: PIF (strict and loose), breakdowns, PIF-N-K and PIF-IQR-N.

    PIF uses each record's first response ('prediction'); with N sampled responses
    ('predictions'), PIF-N-K (K=1..N), PIF-IQR-N and the mean PIF over all N are added.
    """
    per_sample: List[Dict[str, Any]] = []
    answered = [r for r in records if _reported_pif(r) is None]
    n_resp = min((len(_record_responses(r)) for r in answered), default=1)
    if any(len(_record_responses(r)) != n_resp for r in answered):
        logger.warning("MMMT-IF records have different numbers of responses; using N=%d", n_resp)
    for i, rec in enumerate(records):
        ids = _record_instructions(rec, i)
        reported = _reported_pif(rec, i)
        if reported is not None:
            # a released score without a response (metrics/mmmt_if_release.py): no verdicts
            meta = rec.get("meta") or {}
            per_sample.append({
                "sample_id": rec.get("sample_id"), "chat_id": meta.get("chat_id"), "turn": meta.get("turn"),
                "instructions": ids, "followed": None, "followed_loose": None, "pif": reported,
                "pif_loose": None, "pif_samples": [reported] * n_resp, "reported_pif": True,
            })
            continue
        responses = _record_responses(rec)[:n_resp]
        strict0, loose0, reasons = verdicts(responses[0], ids, number_words)
        strict = [strict0] + [check_instructions(r, ids, number_words=number_words) for r in responses[1:]]
        pifs = [sum(f) / len(f) if f else 1.0 for f in strict]
        meta = rec.get("meta") or {}
        per_sample.append({
            **sample_fields(rec, responses[0]), "chat_id": meta.get("chat_id"), "turn": meta.get("turn"),
            "num_instructions": len(ids), "instructions": ids, "followed": strict[0], "followed_loose": loose0,
            "checks": [{"instruction": iid, "followed": ok, "followed_loose": ok_l, "reason": why}
                       for iid, ok, ok_l, why in zip(ids, strict[0], loose0, reasons)],
            "pif": pifs[0], "pif_loose": sum(loose0) / len(loose0) if loose0 else 1.0,
            "pif_samples": pifs,
        })
    return summarize(per_sample, n_resp)


def summarize(per_sample: List[Dict[str, Any]], n_resp: int = 1) -> Dict[str, Any]:
    """Aggregate per-turn verdicts into the PIF metrics and the tables for the log."""
    import numpy as np

    pifs = [s["pif"] for s in per_sample]
    loose = [s["pif_loose"] for s in per_sample if s["pif_loose"] is not None]
    metrics: Dict[str, Any] = {
        "pif": float(np.mean(pifs)),
        "pif_loose": float(np.mean(loose)) if loose else None,
        "num_turns": len(per_sample),
        "num_chats": len({s["chat_id"] for s in per_sample}),
        "num_turns_without_instructions": sum(1 for s in per_sample if not s["instructions"]),
        "num_responses_per_turn": n_resp,
    }
    by_turn: Dict[int, List[float]] = defaultdict(list)
    by_num: Dict[int, List[float]] = defaultdict(list)
    cond: Dict[str, List[float]] = defaultdict(list)
    follow: Dict[str, List[bool]] = defaultdict(list)
    follow_loose: Dict[str, List[bool]] = defaultdict(list)
    for s in per_sample:
        if s["turn"] is not None:
            by_turn[int(s["turn"])].append(s["pif"])
        by_num[len(s["instructions"])].append(s["pif"])
        for j, iid in enumerate(s["instructions"]):
            cond[iid].append(s["pif"])
            if s["followed"] is not None:  # released scores carry no per-instruction verdicts
                follow[iid].append(s["followed"][j])
                follow_loose[iid].append(s["followed_loose"][j])
    # intervals are the reporting layer's (one cluster-bootstrap method on every surface)
    metrics["pif_by_turn"] = {str(t): {"pif": float(np.mean(by_turn[t])), "n": len(by_turn[t])}
                              for t in sorted(by_turn)}
    metrics["pif_by_num_instructions"] = {str(k): {"pif": float(np.mean(v)), "n": len(v)}
                                          for k, v in sorted(by_num.items())}
    metrics["pif_by_instruction"] = {
        iid: {"pif_given": float(np.mean(cond[iid])),
              "followed": float(np.mean(follow[iid])) if follow[iid] else None,
              "followed_loose": float(np.mean(follow_loose[iid])) if follow_loose[iid] else None,
              "n": len(cond[iid])}
        for iid in INSTRUCTION_IDS if iid in cond}
    metrics["pif_ecdf"] = {"all": ecdf(pifs), "by_turn": {str(t): ecdf(v) for t, v in sorted(by_turn.items())}}
    samples = [s["pif_samples"] for s in per_sample]
    if n_resp > 1:  # consistency over N responses per turn; with one there is none to measure
        nk = pif_n_k(samples, n_resp)
        for k, v in nk.items():
            metrics[f"pif_{n_resp}_{k}"] = v
        metrics[f"pif_iqr_{n_resp}"] = float(np.mean([iqr(x) for x in samples]))
        metrics["pif_iqr_method"] = f"numpy.percentile method='{IQR_METHOD}' (Hyndman-Fan type 7)"
    metrics["pif_mean_over_samples"] = float(np.mean([np.mean(x) for x in samples]))
    return {"metrics": metrics, "per_sample": per_sample, "tables": _tables(metrics, n_resp)}


def _tables(m: Dict[str, Any], n_resp: int) -> Dict[str, str]:
    rows = ["| turn | n | PIF |", "|---:|---:|---:|"]
    for t, v in m["pif_by_turn"].items():
        rows.append(f"| {t} | {v['n']} | {_fmt(v['pif'])} |")
    per_turn = "\n".join(rows)
    rows = ["| instruction | category | n | followed (strict) | followed (loose) | PIF given it |",
            "|---|---|---:|---:|---:|---:|"]
    for iid, v in m["pif_by_instruction"].items():
        rows.append(f"| {iid} | {CATEGORY_OF[iid]} | {v['n']} | {_fmt(v['followed'])} | "
                    f"{_fmt(v['followed_loose'])} | {_fmt(v['pif_given'])} |")
    per_instr = "\n".join(rows)
    rows = ["| instructions given | n | PIF |", "|---:|---:|---:|"]
    for k, v in m["pif_by_num_instructions"].items():
        rows.append(f"| {k} | {v['n']} | {_fmt(v['pif'])} |")
    by_num = "\n".join(rows)
    rows = ["| metric | value |", "|---|---:|", f"| PIF (strict) | {_fmt(m['pif'])} |",
            f"| PIF (loose) | {_fmt(m['pif_loose'])} |"]
    if n_resp > 1:
        for k in range(1, n_resp + 1):
            rows.append(f"| PIF-{n_resp}-{k} | {_fmt(m[f'pif_{n_resp}_{k}'])} |")
        rows.append(f"| PIF-IQR-{n_resp} | {_fmt(m[f'pif_iqr_{n_resp}'])} |")
    return {"MMMT-IF summary": "\n".join(rows), "MMMT-IF PIF by turn": per_turn,
            "MMMT-IF PIF by instruction": per_instr, "MMMT-IF PIF by number of instructions": by_num}
