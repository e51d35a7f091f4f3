"""One report for one run or many: comparison table with bootstrap CIs, paired tests, plots, HTML.

A *run* is ``{"name": str, "records": [...], "result": <score_records / metrics.evaluate
result with metrics, tables, per_sample, formulation, infer_method, ...>}``. All runs must
score the same benchmark. ``build_comparison`` computes it; ``evaluation.reporting.report``
writes it (``comparison.md``, ``comparison.json``, ``plots/``, ``report.html``).
"""
from __future__ import annotations

import json
import math
import os
from itertools import combinations
from typing import Any, Dict, List, Optional, Sequence, Tuple

from ...metrics.single_choice import instability
from ...utils.errors import ReformError
from ...utils.references import beside, describe, load_references, match
from ...utils.report import markdown_table, md_text
from .bootstrap import bootstrap, family_of
from .image_dependence import dependence_notes, dependence_table, image_dependence

#: headline metrics shown per family, in order, with their labels
HEADLINE_LABELS: Dict[str, Sequence[Tuple[str, str]]] = {
    "accuracy": (("accuracy", "accuracy"), ("format_hit_rate", "format hit rate")),
    "mme": (("perception_score", "perception"), ("cognition_score", "cognition"), ("total_score", "total"),
            ("accuracy", "accuracy")),
    "pif": (("pif", "PIF"), ("pif_loose", "PIF (loose)")),
}


def _benchmark(run: Dict[str, Any]) -> str:
    names = {str(r.get("benchmark")) for r in run.get("records") or [] if r.get("benchmark")}
    if not names and run["result"].get("benchmark"):
        names = {str(run["result"]["benchmark"])}
    if len(names) > 1:
        raise ReformError(f"run '{run['name']}': records mix benchmarks {sorted(names)}")
    return names.pop() if names else ""


def check_runs(runs: Sequence[Dict[str, Any]]) -> Tuple[str, str]:
    """(benchmark, metric) shared by all runs; a clear error for mixed or duplicated runs."""
    if not runs:
        raise ReformError("compare_runs: no runs given")
    names = [str(r.get("name", "")) for r in runs]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup or "" in names:
        raise ReformError(f"compare_runs: every run needs a distinct name (repeated: {dup or ['<empty>']})")
    for r in runs:
        if not (r.get("result") or {}).get("per_sample"):
            raise ReformError(f"run '{r['name']}': its result has no per_sample entries to compare")
    benches = {r["name"]: _benchmark(r) for r in runs}
    metrics = {r["name"]: str(r["result"].get("metric")) for r in runs}
    if len(set(benches.values())) > 1:
        raise ReformError(f"compare_runs: runs score different benchmarks {benches}; compare one benchmark at a time")
    if len(set(metrics.values())) > 1:
        raise ReformError(f"compare_runs: runs were scored by different metrics {metrics}")
    return next(iter(benches.values())), next(iter(metrics.values()))


# -- paired tests --------------------------------------------------------------------------

Key = Tuple[str, int]


def _paired_values(ps: List[Dict[str, Any]], field: str) -> Dict[Key, float]:
    return {(str(p["sample_id"]), int(p.get("dup_index", 0) or 0)): float(p[field]) for p in ps}


#: what identifies an entry's content: (item_sha, sample_sha), either None when the record lacks it
Content = Tuple[Optional[str], Optional[str]]


def sample_shas(run: Dict[str, Any]) -> Dict[Key, Content]:
    """(sample_id, dup_index) -> (``item_sha``, ``sample_sha``) of what the model was asked, from
    the run's records and per_sample entries (entries without either are absent). A record made
    with ``--image_ablation`` counts as the item it was made from (``image_ablation.intact_item_sha``):
    it pairs with that item asked with its images, and with nothing else."""
    out: Dict[Key, Content] = {}
    for src in (run.get("records") or [], run["result"].get("per_sample") or []):
        for r in src:
            item, sample = r.get("item_sha"), r.get("sample_sha")
            ablation = r.get("image_ablation")
            if isinstance(ablation, dict) and ablation.get("intact_item_sha") is not None:
                item = ablation["intact_item_sha"]
            if item is None and sample is None:
                continue
            key = (str(r.get("sample_id")), int(r.get("dup_index", 0) or 0))
            old = out.get(key, (None, None))
            out[key] = (str(item) if item is not None else old[0], str(sample) if sample is not None else old[1])
    return out


def card_key(content: Optional[Content]) -> str:
    """One report card per item: its item hash, else its sample hash, else ''."""
    return (content[0] or content[1] or "") if content else ""


def same_content(a: Optional[Content], b: Optional[Content]) -> bool:
    """The pairing rule for one shared key: equal ``item_sha`` where both records have one;
    else equal ``sample_sha`` where both have one (a file from before item_sha pairs with a new
    one of the same sample); when neither has any hash (older files), by key alone; else not."""
    a, b = a or (None, None), b or (None, None)
    if a[0] is not None and b[0] is not None:
        return a[0] == b[0]
    if a[1] is not None and b[1] is not None:
        return a[1] == b[1]
    return a == (None, None) and b == (None, None)


def pair_keys(keys_a: Sequence[Key], keys_b: Sequence[Key], sha_a: Dict[Key, Content], sha_b: Dict[Key, Content]
              ) -> Tuple[List[Key], int]:
    """(the keys paired, the number refused) among the keys both runs scored.

    Two entries are one pair only when they were made from the same item (``same_content``).
    Sharing (sample_id, dup_index) is not enough (two iWISDM builds with other trial seeds reuse
    ids for different trials). The ``item_sha`` is the sample without how it was asked
    (``utils.fingerprint.item_fields``), so a generation run and a likelihood run of one build
    pair; one entry with a hash and one without is refused, since nothing shows they match."""
    shared = sorted(set(keys_a) & set(keys_b))
    paired = [k for k in shared if same_content(sha_a.get(k), sha_b.get(k))]
    return paired, len(shared) - len(paired)


def item_keys(run: Dict[str, Any]) -> Dict[Key, str]:
    """(sample_id, dup_index) -> the benchmark's ``item_key`` (what was asked, in a form another
    harness's output has too: for MME subtask, image file name and question), where the scorer
    gives one."""
    return {(str(p.get("sample_id")), int(p.get("dup_index", 0) or 0)): str(p["item_key"])
            for p in run["result"].get("per_sample") or [] if p.get("item_key")}


def _image_name(image_id: Any) -> str:
    text = str(image_id)
    return os.path.basename(text) if ("/" in text or os.sep in text) else text


def question_key(rec: Dict[str, Any]) -> str:
    """What a question is, without how it was asked: the benchmark, the question text, the right
    answer (as text), the option texts as a set, ``meta`` and the image file names (not their
    folder or pixels; an in-memory picture by its content). Two records of one key with other content (``item_sha``) pair when this
    agrees: the same question with other option marks, or the same images at another
    resolution; another question under the same id never does."""
    answer = rec.get("answer_text")
    if answer is None:
        opts, ans = rec.get("answer_options"), rec.get("answer")
        answer = opts[ans] if isinstance(opts, list) and isinstance(ans, int) and 0 <= ans < len(opts) else ans
    meta = {k: v for k, v in (rec.get("meta") or {}).items() if k != "image_ablation"} \
        if isinstance(rec.get("meta"), dict) else rec.get("meta")
    ids = [str(i) for i in rec.get("image_ids") or []]
    images: Any = [_image_name(i) for i in ids]
    if any("/" not in i and os.sep not in i for i in ids):
        # an in-memory picture (an iWISDM frame, ``<sample id>#<n>``) has no name that says what
        # it shows: its content does (the trace's image_sha), else the sample's own hash, so that
        # two trials under one id with other frames never pair
        trace: Dict[str, Any] = rec["trace"] if isinstance(rec.get("trace"), dict) else {}
        images = {"names": images, "content": trace.get("image_sha") or rec.get("sample_sha") or rec.get("item_sha")}
    body = {"benchmark": rec.get("benchmark"), "question": rec.get("question"), "answer": answer,
            "options": sorted(map(str, rec.get("answer_options") or [])), "meta": meta, "images": images}
    return json.dumps(body, sort_keys=True, default=str)


def pair_runs(run_a: Dict[str, Any], run_b: Dict[str, Any]) -> Tuple[List[Tuple[Key, Key]], int]:
    """(pairs of entry keys (a's, b's) made from the same item, the number refused): the one
    pairing of compare, paired tests and ``explain``.

    First by (sample_id, dup_index) under ``pair_keys``' content rule (our runs: unchanged).
    Then, for the entries left, by (``item_key``, dup_index) where at least one of the two has no
    content hash (``item_sha``/``sample_sha``): a row of another harness's log (lmms-eval,
    VLMEvalKit) cannot share our hashes, and its item key says which question of which image it
    answered. Two of our runs never pair by item key alone: their hashes decide. Last, a key both
    runs hold and neither rule paired pairs when its records hold the same question asked
    another way (``question_key``: other option marks, the same images at another resolution;
    records that do not state their question never pair so)."""
    ka = [(str(p.get("sample_id")), int(p.get("dup_index", 0) or 0)) for p in run_a["result"]["per_sample"]]
    kb = [(str(p.get("sample_id")), int(p.get("dup_index", 0) or 0)) for p in run_b["result"]["per_sample"]]
    sha_a, sha_b = sample_shas(run_a), sample_shas(run_b)
    same, _ = pair_keys(ka, kb, sha_a, sha_b)
    pairs: List[Tuple[Key, Key]] = [(k, k) for k in same]
    done_a, done_b = set(same), set(same)
    ik_a, ik_b = item_keys(run_a), item_keys(run_b)
    by_item_b = {(ik_b[k], k[1]): k for k in kb if k in ik_b and k not in done_b}
    for k in ka:
        if k in done_a or k not in ik_a:
            continue
        other = by_item_b.get((ik_a[k], k[1]))
        if other is None or other in done_b:
            continue
        if card_key(sha_a.get(k)) and card_key(sha_b.get(other)):
            continue  # both ours: their content hashes decided above
        pairs.append((k, other))
        done_a.add(k)
        done_b.add(other)
    rec_a = {(str(r.get("sample_id")), int(r.get("dup_index", 0) or 0)): r for r in run_a.get("records") or []}
    rec_b = {(str(r.get("sample_id")), int(r.get("dup_index", 0) or 0)): r for r in run_b.get("records") or []}
    for k in sorted(set(ka) & set(kb)):
        if k not in done_a and k not in done_b and k in rec_a and k in rec_b and rec_a[k].get("question") \
                and question_key(rec_a[k]) == question_key(rec_b[k]):  # (a record without its question: never)
            pairs.append((k, k))
            done_a.add(k)
            done_b.add(k)
    refused = len([k for k in set(ka) & set(kb) if k not in done_a or k not in done_b])
    return sorted(pairs), refused


def unpaired(keys_a: Sequence[Key], keys_b: Sequence[Key], pairs: Sequence[Tuple[Key, Key]]) -> Dict[str, int]:
    """What a pairing left out, so that the paired part and the rest add up to each run:
    ``other_content`` (ids both runs hold, paired on neither side: another question, options or
    images under one id), ``only_a`` and ``only_b`` (ids one run holds, left unpaired)."""
    left_a = set(keys_a) - {a for a, _ in pairs}
    left_b = set(keys_b) - {b for _, b in pairs}
    other = left_a & left_b
    return {"other_content": len(other), "only_a": len(left_a - other), "only_b": len(left_b - other)}


def unpaired_text(counts: Dict[str, int], a: str = "A", b: str = "B") -> str:
    """The unpaired part in words: '12 shared ids holding other content, 3 only in A, 0 only in B'."""
    n = counts["other_content"]
    return (f"{n} shared id{'' if n == 1 else 's'} holding other content (another question, options or images), "
            f"{counts['only_a']} only in {a}, {counts['only_b']} only in {b}")


def flips(run_a: Dict[str, Any], run_b: Dict[str, Any]) -> Dict[str, Any]:
    """What changed between two runs on the items both answered (``pair_runs``): ``flips``, the
    pairs whose verdict differs, and ``answer_changes``, those whose parsed answer differs
    (MME's yes/no/other, else the extracted answer), each as (a's key, b's key)."""
    pairs, refused = pair_runs(run_a, run_b)
    ea = {(str(p.get("sample_id")), int(p.get("dup_index", 0) or 0)): p for p in run_a["result"]["per_sample"]}
    eb = {(str(p.get("sample_id")), int(p.get("dup_index", 0) or 0)): p for p in run_b["result"]["per_sample"]}

    def answer(p: Dict[str, Any]) -> Any:
        return p.get("parsed", p.get("extracted"))
    return {"n_pairs": len(pairs), "n_refused": refused,
            "flips": [(a, b) for a, b in pairs if bool(ea[a].get("correct")) != bool(eb[b].get("correct"))],
            "answer_changes": [(a, b) for a, b in pairs if answer(ea[a]) != answer(eb[b])]}


def mcnemar(a: Sequence[bool], b: Sequence[bool]) -> Dict[str, Any]:
    """Exact McNemar test: a two-sided binomial test on the discordant pairs."""
    from scipy.stats import binomtest
    only_a = int(sum(1 for x, y in zip(a, b) if x and not y))
    only_b = int(sum(1 for x, y in zip(a, b) if y and not x))
    p = 1.0 if only_a + only_b == 0 else float(binomtest(only_a, only_a + only_b, 0.5).pvalue)
    return {"test": "exact McNemar", "statistic": only_a, "only_a": only_a, "only_b": only_b, "p_value": p}


def wilcoxon_pairs(a: Sequence[float], b: Sequence[float]) -> Dict[str, Any]:
    """Wilcoxon signed-rank test on paired per-turn PIF (zero differences dropped, as Wilcoxon does)."""
    import numpy as np

    from scipy.stats import wilcoxon
    d = np.asarray(a, dtype=float) - np.asarray(b, dtype=float)
    nonzero = int(np.count_nonzero(d))
    if nonzero == 0:
        return {"test": "Wilcoxon signed-rank", "statistic": 0.0, "nonzero_pairs": 0, "p_value": 1.0}
    res = wilcoxon(d, zero_method="wilcox")
    return {"test": "Wilcoxon signed-rank", "statistic": float(res.statistic), "nonzero_pairs": nonzero,
            "p_value": float(res.pvalue)}


def paired_tests(runs: Sequence[Dict[str, Any]], family: str) -> List[Dict[str, Any]]:
    """Every pair of runs on the entries both scored from the same sample content (``pair_keys``);
    ``n_refused`` counts the shared keys whose content differs or cannot be compared."""
    import numpy as np

    field = "pif" if family == "pif" else "correct"
    values = {r["name"]: _paired_values(r["result"]["per_sample"], field) for r in runs}
    out = []
    for ra, rb in combinations(runs, 2):
        va, vb = values[ra["name"]], values[rb["name"]]
        keys, refused = pair_runs(ra, rb)
        a, b = [va[k] for k, _ in keys], [vb[k] for _, k in keys]
        row: Dict[str, Any] = {"a": ra["name"], "b": rb["name"], "metric": field, "n_pairs": len(keys),
                               "n_refused": refused, "unpaired": unpaired(list(va), list(vb), keys),
                               "mean_a": float(np.mean(a)) if keys else None,
                               "mean_b": float(np.mean(b)) if keys else None}
        if not keys:
            row.update({"test": None, "p_value": None, "statistic": None})
        elif family == "pif":
            row.update(wilcoxon_pairs(a, b))
        else:
            row.update(mcnemar([bool(x) for x in a], [bool(x) for x in b]))
        out.append(row)
    return out


def pairing_notes(comp: Dict[str, Any]) -> List[str]:
    """One sentence per pair of runs whose entries did not all pair: what was left out of the
    paired test (named and counted), and that the test covers the paired entries only (or that
    there is no test: no pair exists)."""
    notes = []
    for t in comp.get("paired_tests") or []:
        left = t.get("unpaired") or {"other_content": t.get("n_refused", 0), "only_a": 0, "only_b": 0}
        if not any(left.values()):
            continue
        what = f"Not paired between {t['a']} and {t['b']}: " + unpaired_text(left, t["a"], t["b"])
        if t["n_pairs"]:
            notes.append(f"{what}; the paired test ({t['test']}) and its means cover the {t['n_pairs']} entries "
                         "made from the same samples only.")
        else:
            notes.append(f"{what}; they share no sample, so there is no paired test.")
    return notes


# -- the comparison ------------------------------------------------------------------------

def instability_of(ps: List[Dict[str, Any]], family: str) -> Optional[float]:
    """Mean answer entropy across duplicates; None when no sample has a duplicate."""
    if family == "pif" or not any(int(p.get("dup_index", 0) or 0) > 0 for p in ps):
        return None
    key = "parsed" if family == "mme" else "chosen_text"
    return instability(ps, key=key)


def _chance_rows(result: Dict[str, Any]) -> Dict[str, Dict[str, Any]]:
    return (result.get("metrics") or {}).get("by") or {}


#: per family, the metrics published references give (configs/reference_results.yaml)
REFERENCE_METRICS: Dict[str, Tuple[str, ...]] = {"mme": ("perception_score", "cognition_score"), "pif": ("pif",)}


def checkpoint_name(run: Dict[str, Any]) -> Optional[str]:
    """The checkpoint a run evaluated: run_eval's ``--model_name``, another harness's
    ``pretrained`` (its provenance), else the one model named in the records (``family:name``)."""
    res = run["result"]
    name = (res.get("config") or {}).get("model_name")
    if name:
        return str(name)
    harness = (res.get("provenance") or {}).get("harness") or {}
    if harness.get("pretrained"):
        return str(harness["pretrained"])
    models = {str(r["model"]) for r in run.get("records") or [] if r.get("model")}
    if len(models) == 1:
        model = models.pop()
        return model.split(":", 1)[1] if ":" in model else model
    return None


def reference_rows(runs: Sequence[Dict[str, Any]], benchmark: str, family: str) -> List[Dict[str, Any]]:
    """For each run whose checkpoint has a published result on this benchmark: the run's value
    beside it, the difference and the difference in units of the known run-to-run spread
    (``utils.references.beside``); ``note`` says when the run's total is not comparable (a subset)."""
    metrics = REFERENCE_METRICS.get(family, ())
    if not metrics:
        return []
    data = load_references()
    out = []
    for r in runs:
        ref = match(checkpoint_name(r), benchmark, data)
        if ref is None:
            continue
        for metric in metrics:
            if metric not in (ref.get("results") or {}):
                continue
            row = beside((r["result"].get("metrics") or {}).get(metric), ref, metric, data)
            if row is not None:
                row.update(model=r["name"], note=(r["result"].get("notes") or {}).get(metric))
                out.append(row)
    return out


def build_comparison(runs: Sequence[Dict[str, Any]], seed: int = 0, n_boot: int = 1000) -> Dict[str, Any]:
    """The comparison as data (what comparison.json holds)."""
    benchmark, metric = check_runs(runs)
    family = family_of(metric)
    models: List[Dict[str, Any]] = []
    for r in runs:
        res = r["result"]
        ps = res["per_sample"]
        boot = bootstrap(ps, res, n_boot=n_boot, seed=seed, key=benchmark)
        m = res.get("metrics") or {}
        extra: Dict[str, Any] = {}
        if "chance" in m:
            extra["chance"] = m["chance"]
        inst = instability_of(ps, family)
        if inst is not None:
            extra["instability"] = inst
        models.append({"name": r["name"], "prediction_file": res.get("prediction_file"),
                       "operations": operations(r),
                       "formulation": res.get("formulation"), "infer_method": res.get("infer_method"),
                       "num_records": len(ps), "num_clusters": boot["num_clusters"],
                       "headline": boot["headline"], "extra": extra, "breakdowns": boot["breakdowns"],
                       "chance_by": {name: {g: row.get("chance") for g, row in rows.items()}
                                     for name, rows in _chance_rows(res).items()}})
    shas = {r["name"]: sample_shas(r) for r in runs}

    def same_items(a: Dict[str, Any], b: Dict[str, Any]) -> Tuple[List[Key], int]:
        """``pair_runs``' first stage (our runs pair by content hash) on the hashes computed once."""
        keys_a = [(str(p["sample_id"]), int(p.get("dup_index", 0) or 0)) for p in a["result"]["per_sample"]]
        keys_b = [(str(p["sample_id"]), int(p.get("dup_index", 0) or 0)) for p in b["result"]["per_sample"]]
        return pair_keys(keys_a, keys_b, shas[a["name"]], shas[b["name"]])

    return {"benchmark": benchmark, "metric": metric, "family": family, "seed": seed, "n_boot": n_boot,
            "ci": f"95% percentile interval, {n_boot} cluster-bootstrap resamples (seed {seed})",
            "models": models, "paired_tests": paired_tests(runs, family),
            "image_dependence": image_dependence(runs, family, benchmark, metric, same_items, seed=seed, n_boot=n_boot),
            "references": reference_rows(runs, benchmark, family)}


def operations(run: Dict[str, Any]) -> Dict[str, Any]:
    """What running the model cost: response-cache hits and misses, token totals (and cost with a
    price table), generation throughput, and how many responses had reasoning stripped before
    scoring. Only what the run recorded is there."""
    res = run["result"]
    out: Dict[str, Any] = {}
    cache = res.get("response_cache") or {}
    if "hits" in cache:
        out["cache_hits"], out["cache_misses"] = int(cache.get("hits", 0)), int(cache.get("misses", 0))
    usage = res.get("usage") or {}
    answered = int(usage.get("records_with_usage") or 0) + int(usage.get("records_from_cache") or 0)
    if answered:  # a server's usage (API models): what this run spent; partial sums are flagged
        for k in ("prompt_tokens", "completion_tokens", "cost"):
            if usage.get(k) is not None:
                out[k] = usage[k]
        if answered != usage.get("records"):
            out["records_without_usage"] = int(usage.get("records", 0)) - answered
    thr = res.get("throughput") or {}  # what this run generated (cache hits excluded)
    for k in ("generated_tokens", "generation_s", "tokens_per_s"):
        if thr.get(k) is not None:
            out[k] = thr[k]
    raw = {(str(r.get("sample_id")), int(r.get("dup_index", 0) or 0)): r.get("prediction")
           for r in run.get("records") or []}
    stripped = sum(1 for p in res.get("per_sample") or []
                   if isinstance(p.get("prediction"), str)
                   and isinstance(raw.get((str(p.get("sample_id")), int(p.get("dup_index", 0) or 0))), str)
                   and raw[(str(p.get("sample_id")), int(p.get("dup_index", 0) or 0))] != p["prediction"])
    if stripped:
        out["reasoning_stripped"] = stripped
    return out


#: the operations table's columns, in order: (key, label)
OPERATION_LABELS: Tuple[Tuple[str, str], ...] = (
    ("cache_hits", "cache hits"), ("cache_misses", "cache misses"), ("prompt_tokens", "prompt tokens"),
    ("completion_tokens", "completion tokens"), ("records_without_usage", "records without usage"),
    ("cost", "cost"), ("generated_tokens", "generated tokens"), ("generation_s", "generation s"),
    ("tokens_per_s", "tokens/s"), ("reasoning_stripped", "responses with reasoning stripped"))


def fmt_ci(cell: Optional[Dict[str, Any]], digits: int = 3) -> str:
    """'0.512 [0.470, 0.551]'; '-' when missing."""
    if not cell or cell.get("value") is None:
        return "-"
    v = f"{cell['value']:.{digits}f}"
    if cell.get("low") is not None:
        v = f"{v} [{cell['low']:.{digits}f}, {cell['high']:.{digits}f}]"
    return f"{v} ({cell['note']})" if cell.get("note") else v  # e.g. a subsample's missing subtasks


def _digits(family: str, stat: str) -> int:
    return 1 if family == "mme" and ("score" in stat) else 3


def headline_columns(comp: Dict[str, Any]) -> List[Tuple[str, str]]:
    """(key, label) of the headline columns present for these runs."""
    family = comp["family"]
    present = {k for m in comp["models"] for k in m["headline"]}
    cols = [(k, lab) for k, lab in HEADLINE_LABELS[family] if k in present]
    if family == "pif":
        cols += [(k, k.upper().replace("_", "-").replace("PIF-IQR", "PIF-IQR")) for k in sorted(present)
                 if k.startswith("pif_") and k not in ("pif_loose",)]
    return cols


def breakdown_stat(comp: Dict[str, Any], name: str) -> str:
    """The statistic a breakdown table shows."""
    if comp["family"] == "mme":
        return "score"
    if comp["family"] == "pif":
        return "followed" if name == "instruction" else "pif"
    return "accuracy"


def group_n(comp: Dict[str, Any], name: str, group: str) -> str:
    """The ``n`` of one breakdown group: each run's own, one number where all runs agree, else
    every run's in order ("12 / 9 / -", "-" for a run without the group)."""
    ns = [str(m["breakdowns"].get(name, {}).get(group, {}).get("n", "-")) for m in comp["models"]]
    return ns[0] if len(set(ns)) == 1 else " / ".join(ns)


def tables(comp: Dict[str, Any]) -> List[Tuple[str, List[str], List[List[str]]]]:
    """(title, header, rows) for the headline, every breakdown, and the paired tests."""
    family = comp["family"]
    out = []
    cols = headline_columns(comp)
    extras = [k for k in ("chance", "instability") if any(k in m["extra"] for m in comp["models"])]
    header = ["model", "records", "clusters"] + [lab for _, lab in cols] + extras
    rows = []
    for m in comp["models"]:
        rows.append([m["name"], str(m["num_records"]), str(m["num_clusters"])]
                    + [fmt_ci(m["headline"].get(k), _digits(family, k)) for k, _ in cols]
                    + [f"{m['extra'][k]:.3f}" if k in m["extra"] else "-" for k in extras])
    out.append((f"Headline metrics ({comp['ci']})", header, rows))
    ops = [(k, lab) for k, lab in OPERATION_LABELS if any(k in (m.get("operations") or {}) for m in comp["models"])]
    if ops:
        out.append(("Operations (response cache, tokens, throughput)", ["model"] + [lab for _, lab in ops],
                    [[m["name"]] + [_fmt_op((m.get("operations") or {}).get(k)) for k, _ in ops]
                     for m in comp["models"]]))
    names = []
    for m in comp["models"]:
        names += [n for n in m["breakdowns"] if n not in names]
    for name in names:
        stat = breakdown_stat(comp, name)
        groups: List[str] = []
        for m in comp["models"]:
            groups += [g for g in m["breakdowns"].get(name, {}) if g not in groups]
        has_chance = any(m["chance_by"].get(name) for m in comp["models"])
        header = [name, "n"] + (["chance"] if has_chance else []) + [m["name"] for m in comp["models"]]
        rows = []
        for g in groups:
            first = next(m for m in comp["models"] if g in m["breakdowns"].get(name, {}))
            row = [g, group_n(comp, name, g)]
            if has_chance:
                ch = first["chance_by"].get(name, {}).get(g)
                row.append("-" if ch is None else f"{ch:.3f}")
            for m in comp["models"]:
                cell = m["breakdowns"].get(name, {}).get(g)
                row.append(fmt_ci(cell.get(stat) if cell else None, _digits(family, stat)))
            rows.append(row)
        out.append((f"{stat} by {name}", header, rows))
        if family == "mme" and name == "subtask":
            for extra_stat in ("acc", "acc_plus"):
                rows2 = [[g, group_n(comp, name, g)]
                         + [fmt_ci((m["breakdowns"][name].get(g) or {}).get(extra_stat)) for m in comp["models"]]
                         for g in groups]
                out.append((f"{extra_stat} by subtask", ["subtask", "n"] + [m["name"] for m in comp["models"]],
                            rows2))
    if comp.get("references"):
        rows = [[r["model"], r["checkpoint"], r["metric"], f"{r['value']:.2f}", f"{r['reference']:g}",
                 f"{r['diff']:+.2f}", "-" if r["spread"] is None else f"{r['spread']:.2f}",
                 "-" if r["in_spreads"] is None else f"{r['in_spreads']:+.1f}",
                 f"{r['source']} ({r['url']})", r.get("note") or ""] for r in comp["references"]]
        out.append(("Published references (configs/reference_results.yaml)",
                    ["model", "checkpoint", "metric", "run", "published", "run - published", "known spread",
                     "in spreads", "source", "note"], rows))
    if comp["paired_tests"]:
        header = ["model A", "model B", "test", "pairs", "other content", "only in A", "only in B",
                  f"mean {comp['paired_tests'][0]['metric']} A (paired)", "mean B (paired)", "statistic", "p-value"]
        rows = []
        for t in comp["paired_tests"]:
            left = t.get("unpaired") or {}
            rows.append([t["a"], t["b"], t["test"] or "-", str(t["n_pairs"]),
                         *(str(left.get(k, "-")) for k in ("other_content", "only_a", "only_b")),
                         "-" if t["mean_a"] is None else f"{t['mean_a']:.3f}",
                         "-" if t["mean_b"] is None else f"{t['mean_b']:.3f}",
                         "-" if t["statistic"] is None else f"{t['statistic']:g}",
                         "-" if t["p_value"] is None else f"{t['p_value']:.4g}"])
        out.append(("Paired tests (samples both models scored, paired by content)", header, rows))
    dependence = dependence_table(comp.get("image_dependence") or [])
    if dependence:
        out.append(dependence)
    # two runs: the explanation's tables (evaluation.reporting.explain, laid out by report.compare_runs)
    out += [tuple(t) for t in (comp.get("explain") or {}).get("tables") or []]
    return out


def _fmt_op(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:g}"
    return str(v)


def headline_markdown(comp: Dict[str, Any]) -> str:
    """What the console shows of a comparison: its title and the headline table, as a single run
    shows its headline (every other table is in comparison.md and report.html)."""
    title, header, rows = tables(comp)[0]
    return "\n".join([md_text(f"## {comp['benchmark'] or 'Benchmark'} comparison: {title}"), "",
                      markdown_table(header, rows)])


def markdown(comp: Dict[str, Any], plots: Sequence[str] = ()) -> str:
    """comparison.md: the tables, then the plot files."""
    models = ", ".join(m["name"] for m in comp["models"])
    lines = [md_text(f"# {comp['benchmark'] or 'Benchmark'} comparison ({comp['metric']})"), "",
             md_text(f"Models: {models}."), ""]
    for title, header, rows in tables(comp):
        lines += [f"## {md_text(title)}", "", markdown_table(header, rows), ""]
        notes = pairing_notes(comp) if title.startswith("Paired tests") else (
            dependence_notes(comp.get("image_dependence") or []) if title.startswith("Image dependence") else [])
        if title.startswith("Published references"):
            notes = [f"{r['model']}: " + describe(r) + (f" The run's total is not comparable ({r['note']})."
                                                      if r.get("note") else "") for r in comp["references"]]
        if title.startswith("Explanation: differences"):  # the pairing, and the summary line
            notes = (comp.get("explain") or {}).get("notes") or []
        lines += [f"- Note: {md_text(n)}" for n in notes] + ([""] if notes else [])
    refused = (comp.get("explain") or {}).get("refused")
    if refused:  # two runs with no sample in common: no explanation, and why
        lines += ["## Explanation", "", f"- Note: {md_text(refused)}", ""]
    if plots:
        lines += ["## Plots", ""] + [f"- [{os.path.basename(p)}](plots/{os.path.basename(p)})" for p in plots] + [""]
    return "\n".join(lines)


def _json_safe(obj: Any) -> Any:
    import numpy as np

    if isinstance(obj, dict):
        return {str(k): _json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_json_safe(v) for v in obj]
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, np.generic):
        return _json_safe(obj.item())
    return obj
