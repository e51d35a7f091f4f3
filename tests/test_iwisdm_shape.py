"""iWISDM trials shaped as the paper and the original iwisdm 0.1.3 (issue 11 section 3).

Fixtures in tests/data/ come from the original package (``python bench/iwisdm_shape.py
--write-fixtures tests/data``): its shape distributions over 2,000 accepted trials per preset,
and a sample of its trials, instructions and answers verbatim.
"""
from __future__ import annotations

import json
import os
import random
import re
from collections import Counter

import pytest

from bench.iwisdm_shape import FEATURES, distribution, ours, shape_of, tv_distance
from reform_eval.build.iwisdm import InstructionParser, Task, TrialGenerator
from reform_eval.build.iwisdm.graph import load_task
from reform_eval.build.iwisdm.instructions import InstructionError
from reform_eval.build.iwisdm.operators import CONST, And, Context, GetCategory, GetLocation, IsSame, NotSame, Or, Select, Switch
from reform_eval.build.iwisdm.presets import PRESETS, SHAPES, PresetSampler, Shape, example_trials, resolve_shape
from reform_eval.build.iwisdm.stimuli import LOCATIONS, procedural_set
from reform_eval.build.iwisdm.trial import DelayProcess, Trial, _defect, fixation_frames
from reform_eval.utils.errors import ReformError
from reform_eval.utils.seeding import rng_for

STIM = procedural_set()
PARSER = InstructionParser(STIM.categories)
DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data")
LEVELS = ("low", "medium", "high")


def _trials(preset, n, shape=None, seed=0):
    sampler = PresetSampler(PRESETS[preset], STIM, shape=shape)
    picker = sampler.balanced_picker(rng_for(seed, "shape-test", preset))
    return [sampler.trial(rng_for(seed, "shape-test", preset, i), picker=picker) for i in range(n)]


def _bool_depth(op, inside=0):
    here = inside + 1 if isinstance(op, (And, Or)) else inside
    return max([here] + [_bool_depth(c, here) for c in op.children])


# -- And/Or nesting ------------------------------------------------------------------------------
def test_and_or_in_separate_clauses_by_default_nested_in_legacy():
    for preset in LEVELS:
        for task, tr in _trials(preset, 300):
            assert _bool_depth(task.root) <= 1 and "(" not in tr.instruction, tr.instruction
    nested = sum(_bool_depth(task.root) == 2 for task, _ in _trials("high", 300, shape="legacy"))
    assert nested > 100  # the earlier sampler nests in most high trials


# -- delay wording ---------------------------------------------------------------------------------
def _runs(frames):
    return len(re.findall(r"0+", "".join("1" if f else "0" for f in frames)))


def test_one_delay_per_run_of_blank_frames():
    n_long = 0
    for preset in LEVELS:
        for _, tr in _trials(preset, 200):
            assert "delay, delay" not in tr.instruction
            assert tr.instruction.count("delay") == _runs(tr.frames)
            n_long += any(len(r) > 1 for r in re.findall(r"0+", "".join("1" if f else "0" for f in tr.frames)))
            assert PARSER.evaluate(tr.instruction, tr.frames)[-1] == tr.answer
    assert n_long > 50  # runs longer than one frame do occur
    for _, tr in _trials("low", 100, shape="legacy"):
        assert tr.instruction.count("delay") == sum(not f for f in tr.frames)
    dms3 = PresetSampler(PRESETS["dms_location"], STIM, n_delay=3).trial(random.Random(0))[1]
    assert dms3.instruction.startswith("observe object 1, delay, observe object 2, ") and len(dms3.frames) == 5


# -- object reuse ----------------------------------------------------------------------------------
def test_one_getter_per_object_by_default():
    for preset in LEVELS:
        for task, tr in _trials(preset, 300):
            reads = Counter(m for m in re.findall(r"(?:location|category|identity) of object (\d+)", tr.instruction))
            assert set(reads.values()) == {1}, tr.instruction
            assert tr.meta["n_stimuli"] == len(task.selects) == len(reads)
    low = Counter(tr.meta["n_stimuli"] for _, tr in _trials("low", 1000))
    # the original: 4 objects in 82.4% of low trials (0.751 * 0.1875 / 0.1708, see DelayProcess)
    assert abs(low[4] / 1000 - 0.824) < 0.03, low
    legacy = _trials("low", 500, shape="legacy")
    shared = sum(len(t.selects) > tr.meta["n_stimuli"] for t, tr in legacy)
    assert shared > 50


def test_delay_process_matches_the_originals_formula():
    proc = DelayProcess(0.5, 4)
    # 4 objects and 2 delays: C(4, 2) orderings of 2 delays among 3 placements, each 0.5**5
    assert proc.prob(4, 2) == pytest.approx(6 / 32)
    assert proc.prob(3, 3) == pytest.approx(4 / 32)
    assert proc.prob(2, 4) == pytest.approx(1 / 16)  # capped at max_delay: the 5th step must place
    assert proc.prob(2, 5) == 0.0
    assert sum(proc.prob(4, d) for d in range(5)) == pytest.approx(1.0)
    rng = random.Random(0)
    gaps = Counter(tuple(proc.sample_gaps(4, 2, rng)) for _ in range(6000))
    assert set(gaps) == {(2, 0, 0), (0, 2, 0), (0, 0, 2), (1, 1, 0), (1, 0, 1), (0, 1, 1)}
    assert all(abs(c / 6000 - 1 / 6) < 0.02 for c in gaps.values())  # uniform below the cap
    frames = proc.frames(4, 6, random.Random(1))
    assert frames[0] == 0 and frames[-1] == 5 and len(frames) == 4


# -- constant position -----------------------------------------------------------------------------
#: a comparison written constant first: "couches not equals category of object 1"
CONST_FIRST = r"(?:^|, |if | and | or |then )(?:[a-z]+(?: [a-z]+)?) (?:not )?equals (?:location|category) of"


def test_constant_first_or_second_as_the_original():
    first = second = 0
    for preset in ("low", "medium", "single_frame_category"):
        for _, tr in _trials(preset, 400):
            text = tr.instruction
            first += len(re.findall(CONST_FIRST, text))
            second += len(re.findall(r"of object \d+ (?:not )?equals (?!location|category|identity)", text))
            assert PARSER.evaluate(tr.instruction, tr.frames)[-1] == tr.answer
    assert first > 300 and abs(first / (first + second) - 0.5) < 0.05, (first, second)
    for _, tr in _trials("single_frame_location", 100, shape="legacy"):
        assert re.fullmatch(r"observe object 1, location of object 1 (not )?equals [a-z ]+\?", tr.instruction)


def test_task_file_with_constant_first_and_two_constants_rejected():
    spec = {"nodes": [{"id": 0, "op": "NotSame"}, {"id": 1, "op": "CONST", "attr": "category", "value": "couches"},
                      {"id": 2, "op": "GetCategory"}, {"id": 3, "op": "Select"}],
            "edges": [[0, 1], [0, 2], [2, 3]]}
    task = load_task(spec)
    tr = TrialGenerator(STIM).instantiate(task, random.Random(0), n_frames=1)
    assert tr.instruction == "observe object 1, couches not equals category of object 1?"
    assert PARSER.evaluate(tr.instruction, tr.frames) == [tr.answer]
    spec["nodes"][2] = {"id": 2, "op": "CONST", "attr": "category", "value": "cars"}
    spec["nodes"].pop()
    spec["edges"] = [[0, 1], [0, 2]]
    with pytest.raises(ReformError, match="two constants"):
        load_task(spec, where="consts.json")


# -- fixation --------------------------------------------------------------------------------------
def test_fixation_on_every_frame_but_the_response_frame():
    assert fixation_frames([None, None, "true"], True) == [True, True, False]
    assert fixation_frames([None, "false", None, "true"], "upstream") == [True, False, True, False]
    assert fixation_frames([None, "true"], "all") == [True, True]
    assert fixation_frames([None, "true"], False) == [False, False]
    with pytest.raises(ReformError, match="fixation"):
        fixation_frames([None], "sometimes")
    sampler = PresetSampler(PRESETS["low"], STIM)  # upstream fixation is the sampler's default
    _, tr = sampler.trial(random.Random(0))
    imgs = tr.render(STIM)
    centre = [im.getpixel((112, 112)) for im in imgs]
    assert centre[:-1] == [(255, 255, 255)] * (len(imgs) - 1) and centre[-1] != (255, 255, 255)
    tr.fixation = "all"
    assert tr.render(STIM)[-1].getpixel((112, 112)) == (255, 255, 255)
    back = Trial.from_dict(json.loads(json.dumps(tr.to_dict())))
    assert back.fixation == "all"


# -- defects -------------------------------------------------------------------------------------
def test_defect_checks_catch_repeats_and_fixed_branches():
    spaces = {"bool": (True, False), "location": LOCATIONS, "category": STIM.categories}
    s = Select()
    rep = Task(And(IsSame(GetLocation(s), CONST(attr="location", value="bottom right")),
                   IsSame(GetLocation(s), CONST(attr="location", value="bottom right"))))
    assert _defect(rep, Context({s.uid: 1}, random.Random(0), spaces), {}) == "repeated comparison"
    a, b = Select(), Select()
    swapped = Task(Or(IsSame(GetCategory(a), GetCategory(b)), NotSame(GetCategory(b), GetCategory(a))))
    assert _defect(swapped, Context({a.uid: 1, b.uid: 2}, random.Random(0), spaces), {}) == "repeated comparison"
    s1, s2 = Select(), Select()
    fixed = Task(Switch(IsSame(GetLocation(s1), CONST(attr="location", value="top left")), GetLocation(s1),
                        GetLocation(s2)))
    ctx = Context({s1.uid: 1, s2.uid: 2}, random.Random(0), spaces)
    assert _defect(fixed, ctx, {}) == "branch fixed by its condition"
    ok = Task(Switch(IsSame(GetLocation(s1), CONST(attr="location", value="top left")), GetCategory(s1),
                     GetLocation(s2)))
    assert _defect(ok, Context({s1.uid: 1, s2.uid: 2}, random.Random(0), spaces), {}) is None


def _walk_ast(node):
    yield node
    for c in node[1:]:
        if isinstance(c, tuple):
            yield from _walk_ast(c)
        elif isinstance(c, list):
            for x in c:
                yield from _walk_ast(x)


def _gets(node):
    return {(n[1], n[2]) for n in _walk_ast(node) if n[0] == "get"}


@pytest.mark.parametrize("shape", ["original", "legacy"])
def test_no_repeated_comparison_and_no_branch_fixed_by_its_condition(shape):
    """Read from the instruction text (the parser's tree), independently of the generator."""
    n_switch = 0
    for preset in ("low", "medium", "high"):
        for _, tr in _trials(preset, 700, shape=shape, seed=3):
            (_, question), = [it for it in PARSER.parse(tr.instruction) if it[0] == "question"]
            cmps = [frozenset((n[1], n[2])) for n in _walk_ast(question) if n[0] in ("eq", "ne")]
            assert len(cmps) == len(set(cmps)), tr.instruction
            for n in _walk_ast(question):
                if n[0] == "switch":
                    n_switch += 1
                    for branch in n[2:]:
                        assert not _gets(branch) or not _gets(branch) <= _gets(n[1]), tr.instruction
    assert n_switch == 1400


# -- shape options -----------------------------------------------------------------------------------
def test_shape_options_resolve_and_errors_name_the_field():
    assert resolve_shape(None) == Shape() == SHAPES["original"]
    assert resolve_shape("legacy") == Shape("nested", "per_frame", "second", True)
    assert resolve_shape({"delays": "per_frame"}) == Shape(delays="per_frame")
    assert resolve_shape({"base": "legacy", "object_reuse": False}).structure == "nested"
    with pytest.raises(ReformError, match=r"cfg\.yaml.*field 'shape\.nesting'.*unknown key"):
        resolve_shape({"nesting": True}, where="cfg.yaml")
    with pytest.raises(ReformError, match=r"field 'shape\.delays'.*'sometimes' is not one of run, per_frame"):
        resolve_shape({"delays": "sometimes"})
    with pytest.raises(ReformError, match=r"field 'shape\.object_reuse'"):
        resolve_shape({"object_reuse": "yes"})
    with pytest.raises(ReformError, match=r"field 'shape'.*unknown shape 'paper'"):
        resolve_shape("paper")


def test_user_n_frames_beyond_the_preset_still_generates():
    sampler = PresetSampler(PRESETS["low"], STIM, n_frames=10)
    for i in range(50):
        _, tr = sampler.trial(random.Random(i))
        assert len(tr.frames) == 10 and PARSER.evaluate(tr.instruction, tr.frames)[-1] == tr.answer
    with pytest.raises(ReformError, match="no task fits 2 frames"):
        PresetSampler(PRESETS["high"], STIM, n_frames=2).trial(random.Random(0))


# -- worked examples -------------------------------------------------------------------------------
def test_worked_examples_do_not_share_one_answer():
    ex = example_trials(STIM, 3)
    assert [feat for feat, _ in ex] == ["location", "category", "identity"]
    assert [tr.answer for _, tr in ex] == ["true", "false", "true"]
    for _, tr in ex:
        assert PARSER.evaluate(tr.instruction, tr.frames)[-1] == tr.answer
    assert [tr.instruction for _, tr in example_trials(STIM, 2)] == [tr.instruction for _, tr in ex[:2]]


# -- the parser reads the original's wording ---------------------------------------------------------
def _o(cat, loc, idx=0, **kw):
    return {"category": cat, "identity": idx, "view": 0, "location": loc, **kw}


def test_parser_reads_delay_runs_constant_first_and_at_location_targets():
    a, b = _o("cars", "top left"), _o("couches", "bottom right")
    frames = [[a], [], [], [], [b]]
    for text in ("observe object 1, delay, observe object 2, category of object 1 equals category of object 2?",
                 "observe object 1, delay, delay, delay, observe object 2, category of object 1 equals "
                 "category of object 2?",
                 "observe object 1, delay, delay, observe object 2, couches equals category of object 2 and "
                 "top left not equals location of object 1?"):
        assert PARSER.evaluate(text, frames) == ["false"]
    # a question due on a blank frame splits the run; the last "delay" of the group takes the rest
    assert PARSER.evaluate("observe object 1, delay, category of object 1?, delay, observe object 2, "
                           "location of object 2?", frames) == ["cars", "bottom right"]
    with pytest.raises(InstructionError, match="frame 4, which shows an object"):
        PARSER.evaluate("observe object 1, delay, delay, delay, delay, observe object 2, location of object 2?",
                        frames)
    with pytest.raises(InstructionError, match="shows an object"):
        PARSER.evaluate("delay, observe object 1, location of object 1?", [[a], []])
    with pytest.raises(InstructionError, match="blank"):
        PARSER.evaluate("observe object 1, observe object 2, location of object 2?", [[a], []])
    with pytest.raises(InstructionError, match="two constants"):
        PARSER.evaluate("observe object 1, cars equals cars?", [[a]])
    d = _o("planes", "bottom left", distractor=True)
    two = [[a, d], [b, _o("couches", "top left", distractor=True)]]
    assert PARSER.evaluate("observe object 1 at location: top left, observe object 2 with category: couches "
                           "at location: bottom right, category of object 1?", two) == ["cars"]
    with pytest.raises(InstructionError, match="ambiguous: 2 candidates"):
        PARSER.evaluate("observe object 1, observe object 2 with category: couches, category of object 2?",
                        [[a], two[1]])


def test_parser_reads_unparenthesised_and_or_chains_when_they_have_one_value():
    objs = [[_o("cars", "top left")], [_o("cars", "top right")], [_o("boats", "top left")]]
    head = "observe object 1, observe object 2, observe object 3, "
    t, f = "category of object 1 equals category of object 2", "category of object 1 equals category of object 3"
    assert PARSER.evaluate(head + f"{t} and {t} and {f}?", objs) == ["false"]
    assert PARSER.evaluate(head + f"{t} or {f} or {f}?", objs) == ["true"]
    assert PARSER.evaluate(head + f"{t} and {t} or {f}?", objs) == ["true"]  # both bracketings: true
    with pytest.raises(InstructionError, match="ambiguous"):
        PARSER.evaluate(head + f"{t} or {t} and {f}?", objs)  # (t or t) and f = false, t or (t and f) = true
    assert PARSER.evaluate(head + f"({t} or {t}) and {f}?", objs) == ["false"]


def _from_original(rec, categories):
    """The original's dumped trial as our per-frame object lists (grid cell -> quadrant, codes -> names)."""
    quadrant = {(0, 0): "top left", (0, 1): "bottom left", (1, 0): "top right", (1, 1): "bottom right"}
    frames = [[] for _ in range(rec["epochs"])]
    for o in rec["objects"]:
        ep = o["epochs"]
        for e in ([ep] if isinstance(ep, int) else ep):
            frames[e].append({"category": categories[o["category"]], "identity": o["object"], "view": 0,
                              "location": quadrant[tuple(o["space"])], "distractor": o["is_distractor"]})
    return frames


def test_parser_agrees_with_the_originals_answers_on_its_own_trials():
    path = os.path.join(DATA, "iwisdm_orig_trials.jsonl")
    with open(path, encoding="utf-8") as f:
        recs = [json.loads(line) for line in f]
    seen = Counter()
    for rec in recs:
        frames = _from_original(rec, STIM.categories)
        assert PARSER.evaluate(rec["instruction"], frames)[-1] == rec["answers"][-1], rec["instruction"]
        text = rec["instruction"]
        seen["run"] += any(not frames[i] and not frames[i + 1] for i in range(len(frames) - 1))
        seen["const_first"] += bool(re.search(CONST_FIRST, text))
        seen["at"] += " at location: " in text
        seen["with"] += " with category: " in text
        seen[rec["preset"]] += 1
    assert seen["low"] == seen["medium"] == seen["high"] == seen["low+distractors"] == 30
    assert min(seen["run"], seen["const_first"], seen["at"], seen["with"]) >= 3, seen


# -- shape distributions against the original ------------------------------------------------------
def test_shape_of_a_known_trial():
    tree = ["Switch", [["Or", [["IsSame", []], ["NotSame", []]]], ["GetLoc", [["Select", []]]],
                       ["And", [["IsSame", []], ["IsSame", []]]]]]
    got = shape_of(tree, [True, False, False, True, True, False, True], "top left")
    assert got == {"frames": 7, "objects": 4, "and_or": 2, "and_or_depth": 1, "switches": 1,
                   "delay_runs": [2, 1], "response": "location"}
    assert shape_of(["Or", [["And", []], ["IsSame", []]]], [False, True], "couches")["and_or_depth"] == 2
    assert tv_distance({1: 0.5, 2: 0.5}, {1: 0.25, 3: 0.75}) == pytest.approx(0.75)
    assert distribution([{"delay_runs": [1, 2]}, {"delay_runs": [1]}], "delay_runs") == {1: 2 / 3, 2: 1 / 3}


@pytest.mark.parametrize("preset", LEVELS)
def test_default_shape_within_005_tv_of_the_original(preset):
    with open(os.path.join(DATA, "iwisdm_orig_shape.json"), encoding="utf-8") as f:
        ref = json.load(f)["presets"][preset]
    mine = ours(preset, 2000, seed=5)
    worst = {}
    for feat in FEATURES:
        p = {str(k): v for k, v in distribution(mine, feat).items()}
        worst[feat] = tv_distance(p, ref[feat])
    assert max(worst.values()) <= 0.05, worst
    legacy = ours(preset, 1000, seed=5, shape="legacy")
    assert tv_distance({str(k): v for k, v in distribution(legacy, "objects").items()}, ref["objects"]) > 0.15
