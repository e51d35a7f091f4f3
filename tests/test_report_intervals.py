"""Intervals that do not mislead: a number from fewer than MIN_CLUSTERS clusters (or from a
stratum of one cluster) has no interval, whatever its family; PIF-1-1 and PIF-IQR-1 are not
headline numbers with one response per turn; reporting reads benchmarks from the registry."""
from __future__ import annotations

from evaluation.reporting.bootstrap import MIN_CLUSTERS, bootstrap
from metrics import REPORT_SPECS, report_spec


def _acc_entries(n_clusters: int, per_cluster: int = 2):
    return [{"sample_id": f"s{c}-{i}", "cluster": f"c{c}", "correct": c % 2 == 0, "extracted": "A"}
            for c in range(n_clusters) for i in range(per_cluster)]


def test_too_few_clusters_give_no_interval():
    assert MIN_CLUSTERS == 5
    few = bootstrap(_acc_entries(MIN_CLUSTERS - 1), {"metric": "single_choice"}, n_boot=200)
    assert few["headline"]["accuracy"] == {"value": 0.5, "low": None, "high": None}
    enough = bootstrap(_acc_entries(MIN_CLUSTERS + 1), {"metric": "single_choice"}, n_boot=200)
    acc = enough["headline"]["accuracy"]
    assert acc["value"] == 0.5 and acc["low"] < 0.5 < acc["high"]


def _mme_entries(images_per_subtask):
    out = []
    for sub, n in images_per_subtask.items():
        for img in range(n):
            for q, gt in enumerate(("yes", "no")):
                out.append({"sample_id": f"{sub}-{img}-{q}", "cluster": f"{sub}/{img}", "subtask": sub,
                            "image": str(img), "dup_index": 0, "correct": (img + q) % 3 != 0})
    return out


def test_mme_subtask_of_one_image_has_no_interval_and_blocks_the_totals():
    ps = _mme_entries({"existence": 6, "OCR": 1})
    b = bootstrap(ps, {"metric": "mme"}, n_boot=200)
    sub = b["breakdowns"]["subtask"]
    assert sub["existence"]["score"]["low"] is not None
    assert sub["OCR"]["score"]["low"] is None and sub["OCR"]["score"]["value"] == 50.0
    # the stratum of one image is never resampled: the totals would look surer than they are
    assert b["headline"]["total_score"]["low"] is None
    full = bootstrap(_mme_entries({"existence": 6, "OCR": 5}), {"metric": "mme"}, n_boot=200)
    assert full["headline"]["total_score"]["low"] is not None


def _pif_entries(n_chats: int, n_resp: int):
    return [{"sample_id": f"{c}-t{t}", "cluster": str(c), "chat_id": str(c), "turn": t,
             "instructions": ["number_odd"], "followed": [t % 2 == 0], "pif": float(t % 2 == 0),
             "pif_loose": float(t % 2 == 0), "pif_samples": [float(t % 2 == 0)] * n_resp}
            for c in range(n_chats) for t in (1, 2)]


def test_pif_by_turn_band_needs_enough_chats_and_one_response_has_no_n_k():
    one = bootstrap(_pif_entries(1, 1), {"metric": "pif"}, n_boot=200)
    assert all(g["pif"]["low"] is None for g in one["breakdowns"]["turn"].values())
    assert set(one["headline"]) == {"pif", "pif_loose"}  # no PIF-1-1, no PIF-IQR-1
    many = bootstrap(_pif_entries(6, 2), {"metric": "pif"}, n_boot=200)
    assert {"pif_2_1", "pif_2_2", "pif_iqr_2"} <= set(many["headline"])


def test_benchmarks_reach_reporting_through_the_registry():
    assert {"iwisdm", "mme", "pif"} <= set(REPORT_SPECS)
    assert report_spec("mme").family == "mme" and report_spec("pif").family == "pif"
    assert report_spec("single_choice").family == "accuracy" and report_spec("single_choice").breakdowns == ()
    src = open(__import__("evaluation.reporting.bootstrap", fromlist=["x"]).__file__).read()
    for name in ("build.mme", "metrics.iwisdm", "metrics.pif", "PERCEPTION", "INSTRUCTION_IDS", "iwisdm"):
        assert name not in src, name
