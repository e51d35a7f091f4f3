"""Pairing by content: paired tests pair two runs' entries only when they were made from the
same sample (equal ``sample_sha``), and the comparison says how many shared ids were refused."""
from __future__ import annotations

import json

import pytest

from reform_eval import run_eval
from reform_eval import run_loader_eval
from tests.conftest import prediction_files
from tests.report_fixtures import iwisdm_records, run
from reform_eval.evaluation.reporting.compare import pair_keys, paired_tests
from reform_eval.evaluation.reporting.html import sample_data
from reform_eval.evaluation.reporting.compare import build_comparison


def test_pair_keys_rule():
    keys = [("a", 0), ("b", 0), ("c", 0), ("d", 0), ("e", 0)]
    sha_a = {("a", 0): (None, "1"), ("b", 0): (None, "2"), ("c", 0): (None, "3")}
    sha_b = {("a", 0): (None, "1"), ("b", 0): (None, "X"), ("d", 0): (None, "4")}
    # a: equal content; b: other content; c, d: known for one run only; e: known for neither
    assert pair_keys(keys, keys[:4] + [("e", 0)], sha_a, sha_b) == ([("a", 0), ("e", 0)], 3)
    assert pair_keys(keys, [("z", 0)], sha_a, sha_b) == ([], 0)


def _with_sha(records, tag):
    for r in records:
        r["sample_sha"] = f"{tag}-{r['sample_id']}"
    return records


def test_same_ids_other_content_are_not_paired():
    a = run("a", _with_sha(iwisdm_records(30, 0.8, seed=1), "seed1"))
    # another build: other content under the same ids (here its question text says so; a record
    # whose every field is the same is the same question asked another way, and pairs)
    b = run("b", _with_sha([dict(r, question=r["question"] + " (rebuilt)") for r in iwisdm_records(30, 0.3, seed=2)],
                           "seed2"))
    (t,) = paired_tests([a, b], "accuracy")
    assert (t["n_pairs"], t["n_refused"], t["test"], t["p_value"]) == (0, 30, None, None)
    # ten trials rebuilt with the same content pair again
    for r_a, r_b in list(zip(a["records"], b["records"]))[:10]:
        r_b["sample_sha"] = r_a["sample_sha"]
    (t,) = paired_tests([a, b], "accuracy")
    assert (t["n_pairs"], t["n_refused"], t["test"]) == (10, 20, "exact McNemar")
    # the sample browser shows other content under a shared id as its own sample
    data = sample_data(build_comparison([a, b], n_boot=20), [a, b])
    assert len(data["samples"]) == 30 + 20


@pytest.mark.slow  # (quick subset: test_generation_and_likelihood_runs_of_one_build_pair covers the path)
def test_iwisdm_runs_with_other_trial_seeds_refuse_mcnemar(tmp_path, capsys):
    out = tmp_path / "iw"
    common = ["--output_dir", str(out), "--do_eval", "--dataset_name", "iWISDM", "--dataset_config", "iwisdm_low",
              "--formulation", "SingleChoice", "--dataset_subsample", "12"]
    assert run_eval.main(["--model", "random", *common, "--dataset_option", "seed=0"]) == 0
    assert run_eval.main(["--model", "random", *common, "--dataset_option", "seed=1"]) == 0
    files = prediction_files(out)
    assert len(files) == 2
    ids = [[r["sample_id"] for r in json.load(open(f))] for f in files]
    assert ids[0] == ids[1]  # the same ids, made from other trials
    capsys.readouterr()
    cmp_dir = tmp_path / "cmp"
    assert run_loader_eval.main(["--prediction_file", str(out / "iWISDM_*"), "--output_dir", str(cmp_dir),
                                 "--n_boot", "50"]) == 0
    comp = json.load(open(cmp_dir / "comparison.json"))
    (t,) = comp["paired_tests"]
    assert (t["n_pairs"], t["n_refused"], t["test"], t["p_value"]) == (0, 12, None, None)
    note = "12 shared ids holding other content (another question, options or images), 0 only in"
    assert note in open(cmp_dir / "comparison.md").read()
    assert note in open(cmp_dir / "report.html").read()
    assert "exact McNemar" not in capsys.readouterr().out
    # the same trials (same seed) by another model pair as before
    assert run_eval.main(["--model", "constant", *common, "--dataset_option", "seed=0"]) == 0
    assert run_loader_eval.main(["--prediction_file", str(out / "iWISDM_*"), "--output_dir", str(tmp_path / "c3"),
                                 "--n_boot", "50"]) == 0
    tests = json.load(open(tmp_path / "c3" / "comparison.json"))["paired_tests"]
    assert sorted((t["n_pairs"], t["n_refused"]) for t in tests) == [(0, 12), (0, 12), (12, 0)]
    assert sum(t["test"] == "exact McNemar" for t in tests) == 1


def test_generation_and_likelihood_runs_of_one_build_pair(tmp_path):
    """The README's comparison: baselines answer by generation, the model by likelihood. The
    items are the same (only the method and candidates differ), so every entry pairs; a build
    with other trials (another seed) still pairs with nothing."""
    out = tmp_path / "iw"
    common = ["--output_dir", str(out), "--do_eval", "--dataset_name", "iWISDM", "--dataset_config", "iwisdm_low",
              "--formulation", "SingleChoice", "--dataset_subsample", "10", "--no_cache"]
    assert run_eval.main(["--model", "random", *common]) == 0
    assert run_eval.main(["--model", "llava", "--model_name", "tiny", "--infer_method", "likelihood", *common]) == 0
    assert run_eval.main(["--model", "constant", *common, "--dataset_option", "seed=3"]) == 0
    recs = {f: json.load(open(f)) for f in prediction_files(out)}
    assert all(r["item_sha"] and r["sample_sha"] for rs in recs.values() for r in rs)
    assert run_loader_eval.main(["--prediction_file", str(out), "--output_dir", str(tmp_path / "cmp"),
                                 "--n_boot", "50"]) == 0
    tests = {frozenset((t["a"], t["b"])): (t["n_pairs"], t["n_refused"], t["test"])
             for t in json.load(open(tmp_path / "cmp" / "comparison.json"))["paired_tests"]}
    assert tests == {frozenset(("random", "llava:tiny")): (10, 0, "exact McNemar"),
                     frozenset(("random", "constant")): (0, 10, None),
                     frozenset(("llava:tiny", "constant")): (0, 10, None)}


def test_pairing_rule_across_old_and_new_files_and_methods():
    from reform_eval.evaluation.reporting.compare import same_content
    from reform_eval.utils.fingerprint import item_fields
    assert same_content(("i1", "s1"), ("i1", "s2"))            # one item asked two ways
    assert not same_content(("i1", "s1"), ("i2", "s1"))
    assert same_content(("i1", "s1"), (None, "s1"))            # a file from before item_sha
    assert not same_content(("i1", "s1"), (None, "s2"))
    assert not same_content(("i1", "s1"), None) and same_content(None, None)
    single = {"formulation": "SingleChoice", "inference_method": "likelihood", "candidates": ["a", "b"], "q": 1}
    assert item_fields(single) == {"formulation": "SingleChoice", "q": 1}
    gen = {"formulation": "Generation", "inference_method": "likelihood", "candidates": ["a", "b"], "q": 1}
    assert item_fields(gen) == {"formulation": "Generation", "candidates": ["a", "b"], "q": 1}


def test_release_rows_pair_only_with_turns_asked_as_the_release_asked_them():
    from reform_eval.metrics.mmmt_if_release import in_release_setting, reference_records_from
    base = {"sample_id": "c/1", "dup_index": 0, "item_sha": "i", "sample_sha": "s",
            "meta": {"chat_id": "c", "turn": 1, "release_pif": {"Gemini": 1.0}, "images_at": "start"}}
    at_end = dict(base, meta=dict(base["meta"], instructions_at_end=True))
    assert in_release_setting(base) and not in_release_setting(at_end)
    assert not in_release_setting(dict(base, meta=dict(base["meta"], images_at="turn")))
    (ref,) = reference_records_from([base])
    assert (ref["item_sha"], ref["sample_sha"]) == ("i", "s")
    (ref,) = reference_records_from([at_end])
    assert "item_sha" not in ref and "sample_sha" not in ref


def test_in_memory_frames_pair_by_content_never_by_their_names():
    """An iWISDM frame's id is ``<sample id>#<n>`` whatever it shows: two trials under one id,
    with the same question text and other frames, are not the same question asked another way
    (the trace's image_sha, the frames' content, decides)."""
    from reform_eval.evaluation.reporting.compare import question_key
    rec = {"benchmark": "iWISDM", "question": "Is the object a car?", "answer_options": ["true", "false"],
           "answer": 0, "meta": {"complexity": "low"}, "image_ids": ["t0#0", "t0#1"],
           "trace": {"image_sha": "aaaa"}}
    other_frames = dict(rec, trace={"image_sha": "bbbb"})
    other_marks = dict(rec, option_marks="ab")
    assert question_key(rec) != question_key(other_frames)
    assert question_key(rec) == question_key(other_marks)
    files = dict(rec, image_ids=["/data/a/img.png"], trace={"image_sha": "aaaa"})
    elsewhere = dict(files, image_ids=["/other/img.png"], trace={"image_sha": "cccc"})
    assert question_key(files) == question_key(elsewhere)  # (a file: the same name at another resolution)
