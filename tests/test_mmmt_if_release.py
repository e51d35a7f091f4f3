"""The MMMT-IF release's model scores as reference rows (issue 11 §2): exact values from the
release CSV shipped in configs/data, the paired tests and the dominance check."""
from __future__ import annotations

import json
import os

import numpy as np
import pytest
from scipy.stats import wilcoxon

from reform_eval import run_loader_eval
from reform_eval.metrics.mmmt_if_release import (dominates, read_release_records, release_reference_report,
                                     wilcoxon_pair)
from reform_eval.metrics.pif import pif_metric
from reform_eval.utils.errors import ReformError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RELEASE = os.path.join(ROOT, "configs", "data", "mmmt_if_release.csv")


@pytest.fixture(scope="module")
def release_records() -> list:
    return read_release_records(RELEASE)


@pytest.fixture(scope="module")
def report(release_records: list) -> dict:
    return release_reference_report(release_records)


def test_records_per_model(release_records: list) -> None:
    models = {}
    for r in release_records:
        models.setdefault(r["model"], []).append(r)
    assert list(models) == ["Gemini 1.5 Pro", "GPT-4o", "Claude 3.5 Sonnet"]
    assert all(len(v) == 990 for v in models.values())
    first = models["Claude 3.5 Sonnet"][0]
    assert first["sample_id"] == "0-t01" and first["meta"]["instructions"] == ["number_odd"]
    assert first["prediction"] is None and first["reported_pif"] == 1.0


def test_corpus_pif_equals_table3(report: dict) -> None:
    m = report["metrics"]["models"]
    # Table 3 prints 0.473 / 0.647 / 0.771; the release's GPT-4o mean is 0.64773 (see docs)
    assert m["Gemini 1.5 Pro"]["pif"] == pytest.approx(0.4730952, abs=1e-6)
    assert m["GPT-4o"]["pif"] == pytest.approx(0.6477321, abs=1e-6)
    assert m["Claude 3.5 Sonnet"]["pif"] == pytest.approx(0.7706181, abs=1e-6)
    assert [round(m[k]["pif"], 3) for k in m] == [0.473, 0.648, 0.771]
    assert "| Claude 3.5 Sonnet | 990 | 0.771 |" in report["tables"]["MMMT-IF models: corpus PIF"]


def test_release_differs_from_paper_text(report: dict) -> None:
    m = report["metrics"]["models"]
    turn1 = np.mean([m[k]["pif_by_turn"]["1"]["pif"] for k in m])
    turn20 = np.mean([m[k]["pif_by_turn"]["20"]["pif"] for k in m])
    assert round(turn1, 3) == 0.812          # paper: 0.81
    assert round(turn20, 3) == 0.558         # paper text: 0.64
    assert m["Claude 3.5 Sonnet"]["pif_by_turn"]["20"]["n"] == 11
    six = m["Claude 3.5 Sonnet"]["pif_by_num_instructions"]["6"]
    assert (round(six["pif"], 3), six["n"]) == (0.683, 464)   # paper text: 0.74
    assert round(m["Gemini 1.5 Pro"]["pif_by_num_instructions"]["6"]["pif"], 3) == 0.399  # paper: 0.4
    assert round(m["Gemini 1.5 Pro"]["pif_by_num_instructions"]["1"]["pif"], 3) == 0.676  # paper: 0.68
    ci = m["Gemini 1.5 Pro"]["pif_by_turn"]["1"]
    assert ci["ci95_low"] < ci["pif"] < ci["ci95_high"]


def test_paired_tests_and_dominance(report: dict) -> None:
    w = report["metrics"]["wilcoxon"]
    assert w["Gemini 1.5 Pro vs Claude 3.5 Sonnet"]["n_pairs"] == 990
    assert w["Gemini 1.5 Pro vs Claude 3.5 Sonnet"]["p_b_greater"] < 1e-5
    assert w["Gemini 1.5 Pro vs GPT-4o"]["p_b_greater"] < 1e-5
    d = report["metrics"]["dominance"]["Gemini 1.5 Pro vs Claude 3.5 Sonnet"]
    assert d["b_dominates_a_at_every_turn"] and len(d["turns"]) == 20
    assert not d["a_dominates_b_at"]
    assert report["metrics"]["dominance"]["Gemini 1.5 Pro vs GPT-4o"]["b_dominates_a_at"] == [
        t for t in range(1, 21) if t not in (16, 20)]


def test_wilcoxon_pairs_on_shared_turns() -> None:
    a = {("c1", 1): 0.0, ("c1", 2): 0.5, ("c2", 1): 0.25, ("c2", 2): 1.0, ("c3", 1): 0.2, ("x", 9): 0.0}
    b = {("c3", 1): 0.9, ("c2", 2): 0.8, ("c1", 2): 1.0, ("c2", 1): 1.0, ("c1", 1): 0.7}
    out = wilcoxon_pair(a, b)
    keys = [("c1", 1), ("c1", 2), ("c2", 1), ("c2", 2), ("c3", 1)]
    ref = wilcoxon([b[k] for k in keys], [a[k] for k in keys])
    assert out["n_pairs"] == 5 and out["n_nonzero"] == 5
    assert out["p_two_sided"] == pytest.approx(ref.pvalue) and out["statistic"] == ref.statistic
    assert out["mean_diff_b_minus_a"] == pytest.approx((0.7 + 0.5 + 0.75 - 0.2 + 0.7) / 5)
    same = wilcoxon_pair({("c", 1): 1.0}, {("c", 1): 1.0})
    assert same["n_nonzero"] == 0 and np.isnan(same["p_two_sided"])


def test_dominance_definition() -> None:
    assert dominates([1, 1, 0.5], [0.5, 0, 1])
    assert not dominates([0.5, 0, 1], [1, 1, 0.5])
    assert not dominates([0, 1], [0.5, 0.5]) and not dominates([0.5, 0.5], [0, 1])  # crossing ECDFs
    assert dominates([0.5], [0.5])


def test_pif_metric_scores_reported_values() -> None:
    recs = [{"sample_id": "a-t01", "prediction": None, "reported_pif": 0.5,
             "meta": {"chat_id": "a", "turn": 1, "instructions": ["number_odd", "start_char_S"]}},
            {"sample_id": "a-t02", "prediction": None, "reported_pif": 1.0,
             "meta": {"chat_id": "a", "turn": 2, "instructions": ["number_odd", "start_char_S"]}}]
    m = pif_metric(recs)["metrics"]
    assert m["pif"] == 0.75 and m["pif_loose"] is None
    assert m["pif_by_instruction"]["number_odd"] == {"pif_given": 0.75, "followed": None,
                                                     "followed_loose": None, "n": 2}
    with pytest.raises(ReformError, match="reported_pif"):
        pif_metric([dict(recs[0], reported_pif=1.5)])


def test_run_loader_eval_on_release_csv(tmp_path, capsys) -> None:
    rc = run_loader_eval.main(["--dataset_name", "MMMT-IF", "--prediction_file", RELEASE,
                               "--output_dir", str(tmp_path)])
    out = capsys.readouterr().out
    assert rc == 0
    assert "| Gemini 1.5 Pro | 990 | 0.473 |" in out and "| GPT-4o | 990 | 0.648 |" in out
    assert "Wilcoxon" in out and "stochastic dominance" in out
    saved = json.loads((tmp_path / "mmmt_if_release.results.json").read_text())
    assert saved["metrics"]["models"]["GPT-4o"]["num_turns"] == 990
    assert (tmp_path / "mmmt_if_release.results.md").read_text().startswith("## MMMT-IF models")


def test_release_configs_point_inside_the_repository() -> None:
    import yaml
    cfg_dir = os.path.join(ROOT, "configs", "datasets")
    for name in ("mmmt_if_release.yaml", "mmmt_if_release_only.yaml"):
        with open(os.path.join(cfg_dir, name), encoding="utf-8") as f:
            path = yaml.safe_load(f)["release_csv"]
        full = os.path.realpath(os.path.join(cfg_dir, path))
        assert full == os.path.realpath(RELEASE), name


def test_reference_rows_beside_a_run_built_from_the_release(release_records: list) -> None:
    """A run on release_only carries meta.release_pif: the released rows pair with it per turn."""
    from reform_eval.build import build_dataset
    from reform_eval.metrics.mmmt_if_release import reference_records_from
    samples, _ = build_dataset("MMMT-IF", "Generation", {"source": "release_only", "release_csv": RELEASE},
                               in_context_sample=False)
    mine = [dict({k: v for k, v in s.items() if k != "images"}, model="mine", prediction="So 8 birds swim!")
            for s in samples[:30]]
    refs = reference_records_from(mine)
    assert len(refs) == 90 and {r["model"] for r in refs} == {"Gemini 1.5 Pro", "GPT-4o", "Claude 3.5 Sonnet"}
    by_key = {(r["model"], r["sample_id"]): r["reported_pif"] for r in release_records}
    assert all(r["reported_pif"] == by_key[(r["model"], r["sample_id"])] for r in refs)
    rep = release_reference_report(mine + refs)
    assert list(rep["metrics"]["models"]) == ["mine", "Gemini 1.5 Pro", "GPT-4o", "Claude 3.5 Sonnet"]
    assert rep["metrics"]["wilcoxon"]["mine vs GPT-4o"]["n_pairs"] == 30
