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
