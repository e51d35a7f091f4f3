"""per_sample entries: every metric carries the fields a verdict needs, with exact values, and
one ``pandas.read_json`` of them is an analysable table."""
from __future__ import annotations

import json

import pytest

from reform_eval.metrics import evaluate

COMMON = ["sample_id", "dup_index", "cluster", "question", "answer_text", "prediction", "extracted"]


def _iwisdm(sid, dup, pred, answer, complexity, rtype="bool"):
    opts = ["true", "false"] if rtype == "bool" else ["top left", "top right", "bottom left", "bottom right"]
    return {"sample_id": sid, "dup_index": dup, "benchmark": "iWISDM", "formulation": "SingleChoice",
            "inference_method": "generation", "question": f"Q {sid}?", "answer_options": opts,
            "option_marks": ["A", "B", "C", "D"][:len(opts)], "answer": answer, "prediction": pred,
            "meta": {"complexity": complexity, "feature_group": "category", "response_type": rtype,
                     "n_and": 1, "n_or": 0, "n_is_same": 2, "n_not_same": 0, "n_switch": 0, "n_delay": 3,
                     "n_stimuli": 2, "n_distractors": 0, "chance": 1 / len(opts)}}


def test_iwisdm_per_sample_fields():
    recs = [_iwisdm("t0", 0, "(A)", 0, "low"), _iwisdm("t0", 1, "(B)", 0, "low"),
            _iwisdm("t1", 0, "nothing", 2, "high", "location")]
    ps = evaluate(recs, "SingleChoice", "generation")["per_sample"]
    assert ps[0] == {"sample_id": "t0", "dup_index": 0, "cluster": "t0", "question": "Q t0?",
                     "answer_text": "true", "prediction": "(A)", "extracted": 0, "chosen_text": "true",
                     "correct": True, "complexity": "low", "feature_group": "category", "response_type": "bool",
                     "n_and": 1, "n_or": 0, "n_is_same": 2, "n_not_same": 0, "n_switch": 0, "n_delay": 3,
                     "n_stimuli": 2, "n_distractors": 0, "chance": 0.5}
    assert (ps[1]["cluster"], ps[1]["dup_index"], ps[1]["correct"], ps[1]["chosen_text"]) == ("t0", 1, False, "false")
    assert (ps[2]["answer_text"], ps[2]["extracted"], ps[2]["correct"], ps[2]["complexity"], ps[2]["chance"]) == \
        ("bottom left", None, False, "high", 0.25)


def test_generic_generation_answer_text_and_prediction():
    recs = [{"sample_id": "g1", "question": "Colour?", "answer": "Red", "prediction": "red.",
             "answer_text": "Red"},
            {"sample_id": "g2", "dup_index": 2, "question": "Colour?", "answer": "blue", "prediction": "green"}]
    ps = evaluate(recs, "Generation", "generation")["per_sample"]
    assert [{k: p[k] for k in COMMON + ["correct"]} for p in ps] == [
        {"sample_id": "g1", "dup_index": 0, "cluster": "g1", "question": "Colour?", "answer_text": "Red",
         "prediction": "red.", "extracted": "red.", "correct": True},
        {"sample_id": "g2", "dup_index": 2, "cluster": "g2", "question": "Colour?", "answer_text": "blue",
         "prediction": "green", "extracted": "green", "correct": False}]


def test_mme_per_sample_cluster_is_the_image():
    def rec(k, gt, pred, sub="OCR"):
        return {"sample_id": f"{sub}/0001.jpg/{k}", "benchmark": "MME", "formulation": "Generation",
                "question": f"Is it {k}? Please answer yes or no.", "answer": gt, "prediction": pred,
                "candidates": ["Yes", "No"], "meta": {"subtask": sub, "image": "0001.jpg", "question_index": k}}
    recs = [rec(0, "Yes", "Yes, it is."), rec(1, "No", "Maybe"), rec(0, "No", "no", "code_reasoning")]
    ps = evaluate(recs, "Generation", "generation")["per_sample"]
    assert ps[0] == {"sample_id": "OCR/0001.jpg/0", "dup_index": 0, "cluster": "OCR/0001.jpg",
                     "question": "Is it 0? Please answer yes or no.", "answer_text": "Yes",
                     "prediction": "Yes, it is.", "extracted": "yes", "item_key": "mme:0877206bdfc40c66",
                     "subtask": "OCR", "category": "perception",
                     "image": "0001.jpg", "question_index": 0, "gt": "yes", "parsed": "yes", "correct": True}
    assert (ps[1]["cluster"], ps[1]["extracted"], ps[1]["correct"]) == ("OCR/0001.jpg", "other", False)
    assert (ps[2]["cluster"], ps[2]["category"], ps[2]["correct"]) == ("code_reasoning/0001.jpg", "cognition", True)


def test_mmmt_if_per_sample_checks_with_reasons():
    recs = [{"sample_id": "c1-t02", "benchmark": "MMMT-IF", "question": "Describe it.", "answer": "Ref.",
             "prediction": "Some cats sleep. The dog has 7 bones!",
             "meta": {"chat_id": "c1", "turn": 2, "instructions": ["start_char_S", "number_odd"]}},
            {"sample_id": "c1-t01", "benchmark": "MMMT-IF", "question": "Hi.", "answer": None,
             "prediction": "", "meta": {"chat_id": "c1", "turn": 1, "instructions": ["response_length_short"]}}]
    ps = evaluate(recs, "Generation", "generation")["per_sample"]
    p = ps[0]
    assert {k: p[k] for k in COMMON} == {"sample_id": "c1-t02", "dup_index": 0, "cluster": "c1",
                                         "question": "Describe it.", "answer_text": "Ref.",
                                         "prediction": "Some cats sleep. The dog has 7 bones!",
                                         "extracted": "Some cats sleep. The dog has 7 bones!"}
    assert (p["turn"], p["num_instructions"], p["pif"]) == (2, 2, 0.5)
    assert p["checks"] == [
        {"instruction": "start_char_S", "followed": False, "followed_loose": False,
         "reason": "sentence 2 of 2 starts with 'T'"},
        {"instruction": "number_odd", "followed": True, "followed_loose": True, "reason": "odd number(s) > 5: 7"}]
    assert ps[1]["checks"] == [{"instruction": "response_length_short", "followed": False,
                                "followed_loose": False, "reason": "empty response"}]
    assert ps[1]["answer_text"] is None and ps[1]["pif"] == 0.0


def test_per_sample_reads_as_a_table(tmp_path):
    pd = pytest.importorskip("pandas")
    recs = [_iwisdm(f"t{i}", 0, "(A)" if i % 3 else "(B)", 0, ["low", "high"][i % 2]) for i in range(6)]
    path = tmp_path / "x.per_sample.json"
    path.write_text(json.dumps(evaluate(recs, "SingleChoice", "generation")["per_sample"]))
    df = pd.read_json(path)
    assert len(df) == 6 and set(COMMON + ["correct", "complexity", "chance"]) <= set(df.columns)
    assert df.groupby("complexity")["correct"].mean().to_dict() == {"high": 2 / 3, "low": 2 / 3}
