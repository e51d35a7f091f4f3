"""--context_policy error|truncate_history|skip (issue 12 section 4) on real MMMT-IF samples
built from a small MMDU fixture, with the tiny llava model and a tight context limit."""
from __future__ import annotations

import os
import json

import pytest

from tests.conftest import only_results, prediction_files

from reform_eval.build import build_dataset
from reform_eval.utils.schema import IMAGE_TOKEN
from reform_eval.metrics.pif import INSTRUCTION_TEXTS
from reform_eval.models import get_model
from tests.test_mmmt_if_run import write_mmdu
from reform_eval.evaluation.context import fit_batch, fit_sample, leading_instructions, truncated
from reform_eval.utils.errors import ReformError


@pytest.fixture(scope="module")
def mmdu_cfg(tmp_path_factory):
    return write_mmdu(str(tmp_path_factory.mktemp("mmdu")))


@pytest.fixture(scope="module")
def chat(mmdu_cfg):
    """The turns of the first chat whose first two turns both add an instruction."""
    samples, _ = build_dataset("MMMT-IF", "Generation", mmdu_cfg, seed=0, in_context_sample=False)
    chats = {}
    for s in samples:
        chats.setdefault(s["meta"]["chat_id"], []).append(s)
    for turns in chats.values():
        turns.sort(key=lambda s: s["meta"]["turn"])
        if turns[0]["meta"]["new_instruction"] and turns[1]["meta"]["new_instruction"]:
            return turns
    pytest.fail("fixture has no chat with instructions at turns 1 and 2")


@pytest.fixture(scope="module")
def llava():
    return get_model("llava", {"model_name": "tiny", "device": "cpu", "max_new_tokens": 8, "preprocessor": "conv"})


def _with_limit(interface, limit):
    interface.max_context = limit
    return interface


def test_truncate_keeps_images_and_restates_dropped_instructions(chat, llava):
    interface, prep = llava
    last = chat[-1]
    assert len(last["history"]) == 2 * (len(chat) - 1)
    reserve = 8
    fits_after_two = interface.count_prompt_tokens(last["images"], prep(truncated(last, 2))) + reserve
    full = interface.count_prompt_tokens(last["images"], prep(last)) + reserve
    assert fits_after_two < full
    _with_limit(interface, fits_after_two)
    try:
        used, prompt, reason = fit_sample(last, prep, interface, "truncate_history", "generation",
                                          {"max_new_tokens": reserve})
    finally:
        _with_limit(interface, 4096)
    assert reason is None
    ctx = used["context"]
    assert ctx["dropped_turns"] == 2 and ctx["dropped_messages"] == 4
    assert ctx["dropped_sample_ids"] == [chat[0]["sample_id"], chat[1]["sample_id"]]
    assert ctx["prompt_tokens"] + reserve <= fits_after_two < ctx["original_prompt_tokens"] + reserve
    # every image stays, in order: the dropped turn 1 introduced both images
    assert used["images"] == last["images"] and prompt.count(IMAGE_TOKEN) == len(last["images"]) == 2
    # the instructions of the dropped turns are restated, word for word as given
    expected = [f"Instruction: {INSTRUCTION_TEXTS[t['meta']['new_instruction']]}" for t in chat[:2]]
    assert ctx["restated_instructions"] == expected
    for sentence in expected:
        assert sentence in prompt
    assert used["history"][0]["value"].startswith(" ".join(expected))
    # the checker still holds the model to all of them, the history is really shorter
    assert used["meta"]["instructions"] == last["meta"]["instructions"]
    assert len(used["history"]) == len(last["history"]) - 4
    # and the model runs on it without a context error
    out = interface.forward("generation", [used], [prompt], max_new_tokens=reserve)
    assert isinstance(out[0], str)


def test_leading_instructions_parses_known_and_unknown_sentences():
    known = INSTRUCTION_TEXTS[sorted(INSTRUCTION_TEXTS)[0]]
    found, rest = leading_instructions(f"Instruction: {known} Instruction: Be brief. <image>What is it?")
    assert found == [f"Instruction: {known}", "Instruction: Be brief."] and rest.strip() == "<image>What is it?"
    assert leading_instructions("What is it?") == ([], "What is it?")


def test_error_policy_names_chat_turn_and_lengths(chat, llava):
    interface, prep = llava
    last = chat[-1]
    _with_limit(interface, 40)
    try:
        with pytest.raises(ReformError) as e:
            fit_sample(last, prep, interface, "error", "generation", {"max_new_tokens": 8})
    finally:
        _with_limit(interface, 4096)
    msg = str(e.value)
    n = interface.count_prompt_tokens(last["images"], prep(last))
    assert f"sample {last['sample_id']}, chat {last['meta']['chat_id']}, turn {last['meta']['turn']}" in msg
    assert f"prompt is {n} tokens + 8 reserved for the answer = {n + 8}" in msg and "context of 40 tokens" in msg
    assert "--context_policy" in msg and "\n" not in msg


def test_skip_records_reason_and_fitting_samples_pass(chat, llava):
    interface, prep = llava
    first, last = chat[0], chat[-1]
    limit = interface.count_prompt_tokens(first["images"], prep(first)) + 8
    _with_limit(interface, limit)
    try:
        run, prompts, skipped = fit_batch([first, last], prep, interface, "skip", "generation", {"max_new_tokens": 8})
        # truncation that cannot fit even without history skips rather than failing the run
        _with_limit(interface, 20)
        _, _, skipped2 = fit_batch([last], prep, interface, "truncate_history", "generation", {"max_new_tokens": 8})
    finally:
        _with_limit(interface, 4096)
    assert [s["sample_id"] for s in run] == [first["sample_id"]] and prompts == [prep(first)]
    assert len(skipped) == 1 and skipped[0]["sample_id"] == last["sample_id"]
    assert skipped[0]["skipped"].startswith("context: prompt of") and "images" not in skipped[0]
    assert "even without any earlier turn" in skipped2[0]["skipped"]


def test_metrics_exclude_skipped_records_and_show_the_count():
    from reform_eval.metrics import evaluate
    base = {"benchmark": "custom", "formulation": "Generation", "inference_method": "generation", "dup_index": 0}
    records = [dict(base, sample_id="a", answer="red", prediction="red"),
               dict(base, sample_id="b", answer="blue", prediction="green"),
               dict(base, sample_id="c", answer="blue", prediction="", skipped="context: prompt of 9 tokens")]
    res = evaluate(records, "Generation", "generation")
    ref = evaluate(records[:2], "Generation", "generation")
    assert res["metrics"]["skipped_samples"] == 1
    assert {k: v for k, v in res["metrics"].items() if k != "skipped_samples"} == ref["metrics"]
    assert "| total | 1 |" in res["tables"]["Skipped samples (excluded from every metric)"]
    with pytest.raises(ReformError, match="all 1 prediction records were skipped"):
        evaluate(records[2:], "Generation", "generation")


def _run(mmdu_cfg, out, policy, limit):
    from reform_eval import run_eval
    return run_eval.main(["--model", "llava", "--model_name", "tiny", "--dataset_name", "MMMT-IF",
                          "--dataset_config", mmdu_cfg, "--max_new_tokens", "6", "--history", "reference",
                          "--dataset_option", "num_chats=2", "--output_dir", str(out), "--do_eval",
                          "--model_option", f"max_context_tokens={limit}", "--context_policy", policy])


@pytest.mark.slow
def test_run_eval_truncate_and_skip_end_to_end(mmdu_cfg, tmp_path, chat, llava):
    interface, prep = llava
    # a limit that fits the early turns of a chat but not its last ones
    limit = interface.count_prompt_tokens(chat[2]["images"], prep(chat[2])) + 6
    assert _run(mmdu_cfg, tmp_path / "err", "error", limit) == 2
    assert _run(mmdu_cfg, tmp_path / "trunc", "truncate_history", limit) == 0
    recs = json.load(open(prediction_files(tmp_path / "trunc")[0]))
    cut = [r for r in recs if r.get("context")]
    assert cut and all(r["context"]["dropped_turns"] >= 1 for r in cut) and not any(r.get("skipped") for r in recs)
    assert _run(mmdu_cfg, tmp_path / "skip", "skip", limit) == 0
    recs = json.load(open(prediction_files(tmp_path / "skip")[0]))
    n_skipped = sum(1 for r in recs if r.get("skipped"))
    assert 0 < n_skipped < len(recs)
    results = only_results(tmp_path / "skip")
    assert results["metrics"]["skipped_samples"] == n_skipped
    assert _run(mmdu_cfg, tmp_path / "skip", "skip", limit) == 0  # a re-run does not fail on them


@pytest.mark.slow
def test_killed_and_resumed_run_follows_the_same_policy(mmdu_cfg, tmp_path, chat, llava):
    """Kill a skip-policy run midway and resume it: the skipped samples recorded before the
    kill count as done, and the final file equals an uninterrupted run's."""
    import subprocess
    import sys

    from tests.test_kill_resume import ROOT, run_and_kill_midway
    interface, prep = llava
    limit = interface.count_prompt_tokens(chat[1]["images"], prep(chat[1])) + 6
    ref = tmp_path / "ref"
    assert _run(mmdu_cfg, ref, "skip", limit) == 0
    out = tmp_path / "killed"
    cmd = [sys.executable, os.path.join(ROOT, "run_eval.py"), "--model", "llava", "--model_name", "tiny",
           "--dataset_name", "MMMT-IF", "--dataset_config", mmdu_cfg, "--max_new_tokens", "6", "--history",
           "reference", "--dataset_option", "num_chats=2", "--output_dir", str(out), "--do_eval",
           "--model_option", f"max_context_tokens={limit}", "--context_policy", "skip"]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    partial = run_and_kill_midway(cmd, out, 3, env)
    assert 3 <= partial < 10 and not prediction_files(out), partial
    again = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "already done" in open(out / "log.txt").read()
    a = json.load(open(prediction_files(ref)[0]))
    b = json.load(open(prediction_files(out)[0]))
    assert a == b and any(r.get("skipped") for r in b)
