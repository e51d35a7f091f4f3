"""SingleChoice scoring: mark parsing, likelihood reduction, instability, bad records."""
import math

import pytest

from reform_eval.metrics import evaluate
from reform_eval.metrics.single_choice import instability, parse_choice, reduce_scores
from reform_eval.utils.errors import ReformError

OPTS = ["yes", "no", "maybe"]
MARKS = ["A", "B", "C"]


@pytest.mark.parametrize("response,expected", [
    ("(B)", 1), ("B", 1), ("b.", 1), ("The answer is (C) maybe.", 2), ("C) maybe", 2),
    ("(D) none", None), ("(D) or (A)", 0), ("No.", 1), ("  MAYBE ", 2), ("I think so", None),
    ("", None), ("Answer: B because", None), ("(a)", 0),
])
def test_parse_choice(response, expected):
    assert parse_choice(response, MARKS, OPTS) == expected


def test_number_marks():
    assert parse_choice("(2)", ["1", "2"], ["x", "y"]) == 1
    assert parse_choice("12)", ["1", "2"], ["x", "y"]) is None


def test_number_marks_above_99():
    marks = [str(i + 1) for i in range(120)]
    opts = [f"option {i + 1}" for i in range(120)]
    assert parse_choice("(100)", marks, opts) == 99
    assert parse_choice("100", marks, opts) == 99
    assert parse_choice("I pick 120) here", marks, opts) == 119
    assert parse_choice("(121)", marks, opts) is None
    assert parse_choice(" (B) : ", MARKS, OPTS) == 1 and parse_choice("B..", MARKS, OPTS) is None


@pytest.mark.parametrize("reply,expected", [
    ("A" + " " * 150_000, 0), ("A" + " " * 150_000 + "x", None), ("(" * 200_000 + "B", None),
    ("1" * 200_000 + ")", None), ("B" + "\n" * 200_000 + ".", 1), ("A)" * 100_000, 0),
])
def test_parsing_is_linear_on_degenerate_replies(reply, expected):
    import time
    t0 = time.process_time()
    assert parse_choice(reply, MARKS, OPTS) == expected
    assert time.process_time() - t0 < 0.5  # the old lone-mark pattern backtracked for ~50 s on the second


def test_reduction():
    assert reduce_scores([-2.0, -3.0], [1, 3], "sum") == [-2.0, -3.0]
    assert reduce_scores([-2.0, -3.0], [1, 3], "mean") == [-2.0, -1.0]


def rec(sid, dup, pred, answer=0, options=OPTS, **kw):
    return {"sample_id": sid, "dup_index": dup, "benchmark": "custom", "formulation": "SingleChoice",
            "answer_options": options, "option_marks": MARKS[:len(options)], "answer": answer,
            "prediction": pred, **kw}


def test_generation_accuracy_hit_rate_instability():
    records = [rec("a", 0, "(A)", instruct="one"), rec("a", 1, "(A)", instruct="two"),
               rec("b", 0, "(B)", answer=1, instruct="one"), rec("b", 1, "nonsense", answer=1, instruct="two")]
    res = evaluate(records, "SingleChoice", "generation", eval_stability=True)
    m = res["metrics"]
    assert m["accuracy"] == 0.75 and m["format_hit_rate"] == 0.75
    assert math.isclose(m["instability"], (0 + math.log(2)) / 2)
    assert res["per_sample"][3]["extracted"] is None


def test_instability_uses_option_text_not_position():
    per = [{"sample_id": "x", "chosen_text": "yes"}, {"sample_id": "x", "chosen_text": "yes"},
           {"sample_id": "x", "chosen_text": "no"}]
    p = [2 / 3, 1 / 3]
    assert math.isclose(instability(per), -sum(q * math.log(q) for q in p))


def test_likelihood_sum_vs_mean():
    r = rec("a", 0, 0, answer=1, candidate_logprobs=[-2.0, -3.0, -9.0], candidate_num_tokens=[1, 3, 3])
    assert evaluate([r], "SingleChoice", "likelihood", likelihood_reduction="sum")["metrics"]["accuracy"] == 0.0
    assert evaluate([r], "SingleChoice", "likelihood", likelihood_reduction="mean")["metrics"]["accuracy"] == 1.0


@pytest.mark.parametrize("bad,field", [
    ({"answer": 7}, "answer"), ({"prediction": 3}, "prediction"),
])
def test_bad_records_name_field(bad, field):
    r = rec("a", 0, "(A)")
    r.update(bad)
    with pytest.raises(ReformError, match=f"record 0: field '{field}'"):
        evaluate([r], "SingleChoice", "generation", file="p.json")


def test_missing_field():
    r = rec("a", 0, "(A)")
    del r["prediction"]
    with pytest.raises(ReformError, match="p.json: record 0: field 'prediction': missing"):
        evaluate([r], "SingleChoice", "generation", file="p.json")


def test_generation_match_vocabulary_and_likelihood():
    from reform_eval.metrics.single_choice import score_generation_match
    base = {"benchmark": "custom", "formulation": "Generation", "meta": {"vocab": ["true", "false"]},
            "candidates": ["true", "false"], "answer": "true"}
    recs = [dict(base, sample_id="a", prediction="True."), dict(base, sample_id="b", prediction="maybe"),
            dict(base, sample_id="c", prediction=" FALSE")]
    per = score_generation_match(recs, "generation", vocabulary_key="vocab")
    assert [p["correct"] for p in per] == [True, False, False]
    assert [p["extracted"] for p in per] == ["True.", None, " FALSE"]
    m = evaluate(recs, "Generation", "generation")["metrics"]
    assert m["accuracy"] == pytest.approx(1 / 3) and m["format_hit_rate"] == 1.0  # no vocabulary: all parsed
    lk = dict(base, sample_id="d", prediction=1, candidate_logprobs=[-1.0, -0.5], candidate_num_tokens=[1, 1])
    assert evaluate([lk], "Generation", "likelihood")["metrics"]["accuracy"] == 0.0
    with pytest.raises(ReformError, match="record 0: field 'prediction'"):
        evaluate([dict(lk, candidate_logprobs=None, candidate_num_tokens=None, prediction=5)],
                 "Generation", "likelihood")


def test_likelihood_on_a_choice_item_is_scored_by_index_not_text():
    """A choice item run as Generation carries its right option's index: the likelihood pick is
    right when it is that index, never because its text normalises like the answer's."""
    base = {"benchmark": "custom", "formulation": "Generation", "candidates": ["Yes", "yes!"], "answer": "yes!",
            "answer_index": 1, "candidate_num_tokens": [1, 1], "prediction": 0}
    recs = [dict(base, sample_id="a", candidate_logprobs=[-0.1, -2.0]),   # picks 0: wrong
            dict(base, sample_id="b", candidate_logprobs=[-2.0, -0.1])]   # picks 1: right
    per = evaluate(recs, "Generation", "likelihood")["per_sample"]
    assert [p["correct"] for p in per] == [False, True]


def test_candidates_equal_after_normalisation_are_refused_when_scored():
    from reform_eval.evaluation.reporting.scoring import score_records
    rec = {"sample_id": "a", "benchmark": "custom", "formulation": "Generation", "inference_method": "generation",
           "candidates": ["31", "3.1"], "answer": "3.1", "answer_index": 1, "prediction": "31"}
    with pytest.raises(ReformError, match="record 0: field 'candidates': options 0 '31' and 1 '3.1' are equal"):
        score_records([rec], write=False, quiet=True)
