"""The first ten minutes: shipped configs by name from any directory, --help lists every
dataset, case-insensitive names, a quiet console, and the package ships its configs."""
from __future__ import annotations

import pytest

import glob
import os
import subprocess
import sys
import zipfile

from reform_eval import run_eval
from tests.conftest import prediction_files

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_help_lists_every_dataset_and_shipped_config():
    from reform_eval.build.registry import BUILDERS
    text = run_eval.build_parser().format_help()
    flat = " ".join(text.split())
    for name in BUILDERS:
        assert name in flat, name
    assert "custom" in flat and "iwisdm_high" in flat and "whole groups" in flat


def test_config_by_name_from_any_directory_and_lowercase_names(tmp_path):
    env = dict(os.environ, PYTHONPATH=ROOT)
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "run_eval.py"), "--model", "random",
                           "--dataset_name", "iwisdm", "--formulation", "singlechoice",
                           "--dataset_config", "iwisdm_low", "--dataset_subsample", "4", "--output_dir", "out"],
                          cwd=tmp_path, capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""  # quiet console: nothing but errors (none here)
    (pred,) = prediction_files(tmp_path / "out")
    assert os.path.basename(pred).startswith("iWISDM_SingleChoice_")


def test_wheel_ships_dataset_configs_and_data(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                           ROOT, "-w", str(tmp_path)], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    (wheel,) = glob.glob(str(tmp_path / "*.whl"))
    names = set(zipfile.ZipFile(wheel).namelist())
    shipped = {f"reform_eval/configs/datasets/{n}" for n in os.listdir(os.path.join(ROOT, "configs", "datasets"))}
    assert shipped and shipped <= names
    # one import package at the top of site-packages, nothing else (docs/architecture.md, "One package")
    assert {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")} == {"reform_eval"}
    data = os.path.join(ROOT, "configs", "data")
    if os.path.isdir(data):
        files = {"reform_eval/" + os.path.relpath(os.path.join(r, n), ROOT) for r, _, fs in os.walk(data) for n in fs}
        assert files and files <= names, files - names


def _help_entries(parser):
    """(flag, help text) of every option of a parser."""
    return [(a.option_strings[-1], parser._get_formatter()._expand_help(a) if a.help else "")
            for a in parser._actions if a.option_strings and a.dest != "help"]


def test_every_flag_has_help_and_each_default_shows_once():
    from reform_eval import run_loader_eval
    from reform_eval.models import available_models
    for parser in (run_eval.build_parser(), run_loader_eval.build_parser()):
        for flag, text in _help_entries(parser):
            assert text.strip(), f"{flag} has no help text"
            assert text.count("default") <= 1, f"{flag}: {text}"
    flat = " ".join(run_eval.build_parser().format_help().split())
    for family in available_models():
        assert family in flat, family
    assert "from the current directory" in flat  # where --dataset_option paths are resolved
    for default in ("DataLoader workers that decode images (default: 0)", "the one seed for everything (default: 0)",
                    "samples with per-sample seeds (default: 0.0)"):
        assert default in flat, default  # a default of 0 is shown (0 == False must not hide it)


def test_logged_command_is_rebuilt_from_the_config_without_the_key(tmp_path):
    from reform_eval.evaluation.config import RunConfig
    secret = "sk-live-abcdef123456"
    cfg = RunConfig.from_argv(["--model", "openai_api", "--dataset_name", "custom", "--model_option",
                               f"api_key={secret}", "--model_option", "max_concurrency=2", "--seed", "4"])
    line = cfg.command_line()
    assert secret not in line and secret not in repr(cfg) and secret not in str(cfg.to_dict())
    assert secret not in str(cfg.flags())
    assert "--seed 4" in line and "max_concurrency=2" in line and "api_key=<redacted>" in line
    # the rebuilt line parses back to the same config (the key redacted)
    again = RunConfig.from_argv(line.split()[1:])
    assert again.generation == cfg.generation and again.dataset == cfg.dataset
    assert cfg.model.options["api_key"].reveal() == secret


@pytest.mark.slow  # (multi-process; the quick subset keeps a lighter test of the same path)
def test_ctrl_c_prints_one_line_and_the_run_resumes(tmp_path):
    import signal
    import time
    out = tmp_path / "out"
    cmd = [sys.executable, os.path.join(ROOT, "run_eval.py"), "--model", "llava", "--model_name", "tiny",
           "--dataset_name", "iWISDM", "--dataset_config", "iwisdm_low", "--infer_method", "likelihood",
           "--output_dir", str(out)]
    # SIGINT as at a terminal: a suite started in the background (`cmd &` without job control)
    # inherits SIGINT ignored, and a child that inherits it ignored never sees Ctrl-C
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.time() + 120
    shard = None
    while time.time() < deadline and proc.poll() is None:  # wait until some samples are saved
        shards = glob.glob(str(out / ".shards_*" / "*.jsonl"))
        if shards and os.path.getsize(shards[0]) > 0:
            shard = shards[0]
            break
        time.sleep(0.05)
    assert shard, "the run never saved a sample"
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and "interrupted" in lines[0] and "samples are saved" in lines[0], err
    assert "re-running the same command resumes" in lines[0]
    saved = int(lines[0].split("interrupted: ")[1].split(" of ")[0])
    assert saved >= 1
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert len(prediction_files(out)) == 1


def test_a_key_that_fails_to_parse_is_not_printed(tmp_path, capsys):
    secret = "sk-unparsable-98765: [x"
    rc = run_eval.main(["--model", "openai_api", "--dataset_name", "custom", "--output_dir", str(tmp_path / "o"),
                        "--model_option", f"api_key={secret}"])
    err = capsys.readouterr().err
    assert rc == 2 and "sk-unparsable" not in err and "cannot parse the value of api_key" in err
    assert not os.path.exists(tmp_path / "o")


def test_dataset_option_paths_are_read_from_the_current_directory(tmp_path, monkeypatch):
    """A relative --dataset_option path means what it means on the command line: from the current
    directory, not from the dataset config's folder."""
    from tests.conftest import write_custom_dataset
    cfg = write_custom_dataset(str(tmp_path / "conf"), n=4)
    other = tmp_path / "work" / "data"
    write_custom_dataset(str(other), n=6)
    monkeypatch.chdir(tmp_path / "work")
    out = tmp_path / "out"
    assert run_eval.main(["--model", "random", "--dataset_name", "custom", "--dataset_config", cfg,
                          "--dataset_option", "data_file=data/items.jsonl", "--output_dir", str(out)]) == 0
    (pred,) = prediction_files(out)
    import json
    assert len(json.load(open(pred))) == 6  # the cwd's items, not the config folder's (4)


def test_python_api_config_is_checked_like_the_command_line(tmp_path):
    """A RunConfig built in Python is validated like argv: types, credentials, flags a family
    does not read."""
    import pytest as _pytest
    from reform_eval.evaluation import DatasetConfig, ModelConfig, OutputConfig, RunConfig
    from reform_eval.utils.errors import ReformError
    from reform_eval.utils.secrets import Secret
    (tmp_path / "x.yaml").write_text("data_file: items.jsonl\n")  # (files that exist: a typo is told first)
    (tmp_path / "items.jsonl").write_text("")
    base = dict(model=ModelConfig("random"), dataset=DatasetConfig("custom", config=str(tmp_path / "x.yaml")),
                output=OutputConfig(str(tmp_path / "o")))
    for bad in (dict(dataset=DatasetConfig("custom", shuffle_options="false")),
                dict(output=OutputConfig(str(tmp_path), overwrite="false")),
                dict(model=ModelConfig("random", options=None))):
        with _pytest.raises(ReformError, match="expected"):
            RunConfig(**{**base, **bad}).validated()
    with _pytest.raises(ReformError, match="--model_name: not used by model 'random'"):
        RunConfig(**{**base, "model": ModelConfig("random", "foo")}).validated()
    with _pytest.raises(ReformError, match="not used by model 'random'"):
        RunConfig(**{**base, "model": ModelConfig("random", options={"system_msg": "x"})}).validated()
    cfg = RunConfig(model=ModelConfig("openai_api", "gpt", options={"api_key": "sk-python-api-123",
                                                                     "extra_body": {"auth": {"token": "tok-999999"}}}),
                    dataset=DatasetConfig("custom"), output=OutputConfig(str(tmp_path / "o"))).validated()
    assert isinstance(cfg.model.options["api_key"], Secret)
    assert isinstance(cfg.model.options["extra_body"]["auth"]["token"], Secret)
    line = cfg.command_line() + str(cfg.flags())
    assert "sk-python-api-123" not in line and "tok-999999" not in line


def test_the_recorded_command_parses_back_to_the_same_config():
    from reform_eval.evaluation.config import RunConfig
    argv = ["--model", "llava", "--model_name", "tiny", "--dataset_name", "custom",
            "--model_option", "system_msg='42'", "--model_option", "max_new_tokens=3",
            "--dataset_option", "data_file=items.jsonl", "--metric_option", "strip_reasoning=true",
            "--shuffle_options", "false", "--seed", "9"]
    cfg = RunConfig.from_argv(argv)
    assert cfg.model.options["system_msg"] == "42"
    import shlex
    again = RunConfig.from_argv(shlex.split(cfg.command_line())[1:])
    assert again == cfg


def test_usage_errors_and_repeated_keys_are_one_line(tmp_path, capsys):
    import pytest as _pytest
    with _pytest.raises(SystemExit) as e:
        run_eval.main(["--model", "random", "--dataset_name", "iWISDM", "--per_gpu_eval_batch_size", "abc"])
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert e.value.code == 2 and len(err) == 1 and "invalid int value" in err[0]
    rc = run_eval.main(["--model", "random", "--dataset_name", "custom", "--dataset_option", "data_file=a",
                        "--dataset_option", "data_file=b", "--output_dir", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert rc == 2 and "data_file: given twice" in err and not (tmp_path / "o").exists()


def test_an_internal_error_names_the_stage_it_happened_in(tmp_path, capsys, monkeypatch):
    import reform_eval.evaluation.calls as calls
    def boom(*a, **k):
        raise ZeroDivisionError("simulated bug")
    monkeypatch.setattr(calls.Runner, "run", boom)
    rc = run_eval.main(["--model", "random", "--dataset_name", "iWISDM", "--dataset_config", "iwisdm_low",
                        "--dataset_subsample", "2", "--output_dir", str(tmp_path / "o")])
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert rc == 1 and len(err) == 1, err
    assert "internal error while running the model: ZeroDivisionError: simulated bug" in err[0]
    assert "Traceback" in open(tmp_path / "o" / "log.txt").read()


def test_mme_placeholder_command_is_quiet_and_the_old_spelling_says_where_it_went(tmp_path):
    """``python -m reform_eval.build.mme_placeholder`` prints the folder it wrote and nothing else (no
    RuntimeWarning from running a module the package already imported)."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = str(tmp_path / "release")
    done = subprocess.run([sys.executable, "-W", "default", "-m", "reform_eval.build.mme_placeholder", "--questions",
                           os.path.join(root, "configs", "data", "mme_questions"), "--out", out],
                          cwd=root, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stderr == "" and done.stdout == out + "\n"
    assert len(os.listdir(os.path.join(out, "existence"))) == 60  # 30 images and their 30 answer files
    old = subprocess.run([sys.executable, "-m", "reform_eval.build.mme", "placeholder"], cwd=root, capture_output=True,
                         text=True, timeout=300)
    assert old.returncode == 1 and "use: python -m reform_eval.build.mme_placeholder" in old.stderr


def test_globs_and_shell_expanded_names_skip_what_the_tool_wrote(tmp_path, capsys, caplog):
    """After a comparison written into a folder beside the predictions, a quoted glob, the
    names a shell expands from ``*.json``, and the folder itself all score only predictions; a
    results file named alone, or a JSON object that holds no records, is refused in one line."""
    import glob as globmod
    import json

    from reform_eval import run_loader_eval
    from tests.conftest import write_custom_dataset
    cfg = write_custom_dataset(str(tmp_path / "data"), n=6, formulation="Generation")
    out = tmp_path / "out"
    for model in ("random", "constant"):
        assert run_eval.main(["--model", model, "--dataset_name", "custom", "--dataset_config", cfg,
                              "--formulation", "Generation", "--output_dir", str(out), "--do_eval"]) == 0
    preds = prediction_files(out)
    assert len(preds) == 2
    assert run_loader_eval.main(["--prediction_file", str(out), "--output_dir", str(out / "report")]) == 0
    capsys.readouterr()
    for argv in ([str(out / "*")], sorted(globmod.glob(str(out / "*.json"))), sorted(globmod.glob(str(out / "*")))):
        assert run_loader_eval.main(["--prediction_file", *argv, "--output_dir", str(tmp_path / "again")]) == 0, argv
        comp = json.load(open(tmp_path / "again" / "comparison.json"))
        assert sorted(m["prediction_file"] for m in comp["models"]) == sorted(preds)
    err = capsys.readouterr().err + caplog.text  # (the log line goes where logging was set up)
    assert "skipped" in err and "this tool wrote" in err
    results = globmod.glob(str(out / "*.results.json"))[0]
    assert run_loader_eval.main(["--prediction_file", results]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "is a file this tool writes" in err[0] and "malformed" not in err[0]
    obj = tmp_path / "notes.json"
    obj.write_text(json.dumps({"model": "x", "scores": [1, 2]}, indent=2))
    assert run_loader_eval.main(["--prediction_file", str(obj)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "holds one JSON object, not records" in err[0]


def test_a_misspelled_flag_is_named_before_the_required_one_it_hides(capsys):
    import pytest
    with pytest.raises(SystemExit) as e:
        run_eval.main(["--modle", "llava", "--dataset_name", "iWISDM"])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err == "error: unrecognized arguments: --modle (did you mean --model?) (see run_eval.py --help)"
    with pytest.raises(SystemExit):
        run_eval.main(["--model", "random", "--dataset_name", "iWISDM", "--dataset_sub", "x"])
    assert "argument --dataset_subsample: invalid int value: 'x'" in capsys.readouterr().err  # an abbreviation
    with pytest.raises(SystemExit):  # a value that looks like a flag: argparse's own message stands
        run_eval.main(["--model", "random", "--dataset_name", "iWISDM", "--model_name", "--odd"])
    assert "argument --model_name: expected one argument" in capsys.readouterr().err


def test_a_subsample_as_large_as_the_data_is_the_same_run(tmp_path, capsys):
    """The identity covers the samples drawn, not the flag's number: --dataset_subsample 1000 of
    a 100-trial set draws all 100, the run of --dataset_subsample 100, and reuses its predictions."""
    common = ["--model", "random", "--dataset_name", "iWISDM", "--dataset_config", "iwisdm_low",
              "--output_dir", str(tmp_path / "out")]
    assert run_eval.main([*common, "--dataset_subsample", "100"]) == 0
    first = prediction_files(tmp_path / "out")
    assert run_eval.main([*common, "--dataset_subsample", "1000"]) == 0
    assert prediction_files(tmp_path / "out") == first
    assert run_eval.main([*common, "--dataset_subsample", "10"]) == 0
    assert len(prediction_files(tmp_path / "out")) == 2


def test_a_prediction_folder_stays_one_after_a_comparison_is_written_into_it(tmp_path, capsys):
    """The comparison of a folder's files lands in that folder by default; scoring the folder
    again must find the same predictions, and a user's file named ``*runs.jsonl`` is a prediction file."""
    import json
    import shutil

    from reform_eval import run_loader_eval
    from tests.conftest import write_custom_dataset
    cfg = write_custom_dataset(str(tmp_path / "data"), n=6, formulation="Generation")
    out = tmp_path / "out"
    for model in ("random", "constant"):
        assert run_eval.main(["--model", model, "--dataset_name", "custom", "--dataset_config", cfg,
                              "--formulation", "Generation", "--output_dir", str(out)]) == 0
    folder = tmp_path / "preds"
    folder.mkdir()
    a, b = prediction_files(out)
    shutil.copy(a, folder / "random_runs.jsonl")
    with open(folder / "random_runs.jsonl", "w") as f:  # JSONL, named like our runs.jsonl index
        f.write("".join(json.dumps(r) + "\n" for r in json.load(open(a))))
    shutil.copy(b, folder / "constant.json")
    for _ in range(2):
        assert run_loader_eval.main(["--prediction_file", f"{folder}/"]) == 0
        comp = json.load(open(folder / "comparison.json"))
        assert len(comp["models"]) == 2
    assert os.path.isfile(folder / "report.html")


def test_a_dataset_name_that_contradicts_the_records_is_refused(tmp_path, capsys):
    """--dataset_name names what the records fix, as --formulation does: iWISDM predictions with
    --dataset_name MME, MMMT-IF turns with MME, MME answers with MMMT-IF are refused in one line
    (exit 2) with nothing written; the name that agrees (any case) still scores."""
    import json
    from reform_eval import run_loader_eval
    from tests.report_fixtures import mme_records, mmmt_if_records
    assert run_eval.main(["--model", "random", "--dataset_name", "iWISDM", "--dataset_config", "iwisdm_low",
                          "--dataset_subsample", "4", "--output_dir", str(tmp_path / "iw")]) == 0
    (iwisdm,) = prediction_files(tmp_path / "iw")
    files = {"iWISDM": iwisdm, "MME": str(tmp_path / "mme.json"), "MMMT-IF": str(tmp_path / "pif.json")}
    (tmp_path / "mme.json").write_text(json.dumps(mme_records(seed=1, images=2)))
    (tmp_path / "pif.json").write_text(json.dumps(mmmt_if_records(seed=1)))
    capsys.readouterr()
    for given, theirs in (("MME", "iWISDM"), ("MME", "MMMT-IF"), ("MMMT-IF", "MME"), ("custom", "iWISDM")):
        out = tmp_path / f"out-{given}-{theirs}"
        assert run_loader_eval.main(["--dataset_name", given, "--prediction_file", files[theirs],
                                     "--output_dir", str(out)]) == 2, (given, theirs)
        printed, err = capsys.readouterr()
        assert printed == "" and err.strip().splitlines() == [
            f"error: {files[theirs]}: --dataset_name '{given}' contradicts the records, which are '{theirs}'; "
            "leave --dataset_name out to read it from the records"]
        assert not out.exists()
    assert run_loader_eval.main(["--explain", files["MME"], files["MME"], "--dataset_name", "iWISDM"]) == 2
    assert "contradicts the records, which are 'MME'" in capsys.readouterr().err
    assert run_loader_eval.main(["--dataset_name", "mme", "--prediction_file", files["MME"],
                                 "--output_dir", str(tmp_path / "agrees")]) == 0


def test_dataset_name_and_the_records_benchmark_are_one_name_case_insensitive(tmp_path, capsys):
    """MME records scored as MME whether they name their benchmark as registered ("MME"), in
    another case ("mme", with or without --dataset_name mme), or not at all under --dataset_name
    MME: one metric, one total score, never the generic exact match."""
    import glob
    import json as _json
    from reform_eval import run_loader_eval as rle
    from tests.report_fixtures import mme_records
    base = mme_records(seed=3)
    variants = {"as_registered": (base, []),
                "lower": ([dict(r, benchmark="mme") for r in base], []),
                "lower_flag": ([dict(r, benchmark="mme") for r in base], ["--dataset_name", "mme"]),
                "none_flag": ([{k: v for k, v in r.items() if k != "benchmark"} for r in base], ["--dataset_name", "MME"])}
    seen = {}
    for name, (recs, flags) in variants.items():
        pred = tmp_path / f"{name}.json"
        pred.write_text(_json.dumps(recs))
        out = tmp_path / f"out_{name}"
        assert rle.main(["--prediction_file", str(pred), "--output_dir", str(out)] + flags) == 0, capsys.readouterr().err
        (res,) = glob.glob(str(out / "*.results.json"))
        result = _json.load(open(res))
        seen[name] = (result["metric"], result["metrics"]["total_score"])
    capsys.readouterr()
    assert seen["as_registered"][0] == "mme"
    assert set(seen.values()) == {seen["as_registered"]}, seen
