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


# -- class 6: names too long for the file system ------------------------------------------------

def _scored_run(tmp_path) -> str:
    cfg = write_custom_dataset(str(tmp_path / "data"), n=3)
    out = tmp_path / "out"
    assert run_eval.main(["--model", "random", "--dataset_name", "custom", "--dataset_config", cfg,
                          "--output_dir", str(out)]) == 0
    (pred,) = prediction_files(str(out))
    return pred


def test_a_prediction_file_whose_results_name_is_too_long_writes_nothing(tmp_path, capsys):
    """A stem of 240 bytes: ``.results.md`` fits (251), ``.per_sample.json`` does not (256). The
    commit put ``.results.md`` in place and failed at the next rename; the recovery then appended
    a runs.jsonl line naming a missing ``.results.json``. Now every name is checked first."""
    from reform_eval import run_loader_eval
    pred = _scored_run(tmp_path)
    long_dir = tmp_path / "long"
    long_dir.mkdir()
    long_pred = long_dir / ("p" * 240 + ".json")
    long_pred.write_bytes(open(pred, "rb").read())
    code = run_loader_eval.main(["--prediction_file", str(long_pred)])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "over the file system's limit of 255" in err[0], err
    clean_stale_temps(str(long_dir))
    assert sorted(os.listdir(long_dir)) == [long_pred.name]  # no .results.md, no runs.jsonl, no temporary


def test_a_unit_whose_staged_file_is_gone_is_not_half_completed(tmp_path, caplog):
    """A journal whose first rename is done and whose second staged file is gone (removed as a
    stale temporary after a failed rename): the recovery appended the index line, naming a
    results file that never existed. Now the unit's outputs in place are removed and no line is
    appended."""
    folder = str(tmp_path)
    md, json_target = os.path.join(folder, "r.results.md"), os.path.join(folder, "r.results.json")
    with open(md, "w") as f:
        f.write("tables")
    gone = os.path.join(folder, f".tmp-r.results.json~{_host()}-{DEAD_PID}~0000")
    index = os.path.join(folder, "runs.jsonl")
    _journal(folder, json.dumps({"what": "results", "renames": [[os.path.join(folder, ".tmp-r.results.md~x"), md],
                                                                [gone, json_target]],
                                 "removals": [], "appends": [[index, {"results": json_target, "commit": "c1"}]]}))
    with caplog.at_level(logging.WARNING):
        clean_stale_temps(folder)
    assert not os.path.exists(index) and not os.path.exists(md)
    assert os.listdir(folder) == [] and "cannot be completed" in caplog.text


def test_a_journal_s_staged_files_are_not_removed_as_stale(tmp_path):
    """A unit that could not be completed now (a rename failed) keeps its staged files: the
    temporaries' clean-up removed them, so the next start could never complete it."""
    folder = str(tmp_path)
    target = os.path.join(folder, "r.results.json")
    tmp = os.path.join(folder, f".tmp-r.results.json~{_host()}-{DEAD_PID}~0001")
    with open(tmp, "w") as f:
        f.write("{}")
    os.mkdir(target)  # the rename of a file onto a folder fails: the unit waits
    _journal(folder, json.dumps({"renames": [[tmp, target]], "removals": [], "appends": []}))
    clean_stale_temps(folder)
    assert os.path.exists(tmp)


def test_overwrite_removes_a_run_s_files_in_the_reverse_of_the_commit_order(tmp_path, monkeypatch):
    from reform_eval.evaluation import merge
    cfg = write_custom_dataset(str(tmp_path / "data"), n=3)
    out = tmp_path / "out"
    argv = ["--model", "random", "--dataset_name", "custom", "--dataset_config", cfg, "--output_dir", str(out),
            "--do_eval"]
    assert run_eval.main(argv) == 0
    (pred,) = prediction_files(str(out))
    stem = pred[:-len(".json")]
    removed = []
    real = merge.discard
    monkeypatch.setattr(merge, "discard", lambda p: (removed.append(p), real(p)))
    assert run_eval.main(argv + ["--overwrite"]) == 0
    order = [p[len(stem):] for p in removed if p.startswith(stem)]
    assert order == [".results.json", ".report", ".per_sample.json", ".results.md", ".json"], order


def test_a_long_prediction_name_is_shortened_the_same_way_every_time():
    from types import SimpleNamespace

    from reform_eval.evaluation.plan import MAX_STEM_BYTES, prediction_path
    cfg = SimpleNamespace(model=SimpleNamespace(name="m", family="f" * 300),
                          dataset=SimpleNamespace(name="d" * 200 + "é" * 30, formulation="Generation"),
                          generation=SimpleNamespace(infer_method="generation"), output=SimpleNamespace(output_dir="/o"))
    path = prediction_path(cfg, "0123456789ab")
    stem = os.path.basename(path)[:-len(".json")]
    assert len(stem.encode()) <= MAX_STEM_BYTES and stem.endswith("_0123456789ab")
    assert prediction_path(cfg, "0123456789ab") == path


@pytest.mark.parametrize("how", ["removal", "append", "rename", "dotdot", "link"])
def test_a_journal_never_acts_outside_its_output_folder(how, tmp_path, caplog):
    """A journal naming a folder elsewhere (a removal, an index line, a rename, a '..' path, or a
    path through a link out of the tree) is set aside with one line: one start of run_eval
    removed a folder outside its output folder and appended to a file there."""
    out, victim = tmp_path / "out", tmp_path / "victim"
    out.mkdir()
    (victim / "sub").mkdir(parents=True)
    (victim / "sub" / "keep.txt").write_text("precious")
    (victim / "index.txt").write_text("line\n")
    os.symlink(str(victim), str(out / "link"))
    tmp = f".tmp-x~{_host()}-{DEAD_PID}~0002"
    journal = {"renames": [], "removals": [], "appends": []}
    if how == "removal":
        journal["removals"] = [str(victim / "sub")]
    elif how == "append":
        journal["appends"] = [[str(victim / "index.txt"), {"commit": "c9"}]]
    elif how == "rename":
        (victim / tmp).write_text("x")
        journal["renames"] = [[str(victim / tmp), str(victim / "sub")]]
    elif how == "dotdot":
        journal["removals"] = [str(out) + "/../victim/sub"]
    else:
        journal["removals"] = [str(out / "link" / "sub")]
    path = _journal(str(out), json.dumps(journal))
    with caplog.at_level(logging.WARNING):
        clean_stale_temps(str(out), depth=2)
    assert (victim / "sub" / "keep.txt").read_text() == "precious"
    assert (victim / "index.txt").read_text() == "line\n"
    lines = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(lines) == 1 and "outside the output folder" in lines[0] and "set aside as" in lines[0], lines
    assert not os.path.exists(path)


def test_a_journal_inside_its_tree_still_completes(tmp_path):
    """The confinement keeps the ordinary recovery: a journal in a sub-folder may name the
    output folder's index (the tree being started in)."""
    out = tmp_path / "out"
    (out / "run").mkdir(parents=True)
    (out / "run" / "old.txt").write_text("old")
    journal = {"renames": [], "removals": [str(out / "run" / "old.txt")],
               "appends": [[str(out / "runs.jsonl"), {"commit": "c1"}]]}
    _journal(str(out / "run"), json.dumps(journal))
    clean_stale_temps(str(out), depth=2)
    assert not (out / "run" / "old.txt").exists()
    assert json.loads((out / "runs.jsonl").read_text()) == {"commit": "c1"}


def test_a_huge_pid_in_a_journal_name_is_a_gone_process(tmp_path, caplog):
    """``.commit~<host>-99999999999999999999~x.json`` made every start end as 'internal error
    ... OverflowError' (os.kill of a pid past the C int)."""
    path = tmp_path / f"{JOURNAL_PREFIX}{_host()}-99999999999999999999~abcd.json"
    path.write_text(json.dumps({"renames": [], "removals": [], "appends": []}))
    clean_stale_temps(str(tmp_path))
    assert not path.exists()
    from reform_eval.utils.runlock import pid_alive
    assert not pid_alive(10**20) and not pid_alive(-5) and not pid_alive(0) and pid_alive(os.getpid())


def test_a_huge_pid_in_an_image_memo_segment_name_is_a_gone_writer():
    """``seg-<host>-99999999999999999999-zz.jsonl`` with more than 16 segments: the compaction
    asked os.kill about it and every start ended as an OverflowError."""
    import socket
    from reform_eval.utils.file_hashes import _owner_gone
    assert _owner_gone(f"seg-{socket.gethostname()}-99999999999999999999-zz.jsonl")
