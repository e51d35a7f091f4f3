"""Shared reformulation: marks, seeded shuffling, instruction pools, duplication, one-shot."""
import hashlib
import json
import subprocess
import sys

import pytest

from reform_eval.build import load_reform_dataset
from reform_eval.build.reformulation import INSTRUCTION_POOLS, Reformulator, format_options, option_marks
from reform_eval.utils.errors import ReformError

ITEM = {"sample_id": "s1", "images": [], "question": "Pick the fruit.",
        "answer_options": ["car", "apple", "chair", "lamp"], "answer": 1, "meta": {}}


def digest(samples):
    return hashlib.sha256(json.dumps([{k: v for k, v in s.items() if k != "images"} for s in samples],
                                     sort_keys=True).encode()).hexdigest()


def test_option_marks_and_formatter():
    assert option_marks("upper", 3) == ["A", "B", "C"]
    assert option_marks("lower", 2) == ["a", "b"]
    assert option_marks("number", 3) == ["1", "2", "3"]
    assert format_options("Is it red?", ["yes", "no"], ["A", "B"]) == "Is it red? Options: (A) yes; (B) no."
    with pytest.raises(ReformError, match="valid names"):
        option_marks("greek", 2)


def test_instruction_pools_have_five_phrasings():
    for key, pool in INSTRUCTION_POOLS.items():
        assert len(set(pool)) >= 5, key


def test_shuffle_keeps_answer_and_is_seeded():
    ref = Reformulator("t", "SingleChoice", data_duplication=8, seed=3)
    samples = ref.expand(ITEM)
    assert {s["sample_id"] for s in samples} == {"s1"}
    assert [s["dup_index"] for s in samples] == list(range(8))
    for s in samples:
        assert s["answer_options"][s["answer"]] == "apple"
        assert sorted(s["answer_options"]) == sorted(ITEM["answer_options"])
    orders = {tuple(s["answer_options"]) for s in samples}
    assert len(orders) > 1  # duplicates see different orders
    again = Reformulator("t", "SingleChoice", data_duplication=8, seed=3).expand(ITEM)
    assert again == samples
    other = Reformulator("t", "SingleChoice", data_duplication=8, seed=4).expand(ITEM)
    assert [s["answer_options"] for s in other] != [s["answer_options"] for s in samples]


def test_no_shuffle_no_random_instruct():
    s = Reformulator("t", "SingleChoice", shuffle_options=False, random_instruct=False,
                     in_context_sample=False).reformulate(ITEM, 0)
    assert s["answer_options"] == ITEM["answer_options"] and s["answer"] == 1
    assert s["instruct"] == INSTRUCTION_POOLS[("SingleChoice", "generation")][0]
    assert s["question_with_option"] == "Pick the fruit. Options: (A) car; (B) apple; (C) chair; (D) lamp."
    assert s["history"] == []


def test_random_instruct_varies_across_duplicates():
    samples = Reformulator("t", "SingleChoice", data_duplication=20, seed=0).expand(ITEM)
    assert len({s["instruct"] for s in samples}) >= 3


def test_random_marks_and_one_shot_matches_style():
    samples = Reformulator("t", "SingleChoice", option_mark="random", data_duplication=12, seed=1).expand(ITEM)
    styles = {s["option_marks"][0] for s in samples}
    assert styles <= {"A", "a", "1"} and len(styles) >= 2
    for s in samples:
        human, assistant = s["history"]
        m = s["option_marks"]
        assert human["from"] == "human" and f"({m[0]}) a hammer" in human["value"]
        assert assistant["value"] == f"({m[1]}) an apple"


def test_likelihood_candidates_follow_shuffled_options():
    s = Reformulator("t", "SingleChoice", inference_method="likelihood", seed=2).reformulate(ITEM, 0)
    assert s["candidates"] == s["answer_options"]


def test_bad_answer_index():
    bad = dict(ITEM, answer=9)
    with pytest.raises(ReformError, match="out of range"):
        Reformulator("t", "SingleChoice").reformulate(bad, 0)


def test_same_samples_in_another_process(custom_cfg):
    kw = dict(data_duplication=3, option_mark="random", seed=11)
    here = digest(load_reform_dataset("custom", "SingleChoice", custom_cfg, **kw).samples)
    code = ("import sys, json, hashlib; sys.path.insert(0, '.');"
            "from reform_eval.build import load_reform_dataset;"
            f"ds = load_reform_dataset('custom', 'SingleChoice', {custom_cfg!r}, data_duplication=3, option_mark='random', seed=11);"
            "print(hashlib.sha256(json.dumps([{k: v for k, v in s.items() if k != 'images'} for s in ds.samples], sort_keys=True).encode()).hexdigest())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={"PYTHONHASHSEED": "123", "PATH": "/usr/bin:/bin"})
    assert out.stdout.strip() == here


def test_dataloader_consumes_dataset(custom_cfg):
    from torch.utils.data import DataLoader
    from reform_eval.utils.preprocessors import ConvProcessor
    ds = load_reform_dataset("custom", "SingleChoice", custom_cfg, in_context_sample=False,
                            preprocessor=ConvProcessor())
    batches = list(DataLoader(ds, batch_size=5, collate_fn=list))
    assert [len(b) for b in batches] == [5, 5, 2]
    assert batches[0][0]["images"][0].size == (32, 32)
    assert batches[0][0]["prompt"].startswith("USER: <image>\n")


def test_unknown_names(custom_cfg):
    with pytest.raises(ReformError, match="valid names"):
        load_reform_dataset("NoSuchBench", "SingleChoice")
    with pytest.raises(ReformError, match="valid names"):
        load_reform_dataset("custom", "Essay", custom_cfg)
