"""Seeded cluster bootstrap: headline metrics and breakdowns with 95% percentile intervals.

Why clusters: samples that are not independent must be resampled together, or the intervals
come out too narrow (an MME image's two questions make acc+, an MMMT-IF chat's turns share
the history, duplicates of a sample share the sample). Every per_sample entry names its
cluster; resampling draws whole clusters with replacement, within strata (MME subtask,
iWISDM complexity) that the benchmark's design fixes.

Each metric family is one function ``family(per_sample, W, result) -> {"headline": {name:
array}, "breakdowns": {breakdown: {group: {stat: array, "n": int}}}}``. ``W`` has one row
per resample and one column per entry (how often the entry's cluster was drawn); row 0 is
all ones, so ``array[0]`` is the point estimate on the data as given and must equal what
the metric itself reports (the tests check it). The interval is the 2.5 and 97.5
percentiles of rows 1..n_boot.
"""
from __future__ import annotations

from collections import defaultdict
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from utils.seeding import np_rng_for

Stats = Dict[str, Any]
Family = Callable[[List[Dict[str, Any]], np.ndarray, Dict[str, Any]], Stats]


def cluster_weights(clusters: Sequence[str], n_boot: int, seed: int, key: str,
                    strata: Optional[Sequence[Any]] = None) -> np.ndarray:
    """(n_boot + 1, n_entries) draw counts; row 0 is the data itself (all ones)."""
    uniq, inv = np.unique(np.asarray([str(c) for c in clusters]), return_inverse=True)
    n_c = len(uniq)
    counts = np.ones((n_boot + 1, n_c))
    if n_boot and n_c:
        rng = np_rng_for(seed, "bootstrap", key)
        stratum_of = np.zeros(n_c, dtype=int)
        if strata is not None:
            s_uniq, s_inv = np.unique(np.asarray([str(s) for s in strata]), return_inverse=True)
            stratum_of[inv] = s_inv
        boot = np.zeros((n_boot, n_c))
        for s in np.unique(stratum_of):
            members = np.flatnonzero(stratum_of == s)
            m = len(members)
            draws = rng.integers(0, m, size=(n_boot, m))
            flat = (draws + (np.arange(n_boot) * m)[:, None]).ravel()
            boot[:, members] = np.bincount(flat, minlength=n_boot * m).reshape(n_boot, m)
        counts[1:] = boot
    return counts[:, inv]


def wmean(W: np.ndarray, x: Sequence[float], mask: Optional[np.ndarray] = None) -> np.ndarray:
    """Weighted mean per resample (NaN where a resample holds no entry)."""
    xv = np.asarray(x, dtype=float)
    if mask is not None:
        W, xv = W[:, mask], xv[mask]
    tot = W.sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(tot > 0, (W @ xv) / np.where(tot > 0, tot, 1), np.nan)


def interval(values: np.ndarray) -> Dict[str, Optional[float]]:
    """{"value", "low", "high"} from a (n_boot + 1,) array."""
    def f(x: float) -> Optional[float]:
        return None if x is None or not np.isfinite(x) else float(x)
    boot = values[1:][np.isfinite(values[1:])]
    if boot.size == 0:
        return {"value": f(values[0]), "low": None, "high": None}
    lo, hi = np.percentile(boot, [2.5, 97.5])
    return {"value": f(values[0]), "low": f(lo), "high": f(hi)}


def _group_sort_key(k: Any) -> Tuple[int, Any]:
    try:
        return (0, float(k))
    except (TypeError, ValueError):
        return (1, str(k))


def groups_of(per_sample: List[Dict[str, Any]], field: str) -> Dict[str, np.ndarray]:
    """Group label (as text, numeric groups in numeric order) -> boolean entry mask."""
    vals = [p.get(field) for p in per_sample]
    labels = sorted({v for v in vals if v is not None}, key=_group_sort_key)
    return {str(lab): np.array([v == lab for v in vals]) for lab in labels}


def cluster_of(p: Dict[str, Any]) -> str:
    """An entry's bootstrap unit; entries written before ``cluster`` existed fall back to the
    MME image, the MMMT-IF chat, or the sample."""
    if p.get("cluster") is not None:
        return str(p["cluster"])
    if p.get("subtask") is not None and p.get("image") is not None:
        return f"{p['subtask']}/{p['image']}"
    if p.get("chat_id") is not None:
        return str(p["chat_id"])
    return str(p.get("sample_id"))


# -- families ------------------------------------------------------------------------------

#: the complexity breakdown's row order (the presets' order, not the alphabet's)
PRESET_ORDER = ("low", "medium", "high")


def accuracy_family(ps: List[Dict[str, Any]], W: np.ndarray, result: Dict[str, Any]) -> Stats:
    """Accuracy (and format hit rate for generation); iWISDM breakdowns from its BREAKDOWNS."""
    correct = [bool(p.get("correct")) for p in ps]
    head = {"accuracy": wmean(W, correct)}
    if result.get("infer_method", "generation") == "generation":
        head["format_hit_rate"] = wmean(W, [p.get("extracted") is not None for p in ps])
    breakdowns: Dict[str, Dict[str, Dict[str, Any]]] = {}
    if result.get("metric") == "iwisdm":
        from metrics.iwisdm import BREAKDOWNS
        for name, key in BREAKDOWNS:
            field = key if ps and key in ps[0] else None
            if field is None:
                continue
            groups = groups_of(ps, field)
            if name == "complexity":
                groups = dict(sorted(groups.items(), key=lambda kv: (
                    PRESET_ORDER.index(kv[0]) if kv[0] in PRESET_ORDER else len(PRESET_ORDER), kv[0])))
            breakdowns[name] = {g: {"accuracy": wmean(W, correct, m), "n": int(m.sum())}
                                for g, m in groups.items()}
    return {"headline": head, "breakdowns": breakdowns}


def mme_family(ps: List[Dict[str, Any]], W: np.ndarray, result: Dict[str, Any]) -> Stats:
    """acc, acc+ and score per subtask, perception/cognition/total scores, overall accuracy.

    acc+ counts an image (per duplicate) right when both its questions are; images with one
    question are left out, as the metric does."""
    from build.mme import COGNITION, PERCEPTION, SUBTASKS
    correct = np.array([bool(p.get("correct")) for p in ps], dtype=float)
    head: Dict[str, np.ndarray] = {"accuracy": wmean(W, correct)}
    subs: Dict[str, Dict[str, Any]] = {}
    zero = np.zeros(W.shape[0])
    perception, cognition = zero.copy(), zero.copy()
    for sub in SUBTASKS:
        idx = [i for i, p in enumerate(ps) if p.get("subtask") == sub]
        if not idx:
            continue
        mask = np.zeros(len(ps), dtype=bool)
        mask[idx] = True
        acc = wmean(W, correct, mask)
        pairs: Dict[Tuple[str, int], List[int]] = defaultdict(list)
        for i in idx:
            pairs[(cluster_of(ps[i]), int(ps[i].get("dup_index", 0) or 0))].append(i)
        complete = [v for v in pairs.values() if len(v) == 2]
        if complete:
            first = np.array([v[0] for v in complete])
            both = np.array([correct[v[0]] * correct[v[1]] for v in complete])
            acc_plus = wmean(W[:, first], both)
        else:
            acc_plus = zero.copy()
        score = 100 * acc + 100 * acc_plus
        subs[sub] = {"acc": acc, "acc_plus": acc_plus, "score": score, "n": len(idx)}
        if sub in PERCEPTION:
            perception = perception + score
        elif sub in COGNITION:
            cognition = cognition + score
    head["perception_score"] = perception
    head["cognition_score"] = cognition
    head["total_score"] = perception + cognition
    return {"headline": head, "breakdowns": {"subtask": subs}}


def pif_family(ps: List[Dict[str, Any]], W: np.ndarray, result: Dict[str, Any]) -> Stats:
    """PIF (strict, loose), PIF-N-K, PIF-IQR-N; PIF by turn, by number of instructions, per instruction."""
    from metrics.pif import INSTRUCTION_IDS, iqr
    pif = [float(p["pif"]) for p in ps]
    # None means "not scored" (a released per-turn PIF carries no loose verdicts): such entries are
    # left out of the loose mean, as the metric leaves them out, never counted as 0
    loose = [p.get("pif_loose", p["pif"]) for p in ps]
    scored = np.array([v is not None for v in loose], dtype=bool)
    head: Dict[str, np.ndarray] = {"pif": wmean(W, pif),
                                   "pif_loose": wmean(W, [0.0 if v is None else float(v) for v in loose], scored)}
    samples = [list(p.get("pif_samples") or [p["pif"]]) for p in ps]
    n = min(len(s) for s in samples) if samples else 1
    perfect = np.array([sum(1 for v in s[:n] if v >= 1.0 - 1e-12) for s in samples])
    for k in range(1, n + 1):
        head[f"pif_{n}_{k}"] = wmean(W, perfect >= k)
    head[f"pif_iqr_{n}"] = wmean(W, [iqr(s[:n]) for s in samples])
    by_turn = {g: {"pif": wmean(W, pif, m), "n": int(m.sum())} for g, m in groups_of(ps, "turn").items()}
    nums = [{**p, "num_instructions": len(p.get("instructions") or [])} for p in ps]
    by_num = {g: {"pif": wmean(W, pif, m), "n": int(m.sum())} for g, m in groups_of(nums, "num_instructions").items()}
    per_instr: Dict[str, Dict[str, Any]] = {}
    for iid in INSTRUCTION_IDS:
        rows = [(i, p["followed"][p["instructions"].index(iid)]) for i, p in enumerate(ps)
                if iid in (p.get("instructions") or []) and p.get("followed") is not None]
        if rows:
            cols = np.array([i for i, _ in rows])
            per_instr[iid] = {"followed": wmean(W[:, cols], [ok for _, ok in rows]), "n": len(rows)}
    return {"headline": head, "breakdowns": {"turn": by_turn, "num_instructions": by_num,
                                              "instruction": per_instr}}


FAMILIES: Dict[str, Family] = {"accuracy": accuracy_family, "mme": mme_family, "pif": pif_family}


def family_of(metric: Optional[str]) -> str:
    """Which family recomputes a metric's numbers (the accuracy family unless MME or PIF)."""
    return {"mme": "mme", "pif": "pif"}.get(str(metric), "accuracy")


def strata_of(family: str, ps: List[Dict[str, Any]]) -> Optional[List[Any]]:
    """The design's fixed strata: MME subtasks, iWISDM complexities (presets); None otherwise."""
    if family == "mme":
        return [p.get("subtask") for p in ps]
    if family == "accuracy" and ps and "complexity" in ps[0]:
        return [p.get("complexity") for p in ps]
    return None


def bootstrap(per_sample: List[Dict[str, Any]], result: Dict[str, Any], n_boot: int = 1000, seed: int = 0,
              key: str = "") -> Dict[str, Any]:
    """Headline metrics and breakdowns as {"value", "low", "high"} (breakdown groups add "n")."""
    family = family_of(result.get("metric"))
    clusters = [cluster_of(p) for p in per_sample]
    W = cluster_weights(clusters, n_boot, seed, key, strata_of(family, per_sample))
    stats = FAMILIES[family](per_sample, W, result)
    out: Dict[str, Any] = {"family": family, "num_clusters": len(set(map(str, clusters))),
                           "headline": {k: interval(v) for k, v in stats["headline"].items()},
                           "breakdowns": {}}
    for name, groups in stats["breakdowns"].items():
        out["breakdowns"][name] = {
            g: {k: (v if k == "n" else interval(v)) for k, v in row.items()} for g, row in groups.items()}
    return out
