"""Commit journals and names the file system refuses (utils/commit.py; issue 31 classes 5 and 6).
Each test failed before its fix: a journal of the wrong shape or nested 100,000 deep made every
start end as an internal error, never naming it."""
from __future__ import annotations

import json
import logging
import os

import pytest

from reform_eval import run_eval
from reform_eval.utils import commit
from reform_eval.utils.commit import JOURNAL_PREFIX, _host, clean_stale_temps
from tests.conftest import prediction_files, write_custom_dataset

SET_ASIDE_PREFIX = getattr(commit, "SET_ASIDE_PREFIX", ".bad-commit~")
DEAD_PID = 4_000_000  # above any pid_max: no process of this host has it


def _journal(folder, text: str, k: int = 0) -> str:
    path = os.path.join(folder, f"{JOURNAL_PREFIX}{_host()}-{DEAD_PID}~{k:08x}.json")
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
    return path


BAD_JOURNALS = {
    "an int": "7",
    "a list": "[1, 2]",
    "renames an int": json.dumps({"renames": 5, "removals": [], "appends": []}),
    "a rename not a pair": json.dumps({"renames": [[1, 2]], "removals": [], "appends": []}),
    "an append of an int": json.dumps({"renames": [], "removals": [], "appends": [["/tmp/x/runs.jsonl", 3]]}),
    "removals of ints": json.dumps({"renames": [], "removals": [1], "appends": []}),
    "a rename of no temporary": json.dumps({"renames": [["{dir}/victim.txt", "{dir}/moved.txt"]], "removals": [],
                                            "appends": []}),
    "nested 100,000 deep": "[" * 100_000 + "]" * 100_000,
    "nested deep in a mapping": '{"renames": ' + "[" * 100_000 + "]" * 100_000 + "}",
    "bad JSON": '{"renames": [',
    "not UTF-8": b"\xff\xfe{}".decode("latin-1"),
}


@pytest.mark.parametrize("why", sorted(BAD_JOURNALS))
def test_a_journal_of_the_wrong_shape_is_set_aside_with_one_line_naming_it(why, tmp_path, caplog):
    (tmp_path / "victim.txt").write_text("not a staged file")
    path = _journal(str(tmp_path), BAD_JOURNALS[why].replace("{dir}", str(tmp_path)))
    with caplog.at_level(logging.WARNING):
        clean_stale_temps(str(tmp_path))
        clean_stale_temps(str(tmp_path))  # (a second start finds nothing to say)
    lines = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(lines) == 1 and lines[0].startswith(path + ": ") and "set aside as" in lines[0], lines
    assert not os.path.exists(path)
    aside = [n for n in os.listdir(tmp_path) if n.startswith(SET_ASIDE_PREFIX)]
    assert len(aside) == 1 and (tmp_path / "victim.txt").exists()


def test_a_run_starts_past_a_bad_journal(tmp_path, capsys, caplog):
    """The command line: the journal is named once, set aside, and the run completes (it ended
    as 'internal error ... AttributeError' / RecursionError, at every start)."""
    cfg = write_custom_dataset(str(tmp_path / "data"), n=3)
    out = tmp_path / "out"
    out.mkdir()
    _journal(str(out), json.dumps({"renames": [], "removals": [], "appends": [["/x/runs.jsonl", 1]]}), 1)
    _journal(str(out), "{" * 100_000, 2)
    with caplog.at_level(logging.WARNING):
        code = run_eval.main(["--model", "random", "--dataset_name", "custom", "--dataset_config", cfg,
                              "--output_dir", str(out), "--do_eval"])
    err = capsys.readouterr().err
    assert code == 0, err
    assert caplog.text.count("set aside as") == 2 and "internal error" not in err
    assert len(prediction_files(str(out))) == 1
