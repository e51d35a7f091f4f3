"""Every documented command chain, per benchmark: run (run_eval), then score the file
(run_loader_eval), then compare two models (run_loader_eval over the directory), as README and
docs show. Known values where the design fixes them: the constant model answers "Yes" to every
MME question, and MME pairs one yes and one no question per image, so its acc is exactly 0.5,
its acc+ 0 and its score 50 per subtask; the released models' PIF on a chat is the release CSV's
mean for that chat; a row the release does not score (loose PIF) is left out, never a 0."""
from __future__ import annotations

import csv
import json
import os
import subprocess
import sys

import pytest

from reform_eval import run_eval
from reform_eval import run_loader_eval
from reform_eval.build.mme import write_placeholder_release
from tests.conftest import prediction_files, results_of

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
QUESTIONS = os.path.join(ROOT, "configs", "data", "mme_questions")
RELEASE_CSV = os.path.join(ROOT, "configs", "data", "mmmt_if_release.csv")


def _scored(pred: str) -> dict:
    """The results run_loader_eval wrote for a prediction file (``<stem>.scored-<hash>``)."""
    from reform_eval.evaluation.reporting.scoring import results_files
    found = [f for f in results_files(pred) if ".scored-" in os.path.basename(f)]
    assert len(found) == 1, found
    with open(found[0], encoding="utf-8") as f:
        return json.load(f)


def _comparison(directory) -> dict:
    with open(os.path.join(str(directory), "comparison.json"), encoding="utf-8") as f:
        return json.load(f)


def _file_of(out, model: str) -> str:
    files = [f for f in prediction_files(out) if f"_{model}_" in os.path.basename(f)]
    assert len(files) == 1, files
    return files[0]


def _picked(rec: dict) -> int:
    """The option index a baseline's generated "(B)" names."""
    return rec["option_marks"].index(rec["prediction"].strip().strip("()"))


def test_iwisdm_run_score_compare(tmp_path, capsys):
    out = tmp_path / "iw"
    common = ["--dataset_name", "iWISDM", "--dataset_config", "iwisdm_low", "--formulation", "SingleChoice",
              "--dataset_subsample", "20", "--output_dir", str(out)]
    assert run_eval.main(["--model", "random", *common]) == 0  # run only; scored offline below
    random_file = _file_of(out, "random")
    assert run_loader_eval.main(["--prediction_file", random_file]) == 0
    recs = json.load(open(random_file))
    assert len(recs) == 20
    acc = sum(_picked(r) == r["answer"] for r in recs) / 20
    assert _scored(random_file)["metrics"]["accuracy"] == pytest.approx(acc)

    assert run_eval.main(["--model", "constant", *common, "--do_eval"]) == 0
    const_file = _file_of(out, "constant")
    const = json.load(open(const_file))
    assert {_picked(r) for r in const} == {0}  # the first option shown
    const_acc = sum(r["answer"] == 0 for r in const) / 20
    assert results_of(const_file)["metrics"]["accuracy"] == pytest.approx(const_acc)
    # one interval method: results.md shows the report's bootstrap interval, digit for digit
    with open(os.path.join(const_file[:-5] + ".report", "comparison.json"), encoding="utf-8") as f:
        cell = json.load(f)["models"][0]["headline"]["accuracy"]
    md = open(const_file[:-5] + ".results.md", encoding="utf-8").read()
    assert (f"| all | 20 | accuracy | {cell['value']:.4f} | [{cell['low']:.4f}, {cell['high']:.4f}] |"
            in md), md

    capsys.readouterr()
    assert run_loader_eval.main(["--prediction_file", str(out), "--output_dir", str(tmp_path / "cmp"),
                                 "--n_boot", "200"]) == 0
    printed = capsys.readouterr().out
    comp = _comparison(tmp_path / "cmp")
    heads = {m["name"]: m["headline"]["accuracy"]["value"] for m in comp["models"]}
    assert heads == {"random": pytest.approx(acc), "constant": pytest.approx(const_acc)}
    (test,) = comp["paired_tests"]
    assert test["n_pairs"] == 20 and test["test"] is not None
    assert "report.html" in printed and os.path.isfile(tmp_path / "cmp" / "report.html")


def test_mme_placeholder_run_score_compare(tmp_path, capsys):
    subtasks = ["existence", "OCR", "code_reasoning"]
    root = write_placeholder_release(QUESTIONS, str(tmp_path / "release"), subtasks=subtasks)
    out = tmp_path / "mme"
    common = ["--dataset_name", "MME", "--dataset_config", "mme", "--dataset_option", f"root={root}",
              "--dataset_option", f"subtasks=[{','.join(subtasks)}]", "--formulation", "Generation",
              "--output_dir", str(out)]
    assert run_eval.main(["--model", "constant", *common]) == 0
    const_file = _file_of(out, "constant")
    assert run_loader_eval.main(["--prediction_file", const_file]) == 0
    m = _scored(const_file)["metrics"]
    assert {s: (v["acc"], v["acc_plus"], v["score"]) for s, v in m["subtasks"].items()} == {
        s: (0.5, 0.0, 50.0) for s in subtasks}
    assert (m["perception_score"], m["cognition_score"], m["total_score"]) == (100.0, 50.0, 150.0)

    assert run_eval.main(["--model", "random", *common, "--do_eval"]) == 0
    random_total = results_of(_file_of(out, "random"))["metrics"]["total_score"]
    capsys.readouterr()
    assert run_loader_eval.main(["--prediction_file", str(out), "--n_boot", "200"]) == 0
    comp = _comparison(out)
    heads = {mod["name"]: mod["headline"]["total_score"]["value"] for mod in comp["models"]}
    assert heads == {"constant": pytest.approx(150.0), "random": pytest.approx(random_total)}
    sub = {mod["name"]: mod["breakdowns"]["subtask"] for mod in comp["models"]}
    assert {s: g["score"]["value"] for s, g in sub["constant"].items()} == {s: 50.0 for s in subtasks}
    # 20 or more images per subtask: every number has its interval
    assert all(g["score"]["low"] is not None for g in sub["random"].values())
    assert comp["paired_tests"] and comp["paired_tests"][0]["n_pairs"] == 140


def _release_pif(chat_id: str) -> dict:
    """The release CSV's mean programmatic PIF on one chat, per model column."""
    with open(RELEASE_CSV, newline="", encoding="utf-8") as f:
        rows = [r for r in csv.DictReader(f) if r["conversation id"] == chat_id]
    cols = {"Gemini 1.5 Pro": "Programmatic Instruction Following Gemini",
            "GPT-4o": "Programmatic Instruction Following GPT-4o",
            "Claude 3.5 Sonnet": "Programmatic Instruction Following Sonnet"}
    return {name: sum(float(r[c]) for r in rows) / len(rows) for name, c in cols.items()}


@pytest.mark.slow  # (quick subset: test_iwisdm_run_score_compare covers the path)
def test_mmmt_if_release_only_run_score_compare(tmp_path):
    """The issue's repro: docs/mmmt_if.md's quick run, then run_loader_eval on its directory
    (a subprocess, as a user types it); the release's models join the comparison."""
    out = tmp_path / "mmmt"
    argv = ["--model", "llava", "--model_name", "tiny", "--dataset_name", "MMMT-IF", "--dataset_config",
            "mmmt_if_release_only", "--dataset_subsample", "1", "--history", "model", "--num_samples", "2",
            "--temperature", "1.0", "--max_new_tokens", "2", "--output_dir", str(out), "--do_eval"]
    assert run_eval.main(argv) == 0
    (pred,) = prediction_files(out)
    recs = json.load(open(pred))
    (chat,) = {r["meta"]["chat_id"] for r in recs}
    own = results_of(pred)["metrics"]
    proc = subprocess.run([sys.executable, "run_loader_eval.py", "--prediction_file", f"{out}/", "--n_boot", "100"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "Error" not in proc.stderr and "Traceback" not in proc.stderr
    comp = _comparison(out)
    by_name = {m["name"]: m for m in comp["models"]}
    expected = _release_pif(chat)
    for name, value in expected.items():
        head = by_name[f"{name} (release)"]["headline"]
        assert head["pif"]["value"] == pytest.approx(value)
        assert head["pif_loose"]["value"] is None  # the release scores no loose verdicts: not a 0
        assert head["pif"]["low"] is None and head["pif"]["high"] is None  # one chat: no interval
        assert set(head) == {"pif", "pif_loose"}  # one response per turn: no PIF-1-1, no PIF-IQR-1
    (mine,) = [m for m in comp["models"] if not m["name"].endswith("(release)")]
    # the released models' rows are the same turns: each pairs with every turn of the run
    ref_tests = [t for t in comp["paired_tests"] if mine["name"] in (t["a"], t["b"])]
    assert len(ref_tests) == 3 and all((t["n_pairs"], t["n_refused"]) == (len(recs), 0) for t in ref_tests)
    assert mine["headline"]["pif"]["value"] == pytest.approx(own["pif"])
    assert mine["headline"]["pif_loose"]["value"] == pytest.approx(own["pif_loose"])
    assert _scored(pred)["metrics"]["pif"] == pytest.approx(own["pif"])
    md = open(pred[:-5] + ".results.md", encoding="utf-8").read()
    assert "| turn | n | PIF |\n" in md and "95% CI" not in md  # no second (Wald) interval
    assert "| turn 1 | 1 | pif | " in md  # the bootstrap table: one chat, so no interval


def _fake_venv(work: str) -> None:
    """A .venv as the demo leaves it, whose python is this interpreter: pip is a no-op (nothing
    is installed into the real environment) and the project counts as installed."""
    bin_dir = os.path.join(work, ".venv", "bin")
    os.makedirs(bin_dir)
    with open(os.path.join(bin_dir, "python"), "w") as f:
        f.write(f'#!/bin/sh\nif [ "$1" = -m ] && [ "$2" = pip ]; then exit 0; fi\nexec {sys.executable} "$@"\n')
    os.chmod(os.path.join(bin_dir, "python"), 0o755)
    with open(os.path.join(bin_dir, "activate"), "w") as f:
        f.write(f'export VIRTUAL_ENV="{work}/.venv"\nexport PATH="{bin_dir}:$PATH"\n')
    open(os.path.join(work, ".venv", ".project-installed"), "w").close()


@pytest.mark.slow
def test_benchmark_script_works_right_after_the_demo(tmp_path):
    """commands/iwisdm_llava.sh from a shell where `python` and `torchrun` are not the project's
    (nothing activated): it runs with the repository's .venv, as demo.sh does."""
    work = tmp_path / "clone"
    work.mkdir()
    for name in os.listdir(ROOT):
        if name not in (".git", ".venv", "output", ".pytest_cache"):
            os.symlink(os.path.join(ROOT, name), work / name)
    _fake_venv(str(work))
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME")}
    env.update(PATH="/usr/bin:/bin", OMP_NUM_THREADS="1")
    out = tmp_path / "out"
    done = subprocess.run(["bash", "commands/iwisdm_llava.sh", "--dataset_subsample", "2", "--max_new_tokens", "2",
                           "--per_gpu_eval_batch_size", "2", "--output_dir", str(out)],
                          cwd=str(work), env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    (pred,) = prediction_files(out)
    assert len(json.load(open(pred))) == 2
    assert results_of(pred)["metrics"]["num_records"] == 2


def test_mme_subsample_totals_say_what_is_missing(tmp_path, capsys):
    """A subsample's totals are not MME totals: the console, results.md and the report say beside
    each total how many subtasks are missing or incomplete."""
    subtasks = ["existence", "OCR", "code_reasoning"]
    root = write_placeholder_release(QUESTIONS, str(tmp_path / "release"), subtasks=subtasks)
    out = tmp_path / "mme"
    assert run_eval.main(["--model", "constant", "--dataset_name", "MME", "--dataset_config", "mme",
                          "--dataset_option", f"root={root}", "--dataset_option", f"subtasks=[{','.join(subtasks)}]",
                          "--dataset_subsample", "30", "--formulation", "Generation", "--output_dir", str(out),
                          "--do_eval"]) == 0
    printed = capsys.readouterr().out
    assert "| perception_score | 100.0000 | 8 of 10 subtasks missing, 2 incomplete |" in printed
    assert "| total_score | 150.0000 | 11 of 14 subtasks missing, 3 incomplete |" in printed
    pred = _file_of(out, "constant")
    md = open(pred[:-5] + ".results.md").read()
    assert "| **cognition** | 3 of 4 subtasks missing, 1 incomplete |" in md
    comp = open(os.path.join(pred[:-5] + ".report", "comparison.md")).read()
    assert "| 150.0 (11 of 14 subtasks missing, 3 incomplete) |" in comp  # every image alike: no interval
