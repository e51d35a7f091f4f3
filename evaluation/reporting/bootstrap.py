"""Seeded cluster bootstrap: headline metrics and breakdowns with 95% percentile intervals.

Why clusters: samples that are not independent must be resampled together, or the intervals
come out too narrow (an MME image's two questions make acc+, an MMMT-IF chat's turns share
the history, duplicates of a sample share the sample). Every per_sample entry names its
cluster; resampling draws whole clusters with replacement, within strata (MME subtask,
iWISDM complexity) that the benchmark's design fixes.

Each metric family is one function ``family(per_sample, W, result) -> {"headline": {name:
array}, "breakdowns": {breakdown: {group: {stat: array, "n": int, "clusters": entry mask}}},
"notes": {name: text}}``. ``W`` has one row per resample and one column per entry (how often
the entry's cluster was drawn); row 0 is all ones, so ``array[0]`` is the point estimate on the
data as given and must equal what the metric itself reports (the tests check it). The interval
is the 2.5 and 97.5 percentiles of rows 1..n_boot, shown only when the number's entries span
enough clusters (``utils.bootstrap.MIN_CLUSTERS``). Which family, strata and breakdowns a
metric has comes from its ReportSpec (``metrics.register_report``): no benchmark is named here.
"""
from __future__ import annotations

from collections import defaultdict
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Sequence, Tuple

from ...metrics import ReportSpec, coverage_note, report_spec
from ...metrics.single_choice import format_hit_rate
from ...utils.bootstrap import MIN_CLUSTERS, Resamples, cluster_weights, interval, wmean
from ...utils.report import markdown_table

if TYPE_CHECKING:  # numpy is imported where it computes: this module loads at every start of run_eval
    import numpy as np

#: resamples per interval on every surface (results.md, comparison, report)
N_BOOT = 1000

Stats = Dict[str, Any]
Family = Callable[[List[Dict[str, Any]], Resamples, Dict[str, Any]], Stats]


def _group_sort_key(k: Any) -> Tuple[int, Any]:
    try:
        return (0, float(k))
    except (TypeError, ValueError):
        return (1, str(k))


def groups_of(per_sample: List[Dict[str, Any]], field: str) -> Dict[str, np.ndarray]:
    """Group label (as text, numeric groups in numeric order) -> boolean entry mask."""
    import numpy as np

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
# A family knows a shape of statistic, never a benchmark: the metric's ReportSpec (registered
# beside the metric in metrics/) names its strata, breakdowns, subtasks and items.


def _ordered(groups: Dict[str, np.ndarray], order: Sequence[str]) -> Dict[str, np.ndarray]:
    """Groups in the spec's preferred order, the rest after them by name."""
    if not order:
        return groups
    rank = {g: i for i, g in enumerate(order)}
    return dict(sorted(groups.items(), key=lambda kv: (rank.get(kv[0], len(rank)), kv[0])))


def accuracy_family(ps: List[Dict[str, Any]], W: Resamples, result: Dict[str, Any]) -> Stats:
    """Accuracy (and format hit rate for generation); the breakdowns the metric registered."""
    spec = report_spec(result.get("metric"))
    correct = [bool(p.get("correct")) for p in ps]
    head = {"accuracy": wmean(W, correct)}
    if result.get("infer_method", "generation") == "generation" and format_hit_rate(ps) is not None:
        head["format_hit_rate"] = wmean(W, [p.get("extracted") is not None for p in ps])  # (undefined: no row)
    breakdowns: Dict[str, Dict[str, Dict[str, Any]]] = {}
    for name, field in spec.breakdowns:
        if not ps or field not in ps[0]:
            continue
        groups = _ordered(groups_of(ps, field), spec.group_order.get(name, ()))
        breakdowns[name] = {g: {"accuracy": wmean(W, correct, m), "n": int(m.sum()), "clusters": m}
                            for g, m in groups.items()}
    return {"headline": head, "breakdowns": breakdowns}


def mme_family(ps: List[Dict[str, Any]], W: Resamples, result: Dict[str, Any]) -> Stats:
    """acc, acc+ and score per subtask, their sums per score group (perception, cognition) and in
    total, overall accuracy.

    acc+ counts an image (per duplicate) right when both its questions are; images with one
    question are left out, as the metric does."""
    import numpy as np

    spec = report_spec(result.get("metric"))
    field = spec.strata or "subtask"
    correct = np.array([bool(p.get("correct")) for p in ps], dtype=float)
    head: Dict[str, np.ndarray] = {"accuracy": wmean(W, correct)}
    subs: Dict[str, Dict[str, Any]] = {}
    zero = np.zeros(W.shape[0])
    group_of = {sub: name for name, members in spec.score_groups for sub in members}
    sums = {name: zero.copy() for name, _ in spec.score_groups}
    for sub in spec.subtasks:
        idx = [i for i, p in enumerate(ps) if p.get(field) == sub]
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
        subs[sub] = {"acc": acc, "acc_plus": acc_plus, "score": score, "n": len(idx), "clusters": mask}
        if sub in group_of:
            sums[group_of[sub]] = sums[group_of[sub]] + score
    head.update(sums)
    head["total_score"] = sum(sums.values(), zero.copy())
    return {"headline": head, "breakdowns": {"subtask": subs}, "notes": coverage_notes(ps, spec)}


def coverage_notes(ps: List[Dict[str, Any]], spec: ReportSpec) -> Dict[str, str]:
    """Headline name -> its coverage note (``metrics.coverage_note``) for each sum over subtasks
    that a subsample left missing or incomplete."""
    field = spec.strata or "subtask"
    counts: Dict[str, int] = defaultdict(int)
    for p in ps:
        counts[str(p.get(field))] += 1
    groups = list(spec.score_groups) + [("total_score", tuple(s for _, m in spec.score_groups for s in m))]
    notes = {name: coverage_note(counts, members, spec.subtask_sizes) for name, members in groups}
    return {k: v for k, v in notes.items() if v}


def pif_family(ps: List[Dict[str, Any]], W: Resamples, result: Dict[str, Any]) -> Stats:
    """Per-turn score (``pif``, strict and loose), PIF-N-K and the spread over N samples; the
    metric's breakdowns and its items (``instructions`` with their ``followed`` verdicts)."""
    import numpy as np

    spec = report_spec(result.get("metric"))
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
    if n > 1:  # with one response per turn the spread is 0 and PIF-1-1 adds nothing N-K is for: no columns
        for k in range(1, n + 1):
            head[f"pif_{n}_{k}"] = wmean(W, perfect >= k)
        if spec.spread is not None:
            head[f"pif_iqr_{n}"] = wmean(W, [spec.spread(s[:n]) for s in samples])
    # the number of instructions is read from the list (released rows carry no count of their own)
    rows = [{**p, "num_instructions": len(p.get("instructions") or [])} for p in ps]
    breakdowns: Dict[str, Dict[str, Dict[str, Any]]] = {}
    for name, field in spec.breakdowns:
        breakdowns[name] = {g: {"pif": wmean(W, pif, m), "n": int(m.sum()), "clusters": m}
                            for g, m in groups_of(rows, field).items()}
    per_item: Dict[str, Dict[str, Any]] = {}
    for iid in spec.items:
        hits = [(i, p["followed"][p["instructions"].index(iid)]) for i, p in enumerate(ps)
                if iid in (p.get("instructions") or []) and p.get("followed") is not None]
        if hits:
            cols = np.array([i for i, _ in hits])
            mask = np.zeros(len(ps), dtype=bool)
            mask[cols] = True
            per_item[iid] = {"followed": wmean(W[:, cols], [ok for _, ok in hits]), "n": len(hits),
                             "clusters": mask}
    breakdowns["instruction"] = per_item
    return {"headline": head, "breakdowns": breakdowns}


FAMILIES: Dict[str, Family] = {"accuracy": accuracy_family, "mme": mme_family, "pif": pif_family}


def family_of(metric: Optional[str]) -> str:
    """Which family recomputes a metric's numbers (registered with the metric; accuracy by default)."""
    return report_spec(metric).family


def strata_of(metric: Optional[str], ps: List[Dict[str, Any]]) -> Optional[List[Any]]:
    """The design's fixed strata (the metric's registered ``strata`` field); None without one."""
    field = report_spec(metric).strata
    if field is None or not ps or field not in ps[0]:
        return None
    return [p.get(field) for p in ps]


#: the range of each statistic that is a mean of per-cluster values (its zero-width interval at
#: a bound becomes a Clopper-Pearson one, ``utils.bootstrap.interval``); totals are absent
#: (left out: acc+, over the images with both answers, and loose PIF, over the scored entries:
#: their cluster count is not the group's)
STAT_BOUNDS: Dict[str, Tuple[float, float]] = {
    "accuracy": (0.0, 1.0), "format_hit_rate": (0.0, 1.0), "acc": (0.0, 1.0),
    "score": (0.0, 200.0), "pif": (0.0, 1.0), "followed": (0.0, 1.0)}


def stat_bounds(name: str) -> Optional[Tuple[float, float]]:
    """The range of statistic ``name`` (PIF-N-K are proportions too), or None."""
    if name in STAT_BOUNDS:
        return STAT_BOUNDS[name]
    if name.startswith("pif_") and name.split("_")[-1].isdigit() and not name.startswith("pif_iqr"):  # PIF-N-K
        return (0.0, 1.0)
    return None


def _n_clusters(clusters: np.ndarray, mask: Optional[np.ndarray]) -> int:
    return len(set((clusters if mask is None else clusters[mask]).tolist()))


def _enough_clusters(clusters: np.ndarray, strata: Optional[np.ndarray], mask: Optional[np.ndarray]) -> bool:
    """Whether the entries under ``mask`` span enough clusters for a percentile interval: at least
    MIN_CLUSTERS, and at least 2 in every stratum they draw from (a stratum of one cluster is
    never resampled, so it would add no width)."""
    sel = clusters if mask is None else clusters[mask]
    if len(set(sel.tolist())) < MIN_CLUSTERS:
        return False
    if strata is None:
        return True
    st = strata if mask is None else strata[mask]
    per: Dict[str, set] = defaultdict(set)
    for c, s in zip(sel.tolist(), st.tolist()):
        per[s].add(c)
    return all(len(v) >= 2 for v in per.values())


def bootstrap(per_sample: List[Dict[str, Any]], result: Dict[str, Any], n_boot: int = 1000, seed: int = 0,
              key: str = "") -> Dict[str, Any]:
    """Headline metrics and breakdowns as {"value", "low", "high"} (breakdown groups add "n").

    A number whose entries span too few clusters (``_enough_clusters``) keeps its value and gets
    no interval (low and high None): a percentile bootstrap of one or two clusters collapses to
    zero width, which reads as certainty."""
    import numpy as np

    metric = result.get("metric")
    family = family_of(metric)
    clusters = [cluster_of(p) for p in per_sample]
    strata = strata_of(metric, per_sample)
    W = cluster_weights(clusters, n_boot, seed, key, strata)
    stats = FAMILIES[family](per_sample, W, result)
    c_arr = np.asarray(clusters, dtype=object)
    s_arr = None if strata is None else np.asarray([str(x) for x in strata], dtype=object)
    head_ok = _enough_clusters(c_arr, s_arr, None)
    notes = stats.get("notes") or {}
    out: Dict[str, Any] = {"family": family, "num_clusters": len(set(map(str, clusters))),
                           "min_clusters": MIN_CLUSTERS,
                           "headline": {k: {**interval(v, head_ok, _n_clusters(c_arr, None), stat_bounds(k)),
                                            **({"note": notes[k]} if k in notes else {})}
                                        for k, v in stats["headline"].items()},
                           "breakdowns": {}}
    for name, groups in stats["breakdowns"].items():
        rows = {}
        for g, row in groups.items():
            mask = row.get("clusters")
            ok = head_ok if mask is None else _enough_clusters(c_arr, s_arr, mask)
            n_c = _n_clusters(c_arr, mask)
            rows[g] = {k: (v if k == "n" else interval(v, ok, n_c, stat_bounds(k)))
                       for k, v in row.items() if k != "clusters"}
        out["breakdowns"][name] = rows
    return out


def interval_title(n_boot: int, seed: int) -> str:
    return (f"95% intervals ({n_boot} cluster-bootstrap resamples, seed {seed}; "
            f"none from fewer than {MIN_CLUSTERS} clusters)")


def interval_table(per_sample: List[Dict[str, Any]], result: Dict[str, Any], key: str = "", n_boot: int = 1000,
                   seed: int = 0) -> str:
    """The headline numbers and every breakdown group with the interval the report shows (the
    same resamples: same seed, ``key`` the benchmark), for results.md and the console, so one
    number has one interval everywhere."""
    b = bootstrap(per_sample, result, n_boot=n_boot, seed=seed, key=key)

    def cells(label: str, n: Any, stat: str, cell: Dict[str, Any]) -> List[Any]:
        v = cell.get("value")
        span = "-" if cell.get("low") is None else f"[{cell['low']:.4f}, {cell['high']:.4f}]"
        return [label, n, stat, "-" if v is None else f"{v:.4f}", span]

    rows = [cells("all", len(per_sample), k, c) for k, c in b["headline"].items()]
    for name, groups in b["breakdowns"].items():
        for g, row in groups.items():
            rows += [cells(f"{name} {g}", row["n"], k, c) for k, c in row.items() if k != "n"]
    return markdown_table(["group", "n", "number", "value", "95% interval"], rows)


def paired_difference(a: Sequence[float], b: Sequence[float], clusters: Sequence[str],
                      strata: Optional[Sequence[Any]], groups: Dict[str, np.ndarray], n_boot: int = 1000,
                      seed: int = 0, key: str = "") -> Dict[str, Dict[str, Any]]:
    """Per group: the mean of ``a``, the mean of ``b`` (paired entries: entry i of ``a`` and of
    ``b`` are one item measured twice) and their difference ``a - b``, each with its 95% interval.

    Paired: one set of cluster resamples (``cluster_weights``, the same seed, key and strata as
    ``bootstrap``) weighs both sides, so the difference's interval holds only the spread of the
    within-item changes. Values are per-entry proportions in [0, 1]. When no entry of a group
    changes (a = b everywhere) every resample gives 0 and the percentile interval collapses;
    then the exact bound for 0 changed clusters of n is used, as ``utils.bootstrap.interval``
    does at a bound: |difference| <= the share of changed clusters <= 1 - 0.025^(1/n)."""
    import numpy as np

    a_arr, b_arr = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    W = cluster_weights(clusters, n_boot, seed, key, strata)
    c_arr = np.asarray([str(c) for c in clusters], dtype=object)
    s_arr = None if strata is None else np.asarray([str(x) for x in strata], dtype=object)
    out: Dict[str, Dict[str, Any]] = {}
    for g, mask in groups.items():
        ok = _enough_clusters(c_arr, s_arr, mask)
        n_c = _n_clusters(c_arr, mask)
        mean_a, mean_b = wmean(W, a_arr, mask), wmean(W, b_arr, mask)
        diff = interval(mean_a - mean_b, ok, n_c, None)
        if ok and diff["low"] is None and diff["value"] is not None and np.array_equal(a_arr[mask], b_arr[mask]):
            width = 1.0 - 0.025 ** (1.0 / n_c)
            diff = {"value": diff["value"], "low": -width, "high": width, "method": "clopper-pearson"}
        out[g] = {"n": int(mask.sum()), "a": interval(mean_a, ok, n_c, (0.0, 1.0)),
                  "b": interval(mean_b, ok, n_c, (0.0, 1.0)), "difference": diff}
    return out
