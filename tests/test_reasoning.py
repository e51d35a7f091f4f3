"""--strip_reasoning: reasoning blocks removed before scoring, in linear time, raw text kept."""
import time

from reform_eval.metrics.reasoning import strip_reasoning, strip_reasoning_records


def test_blocks_are_removed_and_the_answer_kept():
    assert strip_reasoning("<think>Is it A? Maybe B.</think> (B)") == "(B)"
    assert strip_reasoning("<THINK>x</THINK>\nYes") == "Yes"
    assert strip_reasoning("A <thinking>hmm</thinking>B<reasoning>r</reasoning> C") == "A B C"
    assert strip_reasoning("<think>never closed, so no answer") == ""
    assert strip_reasoning("the template opened it</think> Yes") == "Yes"
    assert strip_reasoning("No reasoning here.") == "No reasoning here."


def test_records_keep_the_raw_response():
    recs = [{"prediction": "<think>a</think>Yes", "predictions": ["<think>a</think>Yes", "No"]}, {"prediction": 2}]
    out = strip_reasoning_records(recs)
    assert out[0]["prediction"] == "Yes" and out[0]["raw_prediction"] == "<think>a</think>Yes"
    assert out[0]["predictions"] == ["Yes", "No"] and out[1] == {"prediction": 2}
    assert recs[0]["prediction"] == "<think>a</think>Yes"  # the input is not changed


def test_linear_time_on_degenerate_text():
    for text in ("<think>" * 200_000, "<think>x</think>" * 100_000, "</think>" * 200_000, "<" * 1_000_000):
        t0 = time.process_time()  # CPU time: what a quadratic scan spends, whatever the machine's load
        strip_reasoning(text)
        assert time.process_time() - t0 < 2.0


def test_strip_reasoning_flag_scores_the_answer_only(tmp_path, capsys):
    import json
    import os

    from reform_eval import run_eval
    from reform_eval import run_loader_eval
    from tests.conftest import prediction_files, write_custom_dataset
    cfg = write_custom_dataset(str(tmp_path / "data"), n=8, formulation="Generation")
    out = tmp_path / "out"
    assert run_eval.main(["--model", "random", "--dataset_name", "custom", "--dataset_config", cfg,
                          "--formulation", "Generation", "--output_dir", str(out)]) == 0
    (pred,) = prediction_files(out)
    recs = json.load(open(pred))
    for r in recs:  # a reasoning model: thinks aloud about a wrong colour, then answers right
        r["prediction"] = f"<think>Could it be purple? No.</think> {r['answer']}"
    with open(pred, "w") as f:
        json.dump(recs, f)
    scores = {}
    for flag in ([], ["--strip_reasoning"]):
        assert run_loader_eval.main(["--prediction_file", pred, "--output_dir", str(tmp_path / f"s{len(flag)}"),
                                     *flag]) == 0
        (res,) = [n for n in os.listdir(tmp_path / f"s{len(flag)}") if n.endswith(".results.json")]
        scores[bool(flag)] = json.load(open(tmp_path / f"s{len(flag)}" / res))["metrics"]["accuracy"]
    assert scores == {False: 0.0, True: 1.0}
