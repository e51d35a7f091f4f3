"""The MMMT-IF release's own model scores as reference rows, and the paper's analyses of them.

The release CSV holds, for each of its 990 turns, the per-turn PIF that the paper measured
for Gemini 1.5 Pro, GPT-4o and Claude 3.5 Sonnet (no responses). ``read_release_records``
turns it into prediction records (one per model and turn, ``reported_pif`` instead of a
response), which the ``pif`` metric scores as they are; ``release_reference_report``
reproduces the paper's comparisons: corpus PIF (Table 3), PIF by turn with CIs, PIF by
number of instructions, pairwise Wilcoxon signed-rank tests on the same turns, and the
stochastic-dominance check of the per-turn empirical CDFs (Section 4.3).
"""
from __future__ import annotations

import math
from collections import OrderedDict, defaultdict
from itertools import combinations
from typing import Any, Dict, List, Sequence, Tuple

from ..build.mmmt_if import load_release
from .pif_scores import _fmt, pif_metric
from ..utils.bootstrap import cluster_interval
from ..utils.errors import ReformError
from ..utils.predictions import register_prediction_file_reader
from ..utils.predictions import ensure_writable_dir, write_json_atomic, write_text_atomic

#: release CSV column suffix -> model name used in records and tables
RELEASE_MODEL_NAMES: "OrderedDict[str, str]" = OrderedDict(
    [("Gemini", "Gemini 1.5 Pro"), ("GPT-4o", "GPT-4o"), ("Sonnet", "Claude 3.5 Sonnet")])
#: corpus PIF the paper prints in Table 3 (first row), for the side-by-side column
PAPER_TABLE3 = {"Gemini 1.5 Pro": 0.473, "GPT-4o": 0.647, "Claude 3.5 Sonnet": 0.771}


def read_release_records(path: str) -> List[Dict[str, Any]]:
    """One prediction record per released model and turn, carrying the released per-turn PIF."""
    data = load_release(path)
    records: List[Dict[str, Any]] = []
    for column, model in RELEASE_MODEL_NAMES.items():
        for rt in data.turns:
            value = rt.reported_pif.get(column)
            if value is None:
                raise ReformError(f"{path}: chat {rt.chat_id} turn {rt.turn}: no released PIF for {column}")
            records.append({
                "sample_id": f"{rt.chat_id}-t{rt.turn:02d}", "dup_index": 0, "benchmark": "MMMT-IF",
                "formulation": "Generation", "inference_method": "generation", "model": model,
                "release_reference": True, "question": rt.question, "prediction": None,
                "reported_pif": float(value),
                "meta": {"chat_id": rt.chat_id, "turn": rt.turn, "instructions": list(rt.instructions),
                         "new_instruction": rt.new_instruction, "topic": rt.topic,
                         "capability": rt.capability, "source": "release"}})
    return records


def in_release_setting(record: Dict[str, Any]) -> bool:
    """Whether a record's turn was asked as the released models were asked it (instructions
    where they were given, images with the first question): only then is the released PIF a
    measurement of the same item, to pair with in a comparison."""
    meta = record.get("meta") or {}
    return not meta.get("instructions_at_end") and meta.get("images_at", "start") == "start"


def reference_records_from(records: Sequence[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """The released models' rows for the turns of a run built from the release.

    Why: a user's run on ``source: release``/``release_only`` carries ``meta.release_pif``;
    these rows let the comparison put the three released models beside the user's model,
    paired on the same (chat, turn). Records without ``release_pif`` are left out.
    """
    out: List[Dict[str, Any]] = []
    for column, model in RELEASE_MODEL_NAMES.items():
        for r in records:
            meta = r.get("meta") or {}
            value = (meta.get("release_pif") or {}).get(column)
            if value is None or int(r.get("dup_index", 0)) != 0:
                continue
            out.append({"sample_id": r["sample_id"], "dup_index": 0, "benchmark": "MMMT-IF",
                        "formulation": "Generation", "inference_method": "generation", "model": model,
                        "release_reference": True, "question": r.get("question"), "prediction": None,
                        "reported_pif": float(value),
                        # the same turn, asked as the release asked it: pairs with the user's record
                        **({k: r[k] for k in ("item_sha", "sample_sha") if r.get(k) is not None}
                           if in_release_setting(r) else {}),
                        "meta": {k: meta.get(k) for k in ("chat_id", "turn", "instructions", "new_instruction",
                                                          "topic", "capability", "source")}})
    return out


def _by_model(records: Sequence[Dict[str, Any]]) -> "OrderedDict[str, List[Dict[str, Any]]]":
    groups: "OrderedDict[str, List[Dict[str, Any]]]" = OrderedDict()
    for r in records:
        groups.setdefault(str(r.get("model", "model")), []).append(r)
    return groups


def _turn_key(s: Dict[str, Any]) -> Tuple[str, Any]:
    return (str(s["chat_id"]), s["turn"])


def wilcoxon_pair(a: Dict[Tuple[str, Any], float], b: Dict[Tuple[str, Any], float]) -> Dict[str, Any]:
    """Wilcoxon signed-rank test of per-turn PIF on the turns both models answered.

    Zero differences are dropped (scipy's default ``zero_method='wilcox'``). ``p_two_sided``
    tests equality; ``p_b_greater`` is the one-sided test of the paper (H0: P(PIF_a > PIF_b)
    >= 0.5, i.e. the alternative that b scores higher).
    """
    from scipy.stats import wilcoxon
    keys = sorted(set(a) & set(b), key=lambda k: (k[0], str(k[1])))
    xa = [a[k] for k in keys]
    xb = [b[k] for k in keys]
    diffs = [y - x for x, y in zip(xa, xb)]
    out: Dict[str, Any] = {"n_pairs": len(keys), "n_nonzero": sum(1 for d in diffs if d != 0),
                           "mean_diff_b_minus_a": (sum(diffs) / len(diffs)) if diffs else float("nan")}
    if out["n_nonzero"] == 0:
        out.update(statistic=float("nan"), p_two_sided=float("nan"), p_b_greater=float("nan"))
        return out
    two = wilcoxon(xb, xa, alternative="two-sided")
    one = wilcoxon(xb, xa, alternative="greater")
    out.update(statistic=float(two.statistic), p_two_sided=float(two.pvalue), p_b_greater=float(one.pvalue))
    return out


def dominates(better: Sequence[float], worse: Sequence[float]) -> bool:
    """Whether ``better`` first-order stochastically dominates ``worse`` (empirically):
    its ECDF is at or below the other's at every value, F_better(x) <= F_worse(x)."""
    if not better or not worse:
        return False
    xs = sorted(set(better) | set(worse))
    nb, nw = len(better), len(worse)
    for x in xs:
        if sum(1 for v in better if v <= x) / nb > sum(1 for v in worse if v <= x) / nw + 1e-12:
            return False
    return True


def release_reference_report(records: Sequence[Dict[str, Any]]) -> Dict[str, Any]:
    """Per-model PIF tables and pairwise comparisons for records of several models.

    Works for any MMMT-IF records with a ``model`` field (responses or ``reported_pif``);
    pairs are matched on (chat id, turn). Returns ``{"metrics": {...}, "tables": {title: md}}``.
    """
    groups = _by_model(records)
    if not groups:
        raise ReformError("no MMMT-IF records to compare")
    per_model: Dict[str, Dict[str, Any]] = {}
    per_turn: Dict[str, Dict[Tuple[str, Any], float]] = {}
    for model, recs in groups.items():
        res = pif_metric(recs)
        ps = res["per_sample"]
        ci = cluster_interval([s["pif"] for s in ps], [str(s["chat_id"]) for s in ps], key=model)
        per_model[model] = dict(res["metrics"], pif_ci95_low=ci["low"], pif_ci95_high=ci["high"])
        for t, row in per_model[model]["pif_by_turn"].items():  # chats resampled, as in the report
            at = [s for s in ps if str(s["turn"]) == t]
            ci = cluster_interval([s["pif"] for s in at], [str(s["chat_id"]) for s in at], key=f"{model}/{t}")
            row.update(ci95_low=ci["low"], ci95_high=ci["high"])
        per_turn[model] = {_turn_key(s): s["pif"] for s in res["per_sample"]}
    models = list(groups)
    tests: Dict[str, Dict[str, Any]] = {}
    dominance: Dict[str, Dict[str, Any]] = {}
    for a, b in combinations(models, 2):
        tests[f"{a} vs {b}"] = dict(wilcoxon_pair(per_turn[a], per_turn[b]), a=a, b=b)
        by_turn_a: Dict[Any, List[float]] = defaultdict(list)
        by_turn_b: Dict[Any, List[float]] = defaultdict(list)
        for (cid, t), v in per_turn[a].items():
            if (cid, t) in per_turn[b]:
                by_turn_a[t].append(v)
                by_turn_b[t].append(per_turn[b][(cid, t)])
        turns = sorted(by_turn_a, key=lambda t: (isinstance(t, str), t))
        b_over_a = [t for t in turns if dominates(by_turn_b[t], by_turn_a[t])]
        a_over_b = [t for t in turns if dominates(by_turn_a[t], by_turn_b[t])]
        dominance[f"{a} vs {b}"] = {"a": a, "b": b, "turns": turns, "b_dominates_a_at": b_over_a,
                                    "a_dominates_b_at": a_over_b,
                                    "b_dominates_a_at_every_turn": len(b_over_a) == len(turns) > 0,
                                    "a_dominates_b_at_every_turn": len(a_over_b) == len(turns) > 0}
    metrics = {"models": per_model, "wilcoxon": tests, "dominance": dominance}
    return {"metrics": metrics, "tables": _tables(models, per_model, tests, dominance)}


def _span(low: Any, high: Any) -> str:
    """" [low, high]", or nothing where too few chats give no interval."""
    return "" if low is None else f" [{_fmt(low)}, {_fmt(high)}]"


def _p(x: float) -> str:
    return "-" if x is None or math.isnan(x) else f"{x:.2e}"


def _tables(models: List[str], per_model: Dict[str, Dict[str, Any]], tests: Dict[str, Dict[str, Any]],
            dominance: Dict[str, Dict[str, Any]]) -> Dict[str, str]:
    rows = ["| model | turns | PIF | 95% CI | paper Table 3 |", "|---|---:|---:|---|---:|"]
    for m in models:
        pm = per_model[m]
        paper = PAPER_TABLE3.get(m)
        span = _span(pm["pif_ci95_low"], pm["pif_ci95_high"]).strip() or "-"
        rows.append(f"| {m} | {pm['num_turns']} | {_fmt(pm['pif'])} | {span} | "
                    f"{'-' if paper is None else f'{paper:.3f}'} |")
    corpus = "\n".join(rows)
    turns = sorted({t for m in models for t in per_model[m]["pif_by_turn"]}, key=lambda t: int(t))
    rows = ["| turn | n | " + " | ".join(f"{m} PIF [95% CI]" for m in models) + " | mean of models |",
            "|---:|---:|" + "---|" * len(models) + "---:|"]
    for t in turns:
        cells, means = [], []
        n = max(per_model[m]["pif_by_turn"].get(t, {}).get("n", 0) for m in models)
        for m in models:
            v = per_model[m]["pif_by_turn"].get(t)
            if v is None:
                cells.append("-")
                continue
            means.append(v["pif"])
            cells.append(_fmt(v["pif"]) + _span(v["ci95_low"], v["ci95_high"]))
        rows.append(f"| {t} | {n} | " + " | ".join(cells) + f" | {_fmt(sum(means) / len(means))} |")
    by_turn = "\n".join(rows)
    ks = sorted({k for m in models for k in per_model[m]["pif_by_num_instructions"]}, key=int)
    rows = ["| instructions given | n | " + " | ".join(models) + " |", "|---:|---:|" + "---:|" * len(models)]
    for k in ks:
        n = max(per_model[m]["pif_by_num_instructions"].get(k, {}).get("n", 0) for m in models)
        cells = [_fmt(per_model[m]["pif_by_num_instructions"].get(k, {}).get("pif")) for m in models]
        rows.append(f"| {k} | {n} | " + " | ".join(cells) + " |")
    by_num = "\n".join(rows)
    rows = ["| A | B | pairs | non-zero | mean(B - A) | W | p (two-sided) | p (B > A, one-sided) |",
            "|---|---|---:|---:|---:|---:|---:|---:|"]
    for t in tests.values():
        rows.append(f"| {t['a']} | {t['b']} | {t['n_pairs']} | {t['n_nonzero']} | {_fmt(t['mean_diff_b_minus_a'])} | "
                    f"{'-' if math.isnan(t['statistic']) else format(t['statistic'], '.1f')} | "
                    f"{_p(t['p_two_sided'])} | {_p(t['p_b_greater'])} |")
    wil = "\n".join(rows)
    rows = ["| A | B | turns | B dominates A at | A dominates B at |", "|---|---|---:|---|---|"]
    for d in dominance.values():
        n = len(d["turns"])
        rows.append(f"| {d['a']} | {d['b']} | {n} | {_turns(d['b_dominates_a_at'], d['turns'])} | "
                    f"{_turns(d['a_dominates_b_at'], d['turns'])} |")
    dom = "\n".join(rows)
    return {"MMMT-IF models: corpus PIF": corpus, "MMMT-IF models: PIF by turn": by_turn,
            "MMMT-IF models: PIF by number of instructions": by_num,
            "MMMT-IF models: Wilcoxon signed-rank tests (per-turn PIF, paired on chat and turn)": wil,
            "MMMT-IF models: stochastic dominance of per-turn PIF ECDFs": dom}


def _turns(hit: List[Any], all_turns: List[Any]) -> str:
    if not all_turns:
        return "-"
    if not hit:
        return "no turn"
    if len(hit) == len(all_turns):
        return f"every turn ({len(hit)}/{len(all_turns)})"
    missing = [str(t) for t in all_turns if t not in hit]
    if len(missing) <= len(hit):
        return f"{len(hit)}/{len(all_turns)} turns (not at {', '.join(missing)})"
    return f"{len(hit)}/{len(all_turns)} turns (at {', '.join(str(t) for t in hit)})"


def render_report(report: Dict[str, Any]) -> str:
    """The report's tables as one markdown text."""
    return "\n\n".join(f"## {title}\n\n{table}" for title, table in report["tables"].items()) + "\n"


def print_release_report(records: Sequence[Dict[str, Any]], prediction_file: str, output_dir: Any = None,
                         write: bool = True, quiet: bool = False) -> Dict[str, Any]:
    """run_loader_eval on the release CSV: print the comparison; write it only into ``output_dir``.

    Why not beside the file: the release CSV ships inside the package (configs/data/).
    """
    import json
    import os

    report = release_reference_report(records)
    text = render_report(report)
    if not quiet:
        print(text)
    if write and output_dir:
        ensure_writable_dir(output_dir, "--output_dir")
        stem = os.path.splitext(os.path.basename(prediction_file))[0]
        summary = {"metrics": json.loads(json.dumps(report["metrics"], default=str)),
                   "prediction_file": prediction_file, "num_records": len(records),
                   "metric": "pif (release reference rows)"}
        write_json_atomic(os.path.join(output_dir, f"{stem}.results.json"), summary)
        write_text_atomic(os.path.join(output_dir, f"{stem}.results.md"), text)
    return {**report, "prediction_file": prediction_file, "num_records": len(records)}


# `run_loader_eval --dataset_name MMMT-IF --prediction_file <release>.csv`: the released scores
register_prediction_file_reader("MMMT-IF", ".csv", read_release_records)
