"""Our implementations of other harnesses' MME answer rules read every response of a stress set
exactly as those harnesses' own functions did.

The expected outputs (tests/data/mme_parse_stress/expected.json) were produced by running
VLMEvalKit's ``YOrN_Extraction`` (with its ``process_punctuation``) and lmms-eval's
``parse_pred_ans`` themselves on tests/data/mme_parse_stress/responses.json; the file records their
commit / version and how (``bash commands/mme_parse_reference.sh VLMEVALKIT_GIT_DIR``)."""
from __future__ import annotations

import json
import os

import pytest

from reform_eval.metrics.mme import get_parser

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STRESS = os.path.join(ROOT, "tests", "data", "mme_parse_stress")
#: the harness's own output -> our parsed answer
VLMEVALKIT_OUT = {"Yes": "yes", "No": "no", "Unknown": "other"}


def expected():
    with open(os.path.join(STRESS, "expected.json"), encoding="utf-8") as f:
        return json.load(f)


def test_the_expected_outputs_cover_the_stress_set():
    with open(os.path.join(STRESS, "responses.json"), encoding="utf-8") as f:
        responses = [r["response"] for r in json.load(f)["responses"]]
    data = expected()
    assert [c["response"] for c in data["cases"]] == responses, "re-run: " + data["recipe"]
    assert len(responses) == len(set(responses)) >= 300


@pytest.mark.parametrize("rule, field, mapping", [
    ("vlmevalkit", "vlmevalkit", VLMEVALKIT_OUT),
    ("stripped", "lmms_eval", {"yes": "yes", "no": "no", "other": "other"}),
])
def test_our_rule_reads_every_response_as_the_harness_does(rule, field, mapping):
    parse = get_parser(rule)
    cases = expected()["cases"]
    differ = [(c["response"], parse(c["response"]), c[field]) for c in cases
              if parse(c["response"]) != mapping[c[field]]]
    assert differ == [], f"{len(differ)} of {len(cases)} responses read differently (ours, theirs)"


def test_the_stress_set_tells_the_rules_apart():
    """The set holds the quirks: the letter-run rule and the official tool's rule read many of its
    responses otherwise than the harness whose rule they are not (the counts docs/foreign_logs.md
    gives)."""
    cases = expected()["cases"]
    word, official = get_parser("word"), get_parser("official")
    assert sum(word(c["response"]) != VLMEVALKIT_OUT[c["vlmevalkit"]] for c in cases) == 81
    assert sum(official(c["response"]) != c["lmms_eval"] for c in cases) == 16


@pytest.mark.parametrize("response, parsed", [
    ("**Yes**", "other"),             # '*' is not punctuation to it
    ("'yes'", "other"),               # nor the apostrophe
    ("Answer: yes", "yes"), ("Answer:yes", "other"),  # a colon stays glued
    ("yes\u3002", "other"),           # nor CJK punctuation
    ("no1", "other"),                 # digits stay glued
    ("sure,yes, it is", "other"),     # ", " anywhere: every comma is deleted, "sureyes"
    ("sure,yes", "yes"),              # no space by a comma: replaced by a space
    ("sure,yes 1,2", "other"),        # a comma between digits: every comma deleted
    ("a. " * 32 + "yes.", "other"),   # only 32 lone periods are removed
    ("a. " * 31 + "yes.", "yes"),
    ("yes\u200b", "other"), ("yes\u3000", "yes"),
    ("yes or no", "other"), ("maybe", "other"), ("", "other"),
])
def test_vlmevalkit_quirks(response, parsed):
    assert get_parser("vlmevalkit")(response) == parsed


@pytest.mark.parametrize("module", ["reform_eval.run_loader_eval", "reform_eval.evaluation.config"])
def test_help_says_which_rule_each_file_gets(module):
    """--help never claims ``official`` is the default for another harness's file."""
    import importlib

    parser = importlib.import_module(module).build_parser()
    action = next(a for a in parser._actions if "--mme_parse" in a.option_strings)
    assert action.default is None and "vlmevalkit" in action.choices
    text = " ".join(action.help.split())
    assert "default: official)" not in text
    for part in ("official for our records", "stripped (lmms-eval's parse_pred_ans) for lmms-eval logs",
                 "vlmevalkit (its YOrN_Extraction) for VLMEvalKit files"):
        assert part in text


def test_each_harness_file_gets_its_own_rule_by_default():
    from reform_eval.metrics import mme_lmms_eval, mme_vlmevalkit

    assert (mme_vlmevalkit.PARSE_RULE, mme_lmms_eval.PARSE_RULE) == ("vlmevalkit", "stripped")
