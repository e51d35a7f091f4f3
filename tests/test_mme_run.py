"""MME through run_eval / run_loader_eval: export to the official format and score it back,
the parse-rule flag, --skip_corrupt counted in results, and tiny LLaVA end to end."""
from __future__ import annotations

import json
import os

import pytest

from reform_eval import run_eval
from reform_eval import run_loader_eval
from reform_eval.build.mme import write_placeholder_release
from reform_eval.metrics.mme import read_official_results
from tests.conftest import only_results, prediction_files

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
#: the official question lists, shipped in configs/data (a copy of ../shared/data/mme)
QUESTIONS = os.path.join(ROOT, "configs", "data", "mme_questions")
pytestmark = pytest.mark.skipif(not os.path.isdir(QUESTIONS), reason="MME question lists not available")

SUBSET = ["existence", "OCR", "code_reasoning"]


@pytest.fixture(scope="module")
def mme_cfg(tmp_path_factory):
    d = tmp_path_factory.mktemp("mme_run")
    write_placeholder_release(QUESTIONS, str(d / "release"), subtasks=SUBSET)
    cfg = d / "mme.yaml"
    cfg.write_text("root: release\nsubtasks: [existence, OCR, code_reasoning]\nprompt: official\n")
    return str(cfg)


def _pred_file(out):
    files = [f for f in prediction_files(out) if os.path.basename(f).startswith("MME_")]
    assert len(files) == 1, files
    return files[0]


def _scores(metrics):
    return {s: (m["acc"], m["acc_plus"], m["score"], m["other_num"]) for s, m in metrics["subtasks"].items()}


def test_run_eval_export_and_loader_round_trip(mme_cfg, tmp_path):
    out, exp = tmp_path / "out", tmp_path / "official"
    args = ["--model", "random", "--dataset_name", "MME", "--formulation", "Generation",
            "--dataset_config", mme_cfg, "--output_dir", str(out), "--seed", "2", "--do_eval",
            "--export_mme_results", str(exp)]
    assert run_eval.main(args) == 0
    res = only_results(out)
    m = res["metrics"]
    assert res["metric"] == "mme" and m["parse_rule"] == "official"
    assert {s: v["num_questions"] for s, v in m["subtasks"].items()} == {"existence": 60, "OCR": 40,
                                                                         "code_reasoning": 40}
    assert m["perception_score"] == pytest.approx(m["subtasks"]["existence"]["score"] + m["subtasks"]["OCR"]["score"])
    assert res["build_info"]["skipped_corrupt_images"] == 0
    preds = json.load(open(_pred_file(out)))
    assert len(preds) == 140 and {p["prediction"] for p in preds} == {"Yes", "No"}
    # the subtask files, and the hidden marker naming what the folder was exported from
    assert sorted(os.listdir(exp)) == [".reform_export.json", "OCR.txt", "code_reasoning.txt", "existence.txt"]
    assert len(read_official_results(str(exp))) == 140
    # the official folder, scored offline, gives the same scores; results.json lands beside it
    assert run_loader_eval.main(["--prediction_file", str(exp), "--dataset_name", "MME"]) == 0
    back = only_results(tmp_path)
    assert _scores(back["metrics"]) == _scores(m)
    assert back["metrics"]["perception_score"] == pytest.approx(m["perception_score"])
    assert back["metrics"]["cognition_score"] == pytest.approx(m["cognition_score"])
    # and our prediction file scored offline, with another parse rule, into --output_dir
    assert run_loader_eval.main(["--prediction_file", _pred_file(out), "--mme_parse", "word",
                                 "--output_dir", str(tmp_path / "re"), "--export_mme_results",
                                 str(tmp_path / "official2")]) == 0
    again = only_results(tmp_path / "re")
    assert again["metrics"]["parse_rule"] == "word" and _scores(again["metrics"]) == _scores(m)
    assert open(tmp_path / "official2" / "OCR.txt").read() == open(exp / "OCR.txt").read()


def test_loader_errors_and_skip_corrupt(mme_cfg, tmp_path, capsys):
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "OCR.txt").write_text("0001.jpg\tq\tYes\n", encoding="utf-8")
    assert run_loader_eval.main(["--prediction_file", str(bad), "--dataset_name", "MME"]) == 2
    assert "OCR.txt: record line 1: expected 4 tab-separated fields" in capsys.readouterr().err
    # a corrupt image fails the build unless --skip_corrupt, which counts it in results.json
    rel = os.path.join(os.path.dirname(mme_cfg), "release")
    img = os.path.join(rel, "OCR", "0002.jpg")
    original = open(img, "rb").read()
    try:
        with open(img, "wb") as f:
            f.write(b"\x00garbage")
        base = ["--model", "constant", "--dataset_name", "MME", "--dataset_config", mme_cfg,
                "--dataset_option", "subtasks=[OCR]", "--output_dir", str(tmp_path / "o")]
        assert run_eval.main(base) == 2
        assert "0002.jpg: image cannot be decoded" in capsys.readouterr().err
        assert run_eval.main(base + ["--skip_corrupt", "--do_eval"]) == 0
        res = only_results(tmp_path / "o")
        assert res["build_info"] == {"skipped_corrupt_images": 1, "skipped_corrupt": ["OCR/0002.jpg"]}
        assert res["metrics"]["subtasks"]["OCR"]["num_questions"] == 38
        assert res["metrics"]["subtasks_incomplete"] == ["OCR"]
    finally:
        with open(img, "wb") as f:
            f.write(original)
    assert run_eval.main(["--model", "random", "--dataset_name", "custom", "--export_mme_results",
                          str(tmp_path / "x"), "--output_dir", str(tmp_path / "o2")]) == 2


def test_tiny_llava_end_to_end(mme_cfg, tmp_path):
    pytest.importorskip("transformers")
    out = tmp_path / "out"
    args = ["--model", "llava", "--model_name", "tiny", "--dataset_name", "MME", "--dataset_config", mme_cfg,
            "--dataset_option", "subtasks=[OCR]", "--dataset_subsample", "4", "--max_new_tokens", "3",
            "--output_dir", str(out), "--do_eval", "--export_mme_results", str(tmp_path / "official")]
    assert run_eval.main(args) == 0
    res = only_results(out)
    m = res["metrics"]["subtasks"]["OCR"]
    assert m["num_questions"] == 8 and 0.0 <= m["score"] <= 200.0
    assert m["TP"] + m["FN"] + m["TN"] + m["FP"] + m["other_num"] == 8
    # --dataset_subsample draws whole images: 4 images with both of their questions
    images = [tuple(r["meta"]["image_key"]) for r in json.load(open(_pred_file(out)))]
    assert len(set(images)) == 4 and all(images.count(k) == 2 for k in images)


def _script_env():
    import sys
    env = dict(os.environ, PYTHON=sys.executable, OMP_NUM_THREADS="1")
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    return env


@pytest.mark.slow
def test_mme_script_runs_as_written_on_a_placeholder(tmp_path):
    """commands/mme_llava.sh without an MME release: a placeholder copy, a warning, scores."""
    import glob
    import subprocess
    env = dict(_script_env(), MME_PLACEHOLDER=str(tmp_path / "placeholder"))
    done = subprocess.run(["bash", os.path.join(ROOT, "commands", "mme_llava.sh"), "--dataset_subsample", "4",
                           "--output_dir", str(tmp_path / "out")], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "these scores are not MME scores" in done.stderr
    assert len(glob.glob(str(tmp_path / "placeholder" / "OCR" / "*.jpg"))) == 20  # 20 OCR images
    records = json.load(open(_pred_file(str(tmp_path / "out"))))
    assert len(records) == 8  # 4 images, both questions each
