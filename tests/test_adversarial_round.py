"""Classes an adversarial review of this round found, pinned: a reply mark that names two options,
duplicate JSON keys, markdown links and bidi controls in names, runs that share a file stem or
are one file through a link, names too long for a temporary, invisible characters in PIF
replies, a tab in an MME export field, and bad data that used to leave a log behind."""
from __future__ import annotations

import copy
import json
import os

import pytest

from reform_eval import run_eval
from reform_eval import run_loader_eval
from reform_eval.metrics.pif import check_instruction
from tests.report_fixtures import iwisdm_records, mme_records
from reform_eval.utils.report import md_cell, md_text


def _write(path, records):
    records = copy.deepcopy(records)
    for r in records:  # the fixture's marks are a string; a prediction file holds a list
        if isinstance(r.get("option_marks"), str):
            r["option_marks"] = list(r["option_marks"])
    os.makedirs(os.path.dirname(str(path)), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(records, f)
    return str(path)


def test_option_marks_that_name_two_options_are_refused(tmp_path, capsys):
    recs = copy.deepcopy(iwisdm_records(seed=1))
    for r in recs:
        r["option_marks"] = ["A"] * len(r["answer_options"])
    rc = run_loader_eval.main(["--prediction_file", _write(tmp_path / "p.json", recs), "--output_dir",
                               str(tmp_path / "o")])
    assert rc == 2 and "option marks must be distinct" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_duplicate_json_keys_are_refused(tmp_path, capsys):
    line = json.dumps(copy.deepcopy(iwisdm_records(seed=1))[0])[:-1] + ', "answer": 1}'
    (tmp_path / "p.jsonl").write_text(line + "\n")
    rc = run_loader_eval.main(["--prediction_file", str(tmp_path / "p.jsonl"), "--output_dir", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert rc == 2 and "'answer' is given twice" in err


def test_markdown_names_cannot_link_or_reorder():
    assert "](" not in md_text("![pix](http://evil.example/p.png) [x](javascript:y)")
    assert "\u202e" not in md_cell("low\u202e | 0.3")
    assert md_text("0.817 [0.667, 0.933]") == "0.817 [0.667, 0.933]"


def test_same_stem_in_two_folders_and_one_file_through_a_link(tmp_path, capsys):
    a = _write(tmp_path / "run1" / "predictions.json", iwisdm_records(seed=1))
    b = _write(tmp_path / "run2" / "predictions.json", iwisdm_records(seed=1))
    assert run_loader_eval.main(["--prediction_file", a, b, "--output_dir", str(tmp_path / "cmp"),
                                 "--n_boot", "20"]) == 0
    names = [m["name"] for m in json.load(open(tmp_path / "cmp" / "comparison.json"))["models"]]
    assert len(set(names)) == 2
    os.symlink(a, tmp_path / "link.json")
    capsys.readouterr()
    rc = run_loader_eval.main(["--prediction_file", a, str(tmp_path / "link.json"), "--output_dir",
                               str(tmp_path / "cmp2")])
    assert rc == 2 and "given twice" in capsys.readouterr().err


def test_a_long_legal_file_name_is_scored(tmp_path):
    pred = _write(tmp_path / ("p" * 215 + ".json"), iwisdm_records(seed=1))
    assert run_loader_eval.main(["--prediction_file", pred, "--output_dir", str(tmp_path / "o")]) == 0
    assert any(n.endswith(".results.json") for n in os.listdir(tmp_path / "o"))


@pytest.mark.parametrize("reply,iid,want", [
    ("Storks nest on roofs!\u200b", "end_char_exclamation", True),
    ("Storks are tall birds!\u200b They nest on roofs. They eat frogs. They fly far. They return each spring.",
     "response_length_long", True),
    ("I like\u0301 it.", "favourite_word_like", False),  # NFC: "liké" is not "like"
])
def test_invisible_and_combining_characters_read_as_a_reader_sees_them(reply, iid, want):
    assert check_instruction(reply, iid) is want


def test_an_mme_export_field_with_a_tab_is_refused_and_nothing_written(tmp_path, capsys):
    recs = copy.deepcopy(mme_records(seed=1))
    for r in recs:
        r["meta"]["image"] = r["meta"]["image"] + "\tfake\tYes\n"
    pred = _write(tmp_path / "p.json", recs)
    rc = run_loader_eval.main(["--prediction_file", pred, "--output_dir", str(tmp_path / "o"),
                               "--export_mme_results", str(tmp_path / "exp")])
    assert rc == 2 and "tab or line break" in capsys.readouterr().err
    assert not (tmp_path / "exp").exists()


def test_bad_data_leaves_no_output_folder(tmp_path, capsys):
    data = tmp_path / "d"
    data.mkdir()
    (data / "c.yaml").write_text("data_file: items.jsonl\n")
    (data / "items.jsonl").write_text(json.dumps({"sample_id": "a", "images": [], "question": "q",
                                                  "answer_options": ["x", "y"], "answer": 5}) + "\n")
    rc = run_eval.main(["--model", "random", "--dataset_name", "custom", "--dataset_config", str(data / "c.yaml"),
                        "--output_dir", str(tmp_path / "o")])
    assert rc == 2 and "field 'answer'" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_a_hand_written_file_missing_both_fields_is_told_so_once(tmp_path, capsys):
    recs = copy.deepcopy(iwisdm_records(seed=1))
    for r in recs:
        r.pop("formulation", None)
        r.pop("inference_method", None)
    rc = run_loader_eval.main(["--prediction_file", _write(tmp_path / "p.json", recs), "--output_dir",
                               str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert rc == 2 and "--formulation and --infer_method" in err
