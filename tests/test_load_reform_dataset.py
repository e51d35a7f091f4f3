"""The Python loader and the command line build the same samples: one set of reformulation
defaults (build.LOAD_DEFAULTS), shipped config names accepted by both, and a subsample larger
than the data said out loud."""
from __future__ import annotations

import inspect
import logging
import os

from reform_eval.build import LOAD_DEFAULTS, build_dataset, load_reform_dataset
from reform_eval.build.mme import write_placeholder_release
from reform_eval.evaluation.config import build_parser

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
QUESTIONS = os.path.join(ROOT, "configs", "data", "mme_questions")

#: LOAD_DEFAULTS key -> the run_eval flag's destination
FLAG_OF = {"in_context_sample": "in_context_sample", "random_instruct": "random_instruct",
           "data_duplication": "dataset_duplication", "shuffle_options": "shuffle_options",
           "option_mark": "option_mark"}


def test_python_and_cli_defaults_are_one_set():
    assert LOAD_DEFAULTS["in_context_sample"] is False
    cli = vars(build_parser().parse_args(["--model", "random", "--dataset_name", "iWISDM"]))
    for fn in (load_reform_dataset, build_dataset):
        params = inspect.signature(fn).parameters
        for key, default in LOAD_DEFAULTS.items():
            assert params[key].default == default, (fn.__name__, key)
    for key, default in LOAD_DEFAULTS.items():
        assert cli[FLAG_OF[key]] == default, key


def test_loader_samples_are_zero_shot_and_match_build_dataset():
    ds = load_reform_dataset("iWISDM", "SingleChoice", "iwisdm_low", subsample=3, lazy_images=True)
    assert len(ds) == 3
    assert all(s["history"] == [] for s in ds.samples)  # no one-shot exchange unless asked
    samples, _ = build_dataset("iWISDM", "SingleChoice", "iwisdm_low", subsample=3)
    assert [s["question_with_option"] for s in ds.samples] == [s["question_with_option"] for s in samples]
    shot = load_reform_dataset("iWISDM", "SingleChoice", "iwisdm_low", subsample=3, in_context_sample=True,
                               lazy_images=True)
    assert all(len(s["history"]) == 2 for s in shot.samples)


def test_shipped_config_name_mme(tmp_path):
    root = write_placeholder_release(QUESTIONS, str(tmp_path / "release"), subtasks=["existence"])
    ds = load_reform_dataset("MME", "Generation", "mme", root=root, subtasks=["existence"], lazy_images=True)
    assert len(ds) == 60 and {s["meta"]["subtask"] for s in ds.samples} == {"existence"}
    assert all(s["history"] == [] for s in ds.samples)


def test_oversized_subsample_says_so(caplog):
    with caplog.at_level(logging.WARNING, logger="build"):
        samples, _ = build_dataset("iWISDM", "SingleChoice", "iwisdm_low", subsample=1000)
    assert len(samples) == 100
    lines = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("subsample 1000 is larger than the data (100 to draw from)" in line for line in lines), lines


def test_relative_path_keywords_are_read_from_the_current_directory(tmp_path, monkeypatch):
    """``root="release"`` in Python means ./release, as ``--dataset_option root=release`` does on
    the command line (not a folder next to the shipped config)."""
    from reform_eval.build import load_reform_dataset
    from reform_eval.build.mme import write_placeholder_release
    from tests.conftest import ROOT
    write_placeholder_release(os.path.join(ROOT, "configs", "data", "mme_questions"), str(tmp_path / "release"),
                              subtasks=["existence"])
    monkeypatch.chdir(tmp_path)
    ds = load_reform_dataset("MME", "Generation", "mme", root="release", subtasks=["existence"])
    assert len(ds) == 60
    assert ds[0]["image_ids"][0].startswith(str(tmp_path / "release"))


# -- custom data means what it says (issue 34) ---------------------------------------------------------

def _custom(tmp_path, lines):
    import json
    (tmp_path / "items.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    (tmp_path / "c.yaml").write_text("data_file: items.jsonl\n")
    return str(tmp_path / "c.yaml")


CHOICE = [{"sample_id": f"q{i}", "images": [], "question": f"Which is right {i}?",
           "answer_options": ["red", "green", "blue"], "answer": i % 3} for i in range(6)]


def test_a_choice_line_under_generation_is_scored_against_its_option_text(tmp_path):
    """A SingleChoice line (answer: an index into answer_options) run as Generation: the
    reference is the right option's text and the options its closed vocabulary (candidates),
    never the index as text ("0"), and the options are not dropped; likelihood scores the same
    candidates. A random model's answer counts as right exactly when it is that text."""
    import glob
    import json
    from reform_eval import run_eval
    cfg = _custom(tmp_path, CHOICE)
    for method in ("generation", "likelihood"):
        samples, _ = build_dataset("custom", "Generation", cfg, inference_method=method)
        assert [(s["answer"], s["candidates"], s["answer_index"]) for s in samples] == \
            [(["red", "green", "blue"][i % 3], ["red", "green", "blue"], i % 3) for i in range(6)]
    out = tmp_path / "out"
    assert run_eval.main(["--model", "random", "--dataset_name", "custom", "--dataset_config", cfg,
                          "--formulation", "Generation", "--output_dir", str(out), "--do_eval"]) == 0
    (per_sample,) = glob.glob(str(out / "*.per_sample.json"))
    records = {r["sample_id"]: r for r in json.load(open(per_sample))}
    preds = [p for p in glob.glob(str(out / "*.json")) if p.count(".") == 1]
    (pred,) = preds
    for rec in json.load(open(pred)):
        assert rec["answer"] == ["red", "green", "blue"][int(rec["sample_id"][1:]) % 3]
        assert rec["candidates"] == ["red", "green", "blue"]
        assert records[rec["sample_id"]]["correct"] == (rec["prediction"].strip() == rec["answer"])
    assert any(r["correct"] for r in records.values())  # scored against the text "0" none could be


def test_a_number_where_text_is_required_is_refused_in_one_line(tmp_path, capsys):
    """Generation's answer and candidates are text: a number is refused (file, line, field), not
    converted with str(); a line with both answer_options and candidates is refused too."""
    from reform_eval import run_eval
    first = {"sample_id": "b", "question": "q", "answer": "red", "candidates": ["red", "green"]}
    cases = [({"sample_id": "a", "question": "q", "answer": 0, "candidates": ["0", "1"]},
              "field 'answer': must be a string"),
             ({"sample_id": "a", "question": "q", "answer": "1", "candidates": [1, 2]}, "field 'candidates': must be"),
             ({**CHOICE[0], "candidates": ["red", "green", "blue"]}, "field 'candidates': give answer_options")]
    for i, (line, said) in enumerate(cases):
        cfg = _custom(tmp_path, [first, line])
        out = tmp_path / f"o{i}"
        assert run_eval.main(["--model", "random", "--dataset_name", "custom", "--dataset_config", cfg,
                              "--formulation", "Generation", "--output_dir", str(out)]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "items.jsonl" in err[0] and "line 2" in err[0] and said in err[0], err
        assert not out.exists()


def test_options_the_scorer_cannot_tell_apart_are_refused(tmp_path, capsys):
    """Options equal once lower-cased without punctuation ("-1"/"1", "31"/"3.1", "Yes"/"yes!") or
    empty so ("?") would score a wrong answer right by text: refused in one line naming the file,
    line and field, under SingleChoice and Generation alike (answer_options and candidates)."""
    from reform_eval import run_eval
    first = {"sample_id": "ok", "question": "q", "answer_options": ["red", "green"], "answer": 0}
    cases = [({"sample_id": "a", "question": "q", "answer_options": ["-1", "1"], "answer": 1}, "answer_options"),
             ({"sample_id": "a", "question": "q", "answer_options": ["31", "3.1"], "answer": 1}, "answer_options"),
             ({"sample_id": "a", "question": "q", "answer_options": ["Yes", "yes!"], "answer": 1}, "answer_options"),
             ({"sample_id": "a", "question": "q", "answer_options": ["no", "?"], "answer": 0}, "answer_options"),
             ({"sample_id": "a", "question": "q", "answer": "Yes", "candidates": ["Yes", "yes!"]}, "candidates")]
    for i, (line, field) in enumerate(cases):
        for formulation in ("SingleChoice", "Generation"):
            if field == "candidates" and formulation == "SingleChoice":
                continue
            cfg = _custom(tmp_path, [first, line])
            out = tmp_path / f"o{i}{formulation}"
            assert run_eval.main(["--model", "constant", "--dataset_name", "custom", "--dataset_config", cfg,
                                  "--formulation", formulation, "--output_dir", str(out), "--do_eval"]) == 2
            err = capsys.readouterr().err.strip().splitlines()
            assert len(err) == 1 and "items.jsonl" in err[0] and "line 2" in err[0] and f"field '{field}'" in err[0], err
            assert not out.exists()
