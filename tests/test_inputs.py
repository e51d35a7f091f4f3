"""Issue 16: one input boundary (utils/inputs.py), one output commit (utils/commit.py), names.

Each reader is fed garbage and must answer with one ``ReformError`` line naming the file (and
the record and field where there is one), writing nothing. Each writer must leave the previous
state or nothing when it fails, and our temporaries must be cleaned at the next start.
"""
from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import sys
import zlib

import pytest
from PIL import Image

from reform_eval import run_loader_eval
from reform_eval.build.iwisdm.io import read_trials
from reform_eval.build.iwisdm.stimuli import DEFAULT_CATEGORIES, DirectoryStimuli, ProceduralStimuli
from reform_eval.build.mmmt_if import load_mmdu, load_release
from reform_eval.build.registry import load_config
from reform_eval.evaluation.reporting.report import compare_runs
from reform_eval.evaluation.reporting.html import Thumbnails
from reform_eval.evaluation.reporting.scoring import evaluate_files, loader_eval, score_records
from reform_eval.metrics.mme import read_official_results, write_official_results
from tests.report_fixtures import iwisdm_records, mme_records, run
from reform_eval.utils.commit import Commit, clean_stale_temps, owner_prefix
from reform_eval.utils.errors import ReformError
from reform_eval.utils.inputs import MAX_CSV_FIELD, list_dir

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RELEASE = os.path.join(ROOT, "configs", "data", "mmmt_if_release.csv")
GOOD = {"sample_id": "a", "dup_index": 0, "benchmark": "custom", "formulation": "SingleChoice",
        "inference_method": "likelihood", "answer_options": ["x", "y"], "answer": 0, "prediction": 0,
        "candidate_logprobs": [-1.0, -2.0], "candidate_num_tokens": [1, 1]}
GOOD_TEXT = json.dumps([GOOD, dict(GOOD, sample_id="b", prediction=1, candidate_logprobs=[-3.0, -2.0])])


def files_under(d) -> list:
    """Every file and folder below ``d`` (relative), sorted."""
    out = []
    for root, dirs, files in os.walk(d):
        out += [os.path.relpath(os.path.join(root, n), d) for n in dirs + files]
    return sorted(out)


def one_line(capsys, rc, *needles) -> str:
    """exit 2 and exactly one stderr line holding every needle."""
    err = capsys.readouterr().err
    assert rc == 2, err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1, err
    for n in needles:
        assert n in lines[0], (n, lines[0])
    return lines[0]


def error_line(fn, *needles) -> str:
    """``fn()`` raises a ReformError of one line holding every needle."""
    with pytest.raises(ReformError) as e:
        fn()
    msg = str(e.value)
    assert "\n" not in msg, msg
    for n in needles:
        assert n in msg, (n, msg)
    return msg


# ------------------------------------------------------------------ prediction files, through the CLI
DEEP_META = dict(GOOD, meta=json.loads("[" * 500 + "]" * 500))
BAD_FILES = {
    "latin1": (b'[{"sample_id": "caf\xe9"}]', ["not UTF-8", "offset 19"]),
    "truncated": (GOOD_TEXT[:-7].encode(), ["malformed JSON"]),
    "deep": (b"[" * 100_000 + b"]" * 100_000, ["nested too deeply"]),
    "deep_meta": (json.dumps([DEEP_META]).encode(), ["record 0", "field 'meta'", "nested too deeply"]),
    "digits400": (GOOD_TEXT.replace("-1.0", "-" + "9" * 400, 1).encode(),
                  ["record 0", "field 'candidate_logprobs'", "400 digits", "too large"]),
    "surrogate": (GOOD_TEXT.replace('"a"', '"a\\ud800"', 1).encode(), ["record 0", "field 'sample_id'", "surrogate"]),
    "jsonl_deep_line": ((json.dumps(GOOD) + "\n" + json.dumps(DEEP_META) + "\n").encode(),
                        ["record line 2", "field 'meta'", "nested too deeply"]),
}


@pytest.mark.parametrize("name", sorted(BAD_FILES))
def test_prediction_file_garbage_is_one_line_and_writes_nothing(tmp_path, capsys, name):
    content, needles = BAD_FILES[name]
    path = tmp_path / f"{name}.json"
    path.write_bytes(content)
    out = tmp_path / "out"
    rc = run_loader_eval.main(["--prediction_file", str(path), "--output_dir", str(out)])
    one_line(capsys, rc, f"{name}.json", *needles)
    assert files_under(tmp_path) == [f"{name}.json"]  # not even the output folder is made


def test_bom_prefixed_prediction_file_is_read(tmp_path, capsys):
    path = tmp_path / "bom.json"
    path.write_bytes(b"\xef\xbb\xbf" + GOOD_TEXT.encode())
    assert run_loader_eval.main(["--prediction_file", str(path)]) == 0
    res = [n for n in os.listdir(tmp_path) if n.endswith(".results.json")]
    assert len(res) == 1 and json.load(open(tmp_path / res[0]))["metrics"]["accuracy"] == 0.5


def test_non_utf8_output_dir_name_is_one_line(tmp_path, capsys):
    path = tmp_path / "p.json"
    path.write_text(GOOD_TEXT)
    out = os.fsdecode(os.fsencode(str(tmp_path)) + b"/out\xff")
    rc = run_loader_eval.main(["--prediction_file", str(path), "--output_dir", out])
    one_line(capsys, rc, "--output_dir name is not UTF-8")
    assert files_under(tmp_path) == ["p.json"]


# ------------------------------------------------------------------ CSV, MMDU JSON, YAML, trials
def test_release_csv_oversized_field_and_bad_bytes(tmp_path):
    header = open(RELEASE, encoding="utf-8").readline()
    big = tmp_path / "big.csv"
    big.write_text(header + '"c1",1,"' + "x" * (MAX_CSV_FIELD + 1) + '"' + ",x" * (header.count(",") - 2) + "\n")
    error_line(lambda: load_release(str(big)), "big.csv", "line 2", f"longer than {MAX_CSV_FIELD}")
    ragged = tmp_path / "ragged.csv"
    ragged.write_text(header + "c1,1,prompt\n")
    error_line(lambda: load_release(str(ragged)), "ragged.csv", "line 2", "3 fields")
    latin = tmp_path / "latin.csv"
    latin.write_bytes(header.encode() + b"c1,caf\xe9\n")
    error_line(lambda: load_release(str(latin)), "latin.csv", "not UTF-8", f"offset {len(header) + 6}", "line 2")


def test_release_csv_with_bom_reads_like_without(tmp_path):
    bom = tmp_path / "bom.csv"
    bom.write_bytes(b"\xef\xbb\xbf" + open(RELEASE, "rb").read())
    assert len(load_release(str(bom)).turns) == len(load_release(RELEASE).turns) == 990


def test_release_csv_via_cli_oversized_field_is_one_line(tmp_path, capsys):
    header = open(RELEASE, encoding="utf-8").readline()
    big = tmp_path / "big.csv"
    big.write_text(header + '"c1",1,"' + "x" * (MAX_CSV_FIELD + 1) + '"' + ",x" * (header.count(",") - 2) + "\n")
    rc = run_loader_eval.main(["--prediction_file", str(big), "--dataset_name", "MMMT-IF"])
    one_line(capsys, rc, "big.csv", "longer than")
    assert files_under(tmp_path) == ["big.csv"]


def test_mmdu_json_bom_latin1_and_depth(tmp_path):
    chat = [{"id": "c1", "image": [], "conversations": [{"from": "user", "value": "q"},
                                                        {"from": "assistant", "value": "a"}]}]
    bom = tmp_path / "bom.json"
    bom.write_bytes(b"\xef\xbb\xbf" + json.dumps(chat).encode())
    assert [c.chat_id for c in load_mmdu(str(bom))] == ["c1"]
    latin = tmp_path / "latin.json"
    latin.write_bytes(json.dumps(chat).encode().replace(b'"q"', b'"\xe9"'))
    error_line(lambda: load_mmdu(str(latin)), "latin.json", "not UTF-8", "offset")
    deep = tmp_path / "deep.json"
    deep.write_bytes(b"[" * 100_000 + b"]" * 100_000)
    error_line(lambda: load_mmdu(str(deep)), "deep.json", "nested too deeply")


def test_yaml_config_nested_too_deeply(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("data_file: " + "[" * 200 + "]" * 200 + "\n")
    error_line(lambda: load_config(str(cfg)), "c.yaml", "nested too deeply")


def test_trial_folder_garbage(tmp_path):
    (tmp_path / "index.json").write_bytes(b"[" * 100_000 + b"]" * 100_000)
    error_line(lambda: read_trials(str(tmp_path)), "index.json", "nested too deeply")
    (tmp_path / "index.json").write_bytes(b'{"trials": ["caf\xe9"]}')
    error_line(lambda: read_trials(str(tmp_path)), "index.json", "not UTF-8")


def test_two_stimulus_categories_of_one_name_are_refused(tmp_path):
    with pytest.raises(ReformError, match="two stimulus categories are named"):
        ProceduralStimuli(categories=[DEFAULT_CATEGORIES[0], DEFAULT_CATEGORIES[0]])
    split = ProceduralStimuli(categories=DEFAULT_CATEGORIES[:2], n_identities=1).export(str(tmp_path))
    meta = os.path.join(split, "train_metadata.csv")
    DirectoryStimuli(str(tmp_path))  # as exported: fine
    text = open(meta, encoding="utf-8").read().replace(DEFAULT_CATEGORIES[1], DEFAULT_CATEGORIES[0])
    open(meta, "w", encoding="utf-8").write(text)
    error_line(lambda: DirectoryStimuli(str(tmp_path)), "train_metadata.csv", "two stimulus categories are named",
               repr(DEFAULT_CATEGORIES[0]))


# ------------------------------------------------------------------ folders: links, case twins, names
def mme_folder(d) -> str:
    write_official_results(mme_records(images=2), str(d))
    return str(d)


def test_mme_results_folder_dangling_symlink(tmp_path, capsys):
    d = mme_folder(tmp_path / "res")
    os.symlink(str(tmp_path / "gone.txt"), os.path.join(d, "OCR.txt.bak.txt"))
    rc = run_loader_eval.main(["--prediction_file", d, "--dataset_name", "MME", "--output_dir", str(tmp_path / "o")])
    one_line(capsys, rc, "OCR.txt.bak.txt", "dangling symbolic link")
    assert not os.path.exists(tmp_path / "o") or not os.listdir(tmp_path / "o")


def test_mme_results_folder_case_twins_are_refused_naming_both(tmp_path):
    d = mme_folder(tmp_path / "res")
    shutil.copy(os.path.join(d, "existence.txt"), os.path.join(d, "Existence.txt"))
    error_line(lambda: read_official_results(d), "res", "'Existence.txt'", "'existence.txt'", "differ only in case")


def test_non_utf8_file_name_in_a_folder_is_one_line(tmp_path):
    d = mme_folder(tmp_path / "res")
    open(os.fsencode(d) + b"/caf\xe9.txt", "w").close()
    error_line(lambda: read_official_results(d), "res", "not UTF-8", "caf\\udce9")
    error_line(lambda: list_dir(d), "not UTF-8")


# ------------------------------------------------------------------ the report's pixel guard
def png_header(width: int, height: int) -> bytes:
    """A PNG whose header claims ``width`` x ``height`` (the pixel data is not there)."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(b"\0" * 16)) + chunk(b"IEND", b""))


def test_thumbnailer_uses_the_loaders_pixel_guard(tmp_path, monkeypatch):
    huge = tmp_path / "huge.png"
    huge.write_bytes(png_header(20000, 20000))
    thumbs = Thumbnails()
    assert thumbs.add(str(huge)) is None and thumbs.data == []
    small = tmp_path / "small.png"
    Image.new("RGB", (100, 100), (200, 10, 10)).save(small)
    monkeypatch.setenv("REFORM_MAX_IMAGE_PIXELS", "5000")  # the same limit the loaders obey
    assert Thumbnails().add(str(small)) is None
    monkeypatch.delenv("REFORM_MAX_IMAGE_PIXELS")
    assert Thumbnails().add(str(small)) == 0


def test_report_of_records_naming_a_huge_png_is_written(tmp_path):
    (tmp_path / "huge.png").write_bytes(png_header(20000, 20000))
    recs = iwisdm_records(n=6)
    for r in recs:
        r["image_ids"] = [str(tmp_path / "huge.png")]
    comp = compare_runs([run("a", recs)], str(tmp_path / "rep"), n_boot=20, plots=False)
    assert os.path.isfile(comp["files"]["report_html"])


# ------------------------------------------------------------------ output commit
def test_unwritable_record_leaves_nothing(tmp_path):
    """The issue's case: a lone surrogate (valid JSON) used to write .results.json and
    .results.md, then die before .per_sample.json. Through the API, past the input boundary."""
    recs = [dict(GOOD, sample_id="a\ud800"), dict(GOOD, sample_id="b")]
    error_line(lambda: score_records(recs, prediction_file=str(tmp_path / "p.json"), quiet=True),
               "cannot write", "nothing was changed")
    assert files_under(tmp_path) == []


def test_failure_after_staging_leaves_previous_results(tmp_path, monkeypatch):
    path = tmp_path / "p.json"
    path.write_text(json.dumps(mme_records(images=2)))
    first = loader_eval(str(path), quiet=True)
    before = {n: open(tmp_path / n, "rb").read() for n in os.listdir(tmp_path)}
    import reform_eval.utils.predictions as up

    def boom(records, directory, **kw):
        open(os.path.join(directory, "existence.txt"), "w").close()
        raise ReformError("exporter failed")
    monkeypatch.setitem(up.RESULTS_EXPORTERS, "MME", boom)
    with pytest.raises(ReformError, match="exporter failed"):
        loader_eval(str(path), quiet=True, export_mme_results=str(tmp_path / "official"))
    after = {n: open(tmp_path / n, "rb").read() for n in os.listdir(tmp_path)}
    assert after == before and first["metrics"]["total_score"] > 0


def test_kill_9_leftovers_are_cleaned_at_the_next_start(tmp_path, capsys):
    out = tmp_path / "out"
    code = ("import os, signal; from reform_eval.utils.commit import Commit; c = Commit(); "
            f"c.write_text({str(out / 'comparison.md')!r}, 'x'); d = c.folder({str(out / 'plots')!r}); "
            "open(os.path.join(d, 'a.png'), 'w').close(); os.kill(os.getpid(), signal.SIGKILL)")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT)
    assert proc.returncode == -9
    left = [n for n in os.listdir(out) if n.startswith(".tmp-")]
    assert len(left) == 2 and not os.path.exists(out / "comparison.md")
    live = out / (owner_prefix("report.html") + f"{os.getpid()}~live")  # a live process's: kept
    live.write_text("busy")
    for name in ("a", "b"):
        (tmp_path / f"{name}.json").write_text(GOOD_TEXT.replace('"custom"', f'"custom", "model": "{name}"'))
    assert run_loader_eval.main(["--prediction_file", str(tmp_path / "a.json"), str(tmp_path / "b.json"),
                                 "--output_dir", str(out), "--n_boot", "20"]) == 0
    assert [n for n in os.listdir(out) if n.startswith(".tmp-")] == [live.name]
    assert clean_stale_temps(str(out)) == 0 and live.exists()


def test_second_comparison_into_one_folder_leaves_no_plots_of_the_first(tmp_path):
    out = str(tmp_path / "cmp")
    compare_runs([run("a", iwisdm_records(seed=1)), run("b", iwisdm_records(seed=2))], out, n_boot=20)
    assert any(n.startswith("iwisdm_") for n in os.listdir(os.path.join(out, "plots")))
    comp = compare_runs([run("a", mme_records(seed=1)), run("b", mme_records(seed=2))], out, n_boot=20)
    plots = sorted(os.listdir(os.path.join(out, "plots")))
    assert plots and not any(n.startswith("iwisdm_") for n in plots)
    assert sorted(os.path.basename(p) for p in comp["plots"]) == plots
    assert sorted(os.listdir(out)) == ["comparison.json", "comparison.md", "plots", "report.html"]


def test_export_into_a_folder_of_another_model_is_refused(tmp_path):
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps(mme_records(seed=1, images=2)))
    b.write_text(json.dumps(mme_records(seed=2, images=2, subtasks=("OCR",))))
    exp = tmp_path / "official"
    loader_eval(str(a), quiet=True, export_mme_results=str(exp))
    exported = {n: open(exp / n).read() for n in os.listdir(exp)}
    before = files_under(tmp_path)
    error_line(lambda: loader_eval(str(b), quiet=True, export_mme_results=str(exp)),
               "official", "already holds the export of", "a.json", "nothing was written")
    assert files_under(tmp_path) == before
    assert {n: open(exp / n).read() for n in os.listdir(exp)} == exported
    loader_eval(str(a), quiet=True, export_mme_results=str(exp), likelihood_reduction="mean")  # its own: replaced


def test_export_of_a_non_mme_file_is_refused_before_anything_is_written(tmp_path, capsys):
    path = tmp_path / "p.json"
    path.write_text(GOOD_TEXT)
    rc = run_loader_eval.main(["--prediction_file", str(path), "--export_mme_results", str(tmp_path / "off")])
    one_line(capsys, rc, "p.json", "needs MME records", "custom")
    assert files_under(tmp_path) == ["p.json"]


def test_commit_refuses_a_file_where_a_folder_goes_and_changes_nothing(tmp_path):
    (tmp_path / "plots").write_text("a file")
    c = Commit("x")
    c.write_text(str(tmp_path / "comparison.md"), "new")
    c.folder(str(tmp_path / "plots"))
    error_line(c.commit, "plots", "is not a folder")
    assert files_under(tmp_path) == ["plots"]


# ------------------------------------------------------------------ names
def test_literal_path_with_glob_characters_is_a_path(tmp_path):
    (tmp_path / "model[v2].json").write_text(GOOD_TEXT)
    (tmp_path / "model2.json").write_text(json.dumps([dict(GOOD, prediction=1)]))
    res = evaluate_files([str(tmp_path / "model[v2].json")], quiet=True)
    assert len(res["runs"]) == 1 and res["runs"][0]["result"]["metrics"]["accuracy"] == 0.5
    assert res["runs"][0]["result"]["prediction_file"].endswith("model[v2].json")


def test_glob_skips_our_own_results_files(tmp_path):
    (tmp_path / "m.json").write_text(GOOD_TEXT)
    evaluate_files([str(tmp_path / "m.json")], quiet=True)
    assert any(n.endswith(".per_sample.json") for n in os.listdir(tmp_path))
    res = evaluate_files([str(tmp_path / "*.json")], quiet=True)
    assert len(res["runs"]) == 1 and res["comparison"] is None


def test_models_differing_after_40_characters_get_their_own_results(tmp_path):
    m1, m2 = "m" * 45 + "-one", "m" * 45 + "-two"
    recs = [dict(r, model=m) for m in (m1, m2) for r in json.loads(GOOD_TEXT)]
    (tmp_path / "two.json").write_text(json.dumps(recs))
    evaluate_files([str(tmp_path / "two.json")], quiet=True, n_boot=20)
    results = [n for n in os.listdir(tmp_path) if n.endswith(".results.json")]
    assert len(results) == 2
    assert sorted(json.load(open(tmp_path / n))["num_records"] for n in results) == [2, 2]
