"""What the console says (issue 32, part 4): a resumed run says so, a comparison prints its
headline table and the path to the rest, hints name the command actually typed, and the format
hit rate of a run that generated nothing is n/a, not a number."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.conftest import ROOT, prediction_files, write_custom_dataset


def _cli(args, cwd=ROOT, module=False) -> subprocess.CompletedProcess:
    head = [sys.executable, "-m", "reform_eval.run_eval"] if module else [sys.executable, "run_eval.py"]
    return subprocess.run(head + list(args), cwd=cwd, capture_output=True, text=True, timeout=300)


def _run_args(cfg: str, out, model: str = "random") -> list:
    return ["--model", model, "--dataset_name", "custom", "--dataset_config", cfg, "--output_dir", str(out)]


def test_a_resumed_run_says_so_on_the_console(tmp_path):
    cfg = write_custom_dataset(str(tmp_path / "data"))
    out = tmp_path / "out"
    first = _cli(_run_args(cfg, out))
    assert first.returncode == 0, first.stderr
    assert "resumed:" not in first.stderr  # a fresh run is no resumed one
    pred = prediction_files(out)[0]
    records = json.load(open(pred))
    with open(pred, "w") as f:  # 5 of 12 done: what an interrupted run leaves to complete
        json.dump(records[:5], f)
    again = _cli(_run_args(cfg, out))
    assert again.returncode == 0, again.stderr
    assert again.stderr.splitlines() == ["resumed: 5 of 12 already done"]
    assert json.load(open(pred)) == records


def test_a_comparison_prints_its_headline_table_and_the_path_to_the_rest(tmp_path):
    cfg = write_custom_dataset(str(tmp_path / "data"))
    for model in ("random", "constant"):
        assert _cli(_run_args(cfg, tmp_path / model, model)).returncode == 0
    files = [prediction_files(tmp_path / m)[0] for m in ("random", "constant")]
    done = subprocess.run([sys.executable, "run_loader_eval.py", "--prediction_file", *files, "--output_dir",
                           str(tmp_path / "cmp"), "--n_boot", "50"], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.strip().splitlines()
    assert lines[0] == ("## custom comparison: Headline metrics (95% percentile interval, 50 cluster-bootstrap "
                        "resamples (seed 0))")
    assert lines[2].startswith("| model | records | clusters | accuracy | format hit rate |")
    assert len(lines) == 2 + 2 + 2 + 2  # title, blank, header, rule, two models, blank, the paths
    assert lines[-1] == (f"comparison of 2 runs: {tmp_path}/cmp/report.html (every table: "
                         f"{tmp_path}/cmp/comparison.md)")
    assert "Paired tests" not in done.stdout and "Paired tests" in open(tmp_path / "cmp" / "comparison.md").read()


@pytest.mark.parametrize("argv0,expected", [
    ("/opt/venv/bin/run_eval", "run_loader_eval"),                              # the console script
    ("run_eval.py", "python run_loader_eval.py"),                               # a clone, from its root
    ("../clone/run_eval.py", "python ../clone/run_loader_eval.py"),             # a clone, the folder as typed
    (os.path.join(ROOT, "reform_eval", "run_eval.py"), "python -m reform_eval.run_loader_eval"),  # python -m
    ("", "python -m reform_eval.run_loader_eval"),                              # a notebook
])
def test_hints_name_the_command_as_it_was_started(argv0, expected):
    from reform_eval.utils.invocation import command_for
    assert command_for("run_loader_eval", argv0) == expected


def test_the_score_hint_after_a_run_names_the_command_used(tmp_path):
    cfg = write_custom_dataset(str(tmp_path / "data"))
    for module, expected in ((False, "python run_loader_eval.py"), (True, "python -m reform_eval.run_loader_eval")):
        out = tmp_path / f"out{module}"
        done = _cli(_run_args(cfg, out), module=module)
        assert done.returncode == 0, done.stderr
        hint = done.stdout.strip().splitlines()[-1]
        assert hint == (f"to score them: {expected} --prediction_file {prediction_files(out)[0]}  (or re-run "
                        "this command with --do_eval)"), hint


def test_format_hit_rate_is_undefined_when_nothing_was_generated(tmp_path):
    from reform_eval.evaluation.reporting.scoring import loader_eval
    records = [{"sample_id": f"q{i}", "benchmark": "custom", "formulation": "Generation",
                "inference_method": "generation", "question": "Which colour?", "answer": "red", "prediction": p}
               for i, p in enumerate(["", "  ", ""])]
    path = tmp_path / "empty.json"
    path.write_text(json.dumps(records))
    res = loader_eval(str(path), quiet=True)
    assert res["metrics"]["format_hit_rate"] is None and res["metrics"]["accuracy"] == 0.0
    done = subprocess.run([sys.executable, "run_loader_eval.py", "--prediction_file", str(path)], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "| format_hit_rate | n/a |" in done.stdout.splitlines()
    # one response generated, two empty ones: a rate over every record, the empty ones misses
    records[0]["prediction"] = "red"
    path.write_text(json.dumps(records))
    m = loader_eval(str(path), quiet=True)["metrics"]
    assert m["format_hit_rate"] == pytest.approx(1 / 3) and m["accuracy"] == pytest.approx(1 / 3)
