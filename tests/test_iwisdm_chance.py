"""iWISDM honest chance: the reported chance is what the `random` baseline actually scores.

The paper defines chance as "randomly guessing one of the applicable actions". The builder
offers the applicable answers (SingleChoice options, Generation likelihood candidates) and
the metric reports, per sample, 1 / the number offered. The random baseline is run through
the library (build_dataset -> model interface -> metrics.evaluate), as run_eval does.
"""
from __future__ import annotations

import math
from collections import Counter

import pytest

from reform_eval.build import build_dataset
from reform_eval.build.iwisdm.builder import IWISDMBuilder, answer_types
from reform_eval.build.iwisdm.instructions import InstructionParser
from reform_eval.build.iwisdm.stimuli import LOCATIONS, procedural_set
from reform_eval.metrics import evaluate
from reform_eval.metrics.single_choice import argmax, reduce_scores
from reform_eval.models import get_model
from reform_eval.utils.errors import ReformError
from reform_eval.utils.predictions import make_record

PRESETS = ("low", "medium", "high", "single_frame_location", "single_frame_category")
N_TRIALS = 300
#: two-sided 99.9% normal band: 20 (preset, formulation, method) checks stay well inside it by luck
Z = 3.29


def run_random(samples, formulation, method, seed=0):
    interface, _ = get_model("random", {"seed": seed})
    out = interface.forward(method, samples, [None] * len(samples))
    records = []
    for s, o in zip(samples, out):
        if method == "likelihood":
            red = reduce_scores([c[0] for c in o], [c[1] for c in o], "sum")
            records.append(make_record(s, argmax(red), scores=o))
        else:
            records.append(make_record(s, o))
    return evaluate(records, formulation, method)


def random_within_chance(res):
    """|accuracy - chance| within Z standard errors of the Bernoulli(chance_i) mean."""
    per = res["per_sample"]
    chances = [p["chance"] for p in per]
    sd = math.sqrt(sum(c * (1 - c) for c in chances)) / len(chances)
    acc, chance = res["metrics"]["accuracy"], res["metrics"]["chance"]
    return abs(acc - chance) <= Z * sd, acc, chance, sd


@pytest.mark.parametrize("formulation,method", [("SingleChoice", "generation"), ("SingleChoice", "likelihood"),
                                                ("Generation", "generation"), ("Generation", "likelihood")])
@pytest.mark.parametrize("preset", PRESETS)
def test_random_baseline_matches_reported_chance(preset, formulation, method):
    samples, _ = build_dataset("iWISDM", formulation, {"preset": preset, "n_trials": N_TRIALS}, seed=0,
                               inference_method=method)
    res = run_random(samples, formulation, method)
    ok, acc, chance, sd = random_within_chance(res)
    assert ok, f"{preset} {formulation}/{method}: random {acc:.3f} vs reported chance {chance:.3f} (sd {sd:.3f})"
    assert res["metrics"]["num_records"] == N_TRIALS
    if preset != "high":  # boolean questions only: chance is exactly 1/2 everywhere
        assert chance == 0.5 and {p["chance"] for p in res["per_sample"]} == {0.5}


def test_high_chance_is_per_sample_and_below_the_old_one():
    """The exact per-sample chance on `high`, and today's 14-option form under `options: all`."""
    s, _ = build_dataset("iWISDM", "SingleChoice", {"preset": "high", "n_trials": N_TRIALS}, seed=0)
    sizes = Counter(len(x["answer_options"]) for x in s)
    assert set(sizes) <= {2, 4, 6, 8, 10, 12} and sizes[2] > 0 and len(sizes) > 2
    res = run_random(s, "SingleChoice", "generation")
    assert res["metrics"]["chance"] == pytest.approx(sum(n / k for k, n in sizes.items()) / N_TRIALS)
    # breakdown chance = mean of its samples' 1/len(options)
    for rt, row in res["metrics"]["by"]["response_type"].items():
        grp = [1 / len(x["answer_options"]) for x in s if x["meta"]["response_type"] == rt]
        assert row["chance"] == pytest.approx(sum(grp) / len(grp)) and row["n"] == len(grp)
    # options: all - every question offers the 14 answers; the random baseline falls to 1/14
    s_all, _ = build_dataset("iWISDM", "SingleChoice", {"preset": "high", "n_trials": N_TRIALS, "options": "all"},
                             seed=0)
    assert {len(x["answer_options"]) for x in s_all} == {14}
    res_all = run_random(s_all, "SingleChoice", "generation")
    assert res_all["metrics"]["chance"] == pytest.approx(1 / 14)
    assert random_within_chance(res_all)[0]
    # the failure this fixes: a chance column of ~0.40 beside a random baseline near 1/14
    assert res_all["metrics"]["accuracy"] < 0.15 < res["metrics"]["accuracy"]


def test_applicable_answers_follow_the_question():
    """Boolean questions offer true/false; a Switch offers the answers of both branches."""
    parser = InstructionParser(procedural_set().categories)
    assert answer_types("observe object 1, delay, observe object 2, location of object 2 equals "
                        "location of object 1?", parser) == ["bool"]
    assert answer_types("observe object 1, observe object 2, if category of object 2 equals category of "
                        "object 1, then location of object 2? else category of object 1?", parser) == \
        ["category", "location"]
    assert answer_types("observe object 1, observe object 2, if category of object 2 equals category of "
                        "object 1, then location of object 2? else location of object 1 equals top left?",
                        parser) == ["bool", "location"]
    s, _ = build_dataset("iWISDM", "Generation", {"preset": "high", "n_trials": 60}, seed=3)
    cats = list(procedural_set().categories)
    for x in s:
        offered = x["candidates"]
        assert x["meta"]["applicable_answers"] == offered and x["answer"] in offered
        types = answer_types(x["meta"]["instruction"], parser)
        want = (["true", "false"] if "bool" in types else []) + \
            ([v for v in x["meta"]["answer_vocabulary"] if v in LOCATIONS] if "location" in types else []) + \
            (cats if "category" in types else [])
        assert offered == want
        # the Generation prompt keeps the paper's full answer list
        assert "answers: true, false, bottom right, bottom left, top left, top right, benches" in x["question"]


def test_preset_list_gives_one_row_per_complexity():
    cfg = {"preset": ["low", "medium", "high"], "n_trials": 20}
    s, _ = build_dataset("iWISDM", "SingleChoice", cfg, seed=0)
    assert len(s) == 60 and len({x["sample_id"] for x in s}) == 60
    assert Counter(x["meta"]["complexity"] for x in s) == {"low": 20, "medium": 20, "high": 20}
    # each preset's trials are the ones its own config gives (same ids, instructions, answers)
    one, _ = build_dataset("iWISDM", "SingleChoice", {"preset": "medium", "n_trials": 20}, seed=0)
    mid = [x for x in s if x["meta"]["complexity"] == "medium"]
    assert [(x["sample_id"], x["meta"]["instruction"]) for x in mid] == \
        [(x["sample_id"], x["meta"]["instruction"]) for x in one]
    res = run_random(s, "SingleChoice", "generation")
    rows = res["metrics"]["by"]["complexity"]
    assert list(rows) == ["low", "medium", "high"] and all(r["n"] == 20 for r in rows.values())
    table = res["tables"]["iWISDM accuracy by complexity"].splitlines()
    assert [line.split("|")[1].strip() for line in table[2:]] == ["low", "medium", "high"]
    with pytest.raises(ReformError, match=r"field 'preset'.*listed twice"):
        build_dataset("iWISDM", "SingleChoice", {"preset": ["low", "low"], "n_trials": 2})
    with pytest.raises(ReformError, match=r"field 'preset'.*'extreme'.*valid names"):
        build_dataset("iWISDM", "SingleChoice", {"preset": ["low", "extreme"], "n_trials": 2})


@pytest.mark.parametrize("key,value,form", [
    ("n_trials", "10", "a positive integer"), ("n_trials", 0, "a positive integer"),
    ("n_trials", True, "a positive integer"), ("preset", 5, "a preset name"), ("preset", [], "a preset name"),
    ("features", "location", "a list"), ("features", [3], "a list"), ("fixation", "yes", "true .*, .all. or false"),
    ("n_delay", [1, -2], "an integer >= 0"), ("n_distractors", 7, "an integer 0..3"),
    ("options", "some", "applicable or all"),
    ("allow_pickle", "true", "true or false"), ("stim_dir", ["a"], "a path"), ("n_examples", 5, "an integer 0..3"),
    ("seed", 1.5, "an integer"), ("check_answers", "no", "true or false"),
    # issue 31 class 3: every number bounded (a trillion trials, a delay of a billion frames)
    ("n_trials", 10 ** 12, "a positive integer"), ("n_delay", 10 ** 9, "an integer >= 0"),
    ("n_delay", [1, 10 ** 9], "an integer >= 0"),
])
def test_wrong_typed_options_are_one_line_errors(tmp_path, key, value, form):
    cfg = {"preset": "low", "n_trials": 2, key: value}
    with pytest.raises(ReformError, match=rf"^<options>: field '{key}': must be {form}.*got") as e:
        build_dataset("iWISDM", "SingleChoice", cfg)
    assert "\n" not in str(e.value)
    # the same from a YAML file names the file
    path = tmp_path / "iwisdm_typed.yaml"
    base = ("preset: low\n" if key != "preset" else "") + ("n_trials: 2\n" if key != "n_trials" else "")  # no key twice
    path.write_text(base + (f"{key}: {value!r}\n".replace("'", '"') if isinstance(value, str) else f"{key}: {value}\n"))
    with pytest.raises(ReformError, match=rf"iwisdm_typed\.yaml: field '{key}'"):
        build_dataset("iWISDM", "SingleChoice", str(path))


def test_unknown_feature_and_option_names_declared():
    with pytest.raises(ReformError, match=r"field 'features'.*unknown feature 'colour'"):
        build_dataset("iWISDM", "SingleChoice", {"preset": "low", "n_trials": 2, "features": ["colour"]})
    # every key the builder reads is declared (and nothing else)
    import inspect
    import re
    import reform_eval.build.iwisdm.builder as mod
    src = inspect.getsource(mod)
    read = set(re.findall(r'(?:config\.get\(|config\[|require\(|_opt\()"(\w+)"', src))
    assert read == set(IWISDMBuilder.option_names) == {
        "preset", "n_trials", "seed", "stim_dir", "stim_split", "allow_pickle", "n_distractors", "fixation",
        "n_delay", "n_frames", "features", "n_examples", "trial_dir", "options", "check_answers", "shape"}
