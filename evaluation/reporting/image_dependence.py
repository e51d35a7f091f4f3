"""What the image adds: a run with images beside a run of the same items with ``--image_ablation``.

For every pair of runs of one model and method where one has its images and the other an
ablation (``build.ablation``), paired item by item: accuracy with the images, accuracy with
the ablation, and the difference with a 95% paired cluster-bootstrap interval
(``bootstrap.paired_difference``), overall and by the benchmark's strata (iWISDM complexity,
MME subtask). Each paired item says whether it was right without the image.

Pairing: an ablated record carries ``image_ablation.intact_item_sha``, the item hash its sample
has without the ablation; it pairs with the intact record of the same key whose ``item_sha`` is
that hash, and with nothing else (``compare.sample_shas`` reads it as the ablated record's item).
"""
from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from ...build.ablation import IMAGE_ABLATIONS
from .bootstrap import cluster_of, groups_of, paired_difference
from ...metrics import report_spec

Key = Tuple[str, int]
#: (run with images, ablated run) -> (the keys paired by item, the shared keys refused): ``compare``'s rule
PairRuns = Callable[[Dict[str, Any], Dict[str, Any]], Tuple[List[Key], int]]

#: what the table calls each mode
MODE_LABELS = {"none": "no images", "blank": "blank images", "noise": "noise images",
               "shuffle": "another sample's images"}


def ablation_mode(records: Sequence[Dict[str, Any]]) -> Optional[str]:
    """The image ablation a run's records were made with (``mode``: what was done), None for
    images as given; several modes in one run read as one label."""
    modes = sorted({str((r.get("image_ablation") or {}).get("mode")) for r in records
                    if isinstance(r.get("image_ablation"), dict)})
    return "+".join(modes) if modes else None


def _model(run: Dict[str, Any]) -> str:
    names = sorted({str(r.get("model")) for r in run.get("records") or [] if r.get("model")})
    return names[0] if len(names) == 1 else run["name"]


def _key(p: Dict[str, Any]) -> Key:
    return (str(p.get("sample_id")), int(p.get("dup_index", 0) or 0))


def image_dependence(runs: Sequence[Dict[str, Any]], family: str, benchmark: str, metric: Optional[str],
                     pair_runs: PairRuns, seed: int = 0, n_boot: int = 1000) -> List[Dict[str, Any]]:
    """One entry per (run with images, ablated run) of the same model and method that share items;
    ``pair_runs`` is the comparison's pairing rule."""
    import numpy as np

    field = "pif" if family == "pif" else "correct"
    strata_field = report_spec(metric).strata
    modes = {r["name"]: ablation_mode(r.get("records") or []) for r in runs}
    out: List[Dict[str, Any]] = []
    for intact in runs:
        if modes[intact["name"]] is not None:
            continue
        for ablated in runs:
            mode = modes[ablated["name"]]
            if mode is None or _model(ablated) != _model(intact) or \
                    ablated["result"].get("infer_method") != intact["result"].get("infer_method"):
                continue
            pi = {_key(p): p for p in intact["result"]["per_sample"]}
            pa = {_key(p): p for p in ablated["result"]["per_sample"]}
            keys, refused = pair_runs(intact, ablated)
            if not keys:
                continue
            a = [float(pi[k].get(field) or 0.0) for k in keys]
            b = [float(pa[k].get(field) or 0.0) for k in keys]
            entries = [pi[k] for k in keys]
            by = strata_field if strata_field and all(p.get(strata_field) is not None for p in entries) else None
            strata = [p.get(by) for p in entries] if by else None
            groups = {"all": np.ones(len(keys), dtype=bool)}
            if by:
                split = groups_of(entries, by)
                groups.update(split if len(split) > 1 else {})  # (one group: the same numbers as 'all')
            stats = paired_difference(a, b, [cluster_of(p) for p in entries], strata, groups, n_boot=n_boot,
                                      seed=seed, key=benchmark)
            rows = []
            for g, st in stats.items():
                mask = groups[g]
                chances = [float(p["chance"]) for p, m in zip(entries, mask) if m and p.get("chance") is not None]
                rows.append({"group": g, "n": st["n"], "with_images": st["a"], "ablated": st["b"],
                             "chance": sum(chances) / len(chances) if len(chances) == st["n"] else None,
                             "difference": st["difference"],
                             "right_without_image": int(sum(1 for x, m in zip(b, mask) if m and _right(x))),
                             "right_only_with_image": int(sum(1 for x, y, m in zip(a, b, mask)
                                                              if m and _right(x) and not _right(y)))})
            out.append({
                "model": _model(intact), "infer_method": intact["result"].get("infer_method"),
                "with_images": intact["name"], "ablated": ablated["name"], "mode": mode,
                "statistic": "pif" if family == "pif" else "accuracy", "breakdown": by,
                "n_pairs": len(keys), "n_refused": refused, "n_unpaired": len(pa) - len(keys), "rows": rows,
                "per_sample": [{"sample_id": k[0], "dup_index": k[1], **({by: pi[k].get(by)} if by else {}),
                                "right_with_image": _right(x), "right_without_image": _right(y)}
                               for k, x, y in zip(keys, a, b)]})
    order = {m: i for i, m in enumerate(IMAGE_ABLATIONS)}
    return sorted(out, key=lambda d: (d["model"], str(d["infer_method"]), d["with_images"],
                                      order.get(d["mode"], len(order)), d["mode"]))


def _right(value: float) -> bool:
    """A verdict counted right: correct, or (PIF) every instruction followed."""
    return value >= 1.0 - 1e-12


def _cell(c: Optional[Dict[str, Any]], signed: bool = False) -> str:
    if not c or c.get("value") is None:
        return "-"
    fmt = "{:+.3f}" if signed else "{:.3f}"
    text = fmt.format(c["value"])
    if c.get("low") is not None:
        text += f" [{fmt.format(c['low'])}, {fmt.format(c['high'])}]"
    return text


def dependence_table(deps: Sequence[Dict[str, Any]]) -> Optional[Tuple[str, List[str], List[List[str]]]]:
    """(title, header, rows) of the image-dependence table, or None without a paired ablation."""
    if not deps:
        return None
    stat = deps[0]["statistic"]
    by = next((d["breakdown"] for d in deps if d["breakdown"]), None)
    chance = any(r.get("chance") is not None for d in deps for r in d["rows"])
    header = (["model", "method", "ablation", by or "group", "pairs"] + (["chance"] if chance else [])
              + [f"{stat} with images", f"{stat} ablated", "difference (with - ablated)", "right without the image"])
    rows = []
    for d in deps:
        for r in d["rows"]:
            rows.append([d["model"], str(d["infer_method"] or "-"), MODE_LABELS.get(d["mode"], d["mode"]),
                         r["group"], str(r["n"])]
                        + (["-" if r.get("chance") is None else f"{r['chance']:.3f}"] if chance else [])
                        + [_cell(r["with_images"]), _cell(r["ablated"]), _cell(r["difference"], signed=True),
                           str(r["right_without_image"])])
    title = (f"Image dependence ({stat} with the images and with them ablated, paired by item; "
             "95% paired cluster-bootstrap interval of the difference)")
    return title, header, rows


def dependence_notes(deps: Sequence[Dict[str, Any]]) -> List[str]:
    """One sentence per ablated run some of whose items have no intact counterpart."""
    return [f"{d['n_unpaired']} item(s) of {d['ablated']} have no intact counterpart in {d['with_images']} "
            f"(another build or seed); the table uses the {d['n_pairs']} paired items."
            for d in deps if d["n_unpaired"]]
