"""--eval_stability over identical copies is refused, like over one copy: instability is the
spread of answers across duplicates that differ (option order, marks, instruction), and copies
that differ in nothing read 0 by construction. The check lives in the metrics
(``metrics.single_choice.check_stability``), so run_eval, run_loader_eval and a library call
all refuse alike."""
from __future__ import annotations

import json

import pytest

from reform_eval import run_eval
from reform_eval import run_loader_eval
from reform_eval.metrics import evaluate
from reform_eval.metrics.mme import mme_metric
from reform_eval.metrics.single_choice import stability_problem
from tests.conftest import prediction_files
from tests.report_fixtures import mme_records
from reform_eval.utils.errors import ReformError

OPTS = ["yes", "no", "maybe"]


def rec(sid, dup, pred="(A)", options=OPTS, marks="ABC", instruct="Choose.", answer=0):
    return {"sample_id": sid, "dup_index": dup, "benchmark": "custom", "formulation": "SingleChoice",
            "inference_method": "generation", "instruct": instruct, "question": f"{sid}?",
            "answer_options": list(options), "option_marks": list(marks), "answer": answer, "prediction": pred}


def test_identical_copies_are_refused_by_every_metric():
    same = [rec(s, d) for s in ("a", "b") for d in range(3)]
    with pytest.raises(ReformError, match="identical copies"):
        evaluate(same, "SingleChoice", "generation", eval_stability=True)
    with pytest.raises(ReformError, match="needs duplicates"):
        evaluate([rec("a", 0), rec("b", 0)], "SingleChoice", "generation", eval_stability=True)
    # without --eval_stability the same records score as before
    assert evaluate(same, "SingleChoice", "generation")["metrics"]["accuracy"] == 1.0
    mme = mme_records()
    for r in mme:
        r["dup_index"] = 0
    copies = mme + [dict(r, dup_index=1) for r in mme]
    with pytest.raises(ReformError, match="identical copies"):
        mme_metric(copies, eval_stability=True)


@pytest.mark.parametrize("change", [dict(options=["no", "yes", "maybe"], answer=1), dict(marks="abc"),
                                    dict(instruct="Pick one.")])
def test_copies_that_differ_are_measured(change):
    records = [rec("a", 0), rec("a", 1, **change), rec("b", 0), rec("b", 1)]
    assert stability_problem(records) is None
    res = evaluate(records, "SingleChoice", "generation", eval_stability=True)
    assert "instability" in res["metrics"]


def _run(cfg, out, *extra):
    return run_eval.main(["--model", "random", "--dataset_name", "custom", "--dataset_config", cfg,
                          "--formulation", "SingleChoice", "--output_dir", str(out), "--dataset_duplication", "2",
                          "--shuffle_options", "false", "--random_instruct", "false", "--seed", "5", *extra])


def test_run_eval_and_loader_refuse_identical_copies(custom_cfg, tmp_path, capsys):
    out = tmp_path / "out"
    assert _run(custom_cfg, out) == 0  # predictions without scoring are fine
    (pred,) = [f for f in prediction_files(out) if "custom_" in f]
    recs = json.load(open(pred))
    assert {r["dup_index"] for r in recs} == {0, 1}
    capsys.readouterr()
    assert _run(custom_cfg, out, "--do_eval", "--eval_stability") == 2
    assert "identical copies" in capsys.readouterr().err
    assert run_loader_eval.main(["--prediction_file", pred, "--eval_stability", "--output_dir",
                                 str(tmp_path / "re")]) == 2
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(err) == 1 and "identical copies" in err[0] and pred in err[0]
    # random marks make the copies differ: instability is measured
    out2 = tmp_path / "marks"
    assert _run(custom_cfg, out2, "--option_mark", "random", "--do_eval", "--eval_stability") == 0
