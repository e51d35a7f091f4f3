"""Intervals that do not mislead: a number from fewer than MIN_CLUSTERS clusters (or from a
stratum of one cluster) has no interval, whatever its family; PIF-1-1 and PIF-IQR-1 are not
headline numbers with one response per turn; reporting reads benchmarks from the registry."""
from __future__ import annotations

from reform_eval.evaluation.reporting.bootstrap import MIN_CLUSTERS, bootstrap
from reform_eval.metrics import REPORT_SPECS, report_spec


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
    src = open(__import__("reform_eval.evaluation.reporting.bootstrap", fromlist=["x"]).__file__).read()
    for name in ("reform_eval.build.mme", "reform_eval.metrics.iwisdm", "reform_eval.metrics.pif", "PERCEPTION", "INSTRUCTION_IDS", "iwisdm"):
        assert name not in src, name


def _captured_figures(monkeypatch):
    from reform_eval.evaluation.reporting import plots
    figs = []
    monkeypatch.setattr(plots, "_save", lambda fig, out_dir, name: figs.append((name, fig)) or [name])
    return plots, figs


def _comp(metric, family, models):
    return {"benchmark": "B", "metric": metric, "family": family, "models": models}


def test_mme_plot_has_the_chance_line_and_a_zero_bar_is_drawn(monkeypatch, tmp_path):
    plots, figs = _captured_figures(monkeypatch)
    cell = lambda v: {"value": v, "low": None, "high": None}  # noqa: E731
    models = [{"name": n, "headline": {"total_score": cell(t)}, "extra": {}, "chance_by": {},
               "breakdowns": {"subtask": {"OCR": {"n": 40, "score": cell(s)}, "existence": {"n": 60, "score": cell(s)}}}}
              for n, s, t in (("zero", 0.0, 0.0), ("half", 100.0, 200.0))]
    plots.make_plots(_comp("mme", "mme", models), [], str(tmp_path))
    fig = dict(figs)["mme_subtasks"]
    ax = fig.axes[0]
    segs = [seg for coll in ax.collections for seg in coll.get_segments() if len(seg)]
    chance = [seg for seg in segs if seg[0][1] == 75.0 and seg[1][1] == 75.0]
    assert len(chance) == 2  # one tick per subtask at 75
    zeros = [seg for seg in segs if seg[0][1] == seg[1][1] == 0.0 and seg[0][0] != seg[1][0]]
    assert len(zeros) == 2  # the zero model's two bars
    # no interval in the table: no error bar either (a zero-length one reads as [v, v])
    assert not [seg for seg in segs if seg[0][0] == seg[1][0]]
    total = dict(figs)["mme_total"].axes[0]
    tsegs = [seg for coll in total.collections for seg in coll.get_segments() if len(seg)]
    assert any(seg[0][1] == seg[1][1] == 0.0 and seg[0][0] != seg[1][0] for seg in tsegs)
    assert not [seg for seg in tsegs if seg[0][0] == seg[1][0]]
    # the total's chance line: 75 for each of the 2 subtasks scored
    drawn = [tuple(float(y) for y in line.get_ydata()) for line in total.get_lines()]
    assert [y for y in drawn if all(v == v for v in y)] == [(150.0, 150.0)]  # (NaN: no error bar)


def test_per_sample_card_shows_the_options_with_their_marks():
    from reform_eval.evaluation.reporting.html import sample_data
    rec = {"sample_id": "t0", "dup_index": 0, "question": "Is it?", "answer_options": ["false", "true"],
           "option_marks": ["A", "B"], "question_with_option": "Is it? Options: (A) false; (B) true.",
           "answer": 1, "prediction": "(B)"}
    p = {"sample_id": "t0", "dup_index": 0, "cluster": "t0", "question": "Is it?", "answer_text": "true",
         "prediction": "(B)", "extracted": 1, "correct": True}
    data = sample_data({"family": "accuracy"}, [{"name": "m", "records": [rec],
                                                 "result": {"prediction_file": None, "per_sample": [p]}}])
    assert data["strings"][data["samples"][0][2]] == "Is it? Options: (A) false; (B) true."


def test_all_clusters_agreeing_give_an_exact_interval_at_a_bound_and_none_inside():
    """Every resample equal (all wrong, all right) would give a zero-width percentile interval.
    At a bound the exact Clopper-Pearson interval over the clusters replaces it (checked against
    scipy); a statistic without a known range, or at an interior value, shows none."""
    from scipy.stats import binomtest

    from reform_eval.evaluation.reporting.bootstrap import stat_bounds
    from reform_eval.utils.bootstrap import cluster_interval
    ids = [str(i) for i in range(100)]
    zero = cluster_interval([0.0] * 100, ids)
    exact = binomtest(0, 100).proportion_ci(method="exact")
    assert zero["method"] == "clopper-pearson" and zero["low"] == 0.0
    assert abs(zero["high"] - exact.high) < 1e-12 and abs(zero["high"] - 0.0362167) < 1e-6
    one = cluster_interval([1.0] * 14, ids[:14])
    assert abs(one["low"] - binomtest(14, 14).proportion_ci(method="exact").low) < 1e-12 and one["high"] == 1.0
    # two entries per cluster (an MME image), both right: still 14 clusters
    two = cluster_interval([1.0] * 28, [i for i in ids[:14] for _ in (0, 1)])
    assert two["low"] == one["low"]
    assert cluster_interval([0.5] * 14, ids[:14])["low"] is None          # interior: no interval
    assert cluster_interval([1.0] * 4, ids[:4])["low"] is None            # too few clusters: none
    assert cluster_interval([1.0] * 14, ids[:14], bounds=None)["low"] is None
    assert stat_bounds("score") == (0.0, 200.0) and stat_bounds("pif_4_2") == (0.0, 1.0)
    assert stat_bounds("total_score") is None and stat_bounds("pif_iqr_4") is None
