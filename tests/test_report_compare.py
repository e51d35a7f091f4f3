"""compare_runs: bootstrap point estimates equal the metrics, clusters resample whole, paired tests
have known p-values, and the files hold what they claim."""
from __future__ import annotations

import json

import pytest

from reform_eval.metrics.mme import aggregate
from reform_eval.metrics.pif import summarize
from tests.report_fixtures import iwisdm_records, mme_records, mmmt_if_records, run
from reform_eval.utils.errors import ReformError
from reform_eval.evaluation.reporting.bootstrap import FAMILIES, bootstrap, cluster_weights
from reform_eval.evaluation.reporting.compare import build_comparison, mcnemar, paired_tests, wilcoxon_pairs
from reform_eval.evaluation.reporting.report import compare_runs


def test_cluster_weights_keep_clusters_and_strata_whole():
    clusters = ["a", "a", "b", "c", "c", "c", "d"]
    strata = ["x", "x", "x", "x", "x", "x", "y"]
    W = cluster_weights(clusters, 200, seed=3, key="k", strata=strata)
    assert W.shape == (201, 7) and (W[0] == 1).all()
    assert (W[:, 0] == W[:, 1]).all() and (W[:, 3] == W[:, 4]).all() and (W[:, 4] == W[:, 5]).all()
    # per resample: three clusters drawn in stratum x, and d (alone in y) exactly once
    assert (W[1:, 0] + W[1:, 2] + W[1:, 3] == 3).all() and (W[1:, 6] == 1).all()
    assert W[1:, 0].std() > 0
    assert (cluster_weights(clusters, 200, seed=3, key="k", strata=strata) == W).all()
    assert not (cluster_weights(clusters, 200, seed=4, key="k", strata=strata) == W).all()


def test_point_estimates_equal_the_metrics():
    r = run("m", iwisdm_records(30, 0.6))
    b = bootstrap(r["result"]["per_sample"], r["result"], n_boot=50)
    m = r["result"]["metrics"]
    assert b["family"] == "accuracy" and b["num_clusters"] == 30
    assert b["headline"]["accuracy"]["value"] == pytest.approx(m["accuracy"])
    assert b["headline"]["format_hit_rate"]["value"] == pytest.approx(m["format_hit_rate"])
    for name in ("complexity", "features", "response_type", "n_delay", "n_is_same"):
        assert {g: v["accuracy"]["value"] for g, v in b["breakdowns"][name].items()} == \
            pytest.approx({g: v["accuracy"] for g, v in m["by"][name].items()})
        assert {g: v["n"] for g, v in b["breakdowns"][name].items()} == {g: v["n"] for g, v in m["by"][name].items()}
    assert list(b["breakdowns"]["complexity"]) == ["low", "medium", "high"]

    r = run("m", mme_records())
    b = bootstrap(r["result"]["per_sample"], r["result"], n_boot=50)
    m = r["result"]["metrics"]
    for key in ("perception_score", "cognition_score", "total_score", "accuracy"):
        assert b["headline"][key]["value"] == pytest.approx(m[key])
    for sub, v in m["subtasks"].items():
        row = b["breakdowns"]["subtask"][sub]
        assert (row["acc"]["value"], row["acc_plus"]["value"], row["score"]["value"]) == \
            pytest.approx((v["acc"], v["acc_plus"], v["score"]))
    assert b["num_clusters"] == 18

    r = run("m", mmmt_if_records())
    b = bootstrap(r["result"]["per_sample"], r["result"], n_boot=50)
    m = r["result"]["metrics"]
    for key in ("pif", "pif_loose", "pif_2_1", "pif_2_2", "pif_iqr_2"):
        assert b["headline"][key]["value"] == pytest.approx(m[key])
    assert {t: v["pif"]["value"] for t, v in b["breakdowns"]["turn"].items()} == \
        pytest.approx({t: v["pif"] for t, v in m["pif_by_turn"].items()})
    assert {t: v["pif"]["value"] for t, v in b["breakdowns"]["num_instructions"].items()} == \
        pytest.approx({t: v["pif"] for t, v in m["pif_by_num_instructions"].items()})
    assert {i: v["followed"]["value"] for i, v in b["breakdowns"]["instruction"].items()} == \
        pytest.approx({i: v["followed"] for i, v in m["pif_by_instruction"].items()})
    assert b["num_clusters"] == 5


def _resample(ps, W_row):
    """The per_sample list a weight row stands for: each cluster copied as often as drawn,
    copies told apart by dup_index so pairs stay pairs."""
    out = []
    for p, w in zip(ps, W_row):
        for c in range(int(w)):
            out.append({**p, "dup_index": p["dup_index"] + 1000 * c})
    return out


@pytest.mark.parametrize("which", ["mme", "pif"])
def test_family_on_a_resample_equals_the_metric_on_that_resample(which):
    """acc+ needs both questions of an image, PIF-N-K all turns' samples: the family recomputed
    with bootstrap weights must equal the metric run on the resampled entries themselves."""
    r = run("m", mme_records(seed=5) if which == "mme" else mmmt_if_records(seed=5))
    ps = r["result"]["per_sample"]
    strata = [p.get("subtask") for p in ps] if which == "mme" else None
    W = cluster_weights([p["cluster"] for p in ps], 5, seed=1, key="x", strata=strata)
    stats = FAMILIES[which](ps, W, r["result"])
    for b in range(1, 6):
        again = _resample(ps, W[b])
        if which == "mme":
            m = aggregate(again, "official")
            assert stats["headline"]["total_score"][b] == pytest.approx(m["total_score"])
            for sub, v in m["subtasks"].items():
                assert stats["breakdowns"]["subtask"][sub]["acc_plus"][b] == pytest.approx(v["acc_plus"])
        else:
            m = summarize(again, 2)["metrics"]
            assert stats["headline"]["pif"][b] == pytest.approx(m["pif"])
            assert stats["headline"]["pif_2_2"][b] == pytest.approx(m["pif_2_2"])
            assert stats["headline"]["pif_iqr_2"][b] == pytest.approx(m["pif_iqr_2"])


def test_clustered_interval_is_wider_than_per_entry():
    """Ten clusters of ten identical verdicts: resampling entries would claim 100 independent
    samples; resampling clusters gives the honest, much wider interval."""
    ps = [{"sample_id": f"s{c}-{k}", "dup_index": 0, "cluster": f"c{c}", "correct": c % 2 == 0, "extracted": 0}
          for c in range(10) for k in range(10)]
    res = {"metric": "single_choice", "infer_method": "likelihood"}
    clustered = bootstrap(ps, res, n_boot=2000, seed=0)["headline"]["accuracy"]
    flat = bootstrap([{**p, "cluster": p["sample_id"]} for p in ps], res, n_boot=2000, seed=0)["headline"]["accuracy"]
    assert clustered["value"] == flat["value"] == 0.5
    assert clustered["high"] - clustered["low"] > 2 * (flat["high"] - flat["low"])
    assert clustered["low"] <= 0.5 <= clustered["high"]


def test_exact_tests_known_p_values():
    # 8 discordant pairs for A, 2 for B: two-sided binomial 2 * (1 + 10 + 45) / 1024
    a = [True] * 8 + [False] * 2 + [True] * 5 + [False] * 3
    b = [False] * 8 + [True] * 2 + [True] * 5 + [False] * 3
    t = mcnemar(a, b)
    assert (t["only_a"], t["only_b"]) == (8, 2) and t["p_value"] == pytest.approx(112 / 1024)
    assert mcnemar([True, False], [True, False])["p_value"] == 1.0
    # five positive differences: exact two-sided p = 2 / 2**5; zero differences dropped
    w = wilcoxon_pairs([1, 2, 3, 4, 5, 0.5], [0, 0, 0, 0, 0, 0.5])
    assert w["p_value"] == pytest.approx(0.0625) and w["nonzero_pairs"] == 5
    assert wilcoxon_pairs([0.5, 1], [0.5, 1])["p_value"] == 1.0


def test_paired_tests_use_shared_samples_only():
    full = run("a", iwisdm_records(30, 0.8, seed=1))
    part = run("b", iwisdm_records(30, 0.3, seed=2)[:20])
    (t,) = paired_tests([full, part], "accuracy")
    assert (t["a"], t["b"], t["n_pairs"], t["test"]) == ("a", "b", 20, "exact McNemar")
    ca = [p["correct"] for p in full["result"]["per_sample"][:20]]
    cb = [p["correct"] for p in part["result"]["per_sample"]]
    assert t["p_value"] == pytest.approx(mcnemar(ca, cb)["p_value"])
    runs = [run(n, mmmt_if_records(seed=s)) for n, s in (("x", 1), ("y", 2), ("z", 3))]
    tests = paired_tests(runs, "pif")
    assert [(t["a"], t["b"], t["n_pairs"], t["test"]) for t in tests] == [
        ("x", "y", 20, "Wilcoxon signed-rank"), ("x", "z", 20, "Wilcoxon signed-rank"),
        ("y", "z", 20, "Wilcoxon signed-rank")]


def test_compare_runs_writes_tables_json_and_plots(tmp_path):
    runs = [run("good", iwisdm_records(30, 0.9, seed=1, dups=2), eval_stability=True),
            run("coin", iwisdm_records(30, 0.5, seed=2, dups=2), eval_stability=True)]
    comp = compare_runs(runs, str(tmp_path), n_boot=200)
    data = json.load(open(tmp_path / "comparison.json"))
    assert [m["name"] for m in data["models"]] == ["good", "coin"]
    acc = data["models"][0]["headline"]["accuracy"]
    assert acc["low"] <= acc["value"] <= acc["high"]
    assert acc["value"] == pytest.approx(runs[0]["result"]["metrics"]["accuracy"])
    assert data["models"][0]["extra"]["instability"] == pytest.approx(runs[0]["result"]["metrics"]["instability"])
    assert data["models"][0]["chance_by"]["complexity"] == {"low": 0.5, "medium": 0.25, "high": 0.5}
    assert data["paired_tests"][0]["n_pairs"] == 60
    md = open(tmp_path / "comparison.md").read()
    assert "| complexity | n | chance | good | coin |" in md and "exact McNemar" in md
    assert f"{acc['value']:.3f} [{acc['low']:.3f}, {acc['high']:.3f}]" in md
    for name in ("iwisdm_complexity", "iwisdm_feature_group", "iwisdm_response_type", "instability"):
        for ext in ("png", "svg"):
            assert (tmp_path / "plots" / f"{name}.{ext}").stat().st_size > 1000
    assert comp["files"]["report_html"] == str(tmp_path / "report.html")


def test_mme_and_pif_comparisons(tmp_path):
    comp = build_comparison([run("a", mme_records(seed=1)), run("b", mme_records(seed=2, p_correct=0.9))], n_boot=100)
    assert [t["test"] for t in comp["paired_tests"]] == ["exact McNemar"]
    assert set(comp["models"][0]["breakdowns"]["subtask"]) == {"existence", "OCR", "code_reasoning"}
    pif = compare_runs([run("p", mmmt_if_records(seed=1)), run("q", mmmt_if_records(seed=2))],
                       str(tmp_path), n_boot=100)
    assert {"pif", "pif_2_1", "pif_2_2", "pif_iqr_2"} <= set(pif["models"][0]["headline"])
    for name in ("pif_by_turn", "pif_by_num_instructions", "pif_n_k"):
        assert (tmp_path / "plots" / f"{name}.png").exists()


def test_bad_runs_say_why():
    a = run("a", iwisdm_records(6))
    with pytest.raises(ReformError, match="distinct name"):
        build_comparison([a, dict(a)])
    with pytest.raises(ReformError, match="different benchmarks"):
        build_comparison([a, run("b", mme_records())])
    with pytest.raises(ReformError, match="no runs"):
        build_comparison([])


def test_single_run_report_and_thumbnail_cap(tmp_path):
    from PIL import Image

    from reform_eval.evaluation.reporting.report import write_run_report
    from reform_eval.evaluation.reporting.html import sample_data
    recs = mme_records(images=4)
    for r in recs:  # absolute image paths, as the MME builder records them
        path = tmp_path / "img" / r["meta"]["subtask"] / r["meta"]["image"]
        path.parent.mkdir(parents=True, exist_ok=True)
        if not path.exists():
            Image.new("RGB", (300, 200), (200, 10, 10)).save(path, format="JPEG")
        r["image_ids"] = [str(path)]
    one = run("solo", recs)
    comp = write_run_report(one, str(tmp_path / "out"))
    assert comp["paired_tests"] == [] and [m["name"] for m in comp["models"]] == ["solo"]
    assert "Paired tests" not in open(tmp_path / "out" / "comparison.md").read()
    data = sample_data(comp, [one])
    assert len(data["thumbs"]) == 12 and data["thumbs_skipped"] == 0  # 3 subtasks x 4 images, once each
    assert [len(s[5]) for s in data["samples"]] == [1] * 24
    assert data["samples"][0][5] == data["samples"][1][5]  # both questions show the same image
    capped = sample_data(comp, [one], max_thumb_bytes=1)
    assert len(capped["thumbs"]) == 1 and capped["thumbs_skipped"] == 11
    html = open(tmp_path / "out" / "report.html").read()
    assert html.count("data:image/jpeg;base64,") == 12


def test_entries_without_cluster_fall_back_to_image_and_chat():
    """per_sample files written before 'cluster' existed still resample MME pairs and chats whole."""
    for recs in (mme_records(), mmmt_if_records()):
        r = run("m", recs)
        new = bootstrap(r["result"]["per_sample"], r["result"], n_boot=100, seed=2)
        old_ps = [{k: v for k, v in p.items() if k != "cluster"} for p in r["result"]["per_sample"]]
        old = bootstrap(old_ps, r["result"], n_boot=100, seed=2)
        assert old == new and old["num_clusters"] in (18, 5)


def test_breakdown_tables_show_each_runs_own_n():
    """A run scored on fewer items of a subtask shows its own n, never the first run's."""
    from reform_eval.evaluation.reporting.compare import tables
    full = mme_records(seed=1, images=6)
    part = [r for r in mme_records(seed=2, images=6) if not (r["meta"]["subtask"] == "OCR" and r["meta"]["image"] >= "0004")]
    comp = build_comparison([run("a", full), run("b", part)], n_boot=50)
    by_title = {title: rows for title, _, rows in tables(comp)}
    for title in ("score by subtask", "acc by subtask", "acc_plus by subtask"):
        ns = {row[0]: row[1] for row in by_title[title]}
        assert ns == {"existence": "12", "OCR": "12 / 8", "code_reasoning": "12"}, (title, ns)
