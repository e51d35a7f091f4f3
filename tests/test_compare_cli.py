"""One command compares several models: run_loader_eval over their prediction files writes
the comparison table with intervals, the paired tests, plots and report.html; records keep
the prompt and answer text, and --save_images makes iWISDM frames reachable."""
from __future__ import annotations

import json
import os

import pytest

from reform_eval import run_eval
from reform_eval import run_loader_eval
from tests.conftest import prediction_files, results_of

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _run(out, model, *extra):
    argv = ["--model", model, "--output_dir", str(out), "--do_eval", *extra]
    if model == "llava":
        argv += ["--model_name", "tiny", "--infer_method", "likelihood"]
    assert run_eval.main(argv) == 0


@pytest.mark.slow  # (quick subset: test_mme_comparison_keeps_image_pairs covers the path)
def test_three_models_on_iwisdm_levels(tmp_path, capsys):
    out = tmp_path / "iw"
    common = ["--dataset_name", "iWISDM", "--dataset_config", "iwisdm_all_levels", "--formulation",
              "SingleChoice", "--dataset_subsample", "12", "--save_images"]
    for model in ("random", "constant", "llava"):
        _run(out, model, *common)
    files = prediction_files(out)
    assert len(files) == 3
    recs = json.load(open(files[0]))
    # everything a verdict needs is in the record
    r = recs[0]
    assert isinstance(r["prompt"], (str, list)) and r["answer_text"] == r["answer_options"][r["answer"]]
    assert r["image_paths"] and all(os.path.isfile(out / p) for p in r["image_paths"])
    assert r["model"] in ("random", "constant", "llava:tiny")
    capsys.readouterr()
    assert run_loader_eval.main(["--prediction_file", str(out / "iWISDM_*"), "--output_dir", str(tmp_path / "cmp"),
                                 "--n_boot", "200"]) == 0
    printed = capsys.readouterr().out
    comp = json.load(open(tmp_path / "cmp" / "comparison.json"))
    assert sorted(m["name"] for m in comp["models"]) == ["constant", "llava:tiny", "random"]
    assert all("low" in m["headline"]["accuracy"] and "high" in m["headline"]["accuracy"] for m in comp["models"])
    assert os.path.isfile(tmp_path / "cmp" / "report.html")
    assert any(n.endswith(".png") for n in os.listdir(tmp_path / "cmp" / "plots"))
    # the console: the headline table and the paths; the paired tests are in comparison.md (issue 32)
    assert "Headline metrics" in printed and "report.html" in printed and "comparison.md" in printed
    assert "exact McNemar" not in printed and "exact McNemar" in open(tmp_path / "cmp" / "comparison.md").read()
    # per-run results were written by the loader too, beside run_eval's (which are untouched)
    for f in files:
        assert results_of(f)["metrics"]["num_records"] == 12


def test_mme_comparison_keeps_image_pairs(tmp_path):
    from reform_eval.build.mme import write_placeholder_release
    questions = os.path.join(ROOT, "configs", "data", "mme_questions")  # shipped with the project
    root = tmp_path / "release"
    write_placeholder_release(questions, str(root), subtasks=["existence", "OCR"])
    cfg = tmp_path / "mme.yaml"
    cfg.write_text(f"root: {root}\nsubtasks: [existence, OCR]\n")
    out = tmp_path / "mme"
    for model in ("random", "constant"):
        _run(out, model, "--dataset_name", "MME", "--dataset_config", str(cfg), "--dataset_subsample", "10")
    _run(out, "random", "--dataset_name", "MME", "--dataset_config", str(cfg), "--dataset_subsample", "10",
         "--seed", "3")
    assert run_loader_eval.main(["--prediction_file", str(out), "--n_boot", "200"]) == 0
    comp = json.load(open(out / "comparison.json"))
    names = [m["name"] for m in comp["models"]]
    assert len(names) == 3 and len(set(names)) == 3
    for f in prediction_files(out):
        keys = [tuple(r["meta"]["image_key"]) for r in json.load(open(f))]
        assert len(set(keys)) == 10 and all(keys.count(k) == 2 for k in keys)  # both questions of each image


def test_eval_stability_without_duplicates_is_refused(tmp_path):
    with pytest.raises(SystemExit):
        run_eval.build_parser().parse_args([])
    argv = ["--model", "random", "--dataset_name", "iWISDM", "--dataset_config", "iwisdm_low",
            "--eval_stability", "--output_dir", str(tmp_path)]
    assert run_eval.main(argv) == 2
