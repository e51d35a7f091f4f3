"""--log_to mlflow / wandb: a scored iWISDM run (random model) logged to the real libraries,
offline, and read back (MLflow through MlflowClient from a local SQLite store; W&B from the
files its offline mode writes)."""
from __future__ import annotations

import glob
import json
import os

import pytest

from reform_eval.evaluation.reporting.scoring import load_records, prediction_files, results_paths, score_records
from reform_eval.evaluation.trackers import log_run, parse_markdown_table, run_content
from reform_eval.utils.errors import ReformError

SECRET = "sk-tracker-secret-999999"


@pytest.fixture(scope="module")
def scored(tmp_path_factory):
    """(result dict as score_records returns it, with the run's config; files) of a real run."""
    from reform_eval import run_eval
    out = tmp_path_factory.mktemp("tracked")
    assert run_eval.main(["--model", "random", "--dataset_name", "iWISDM", "--dataset_config", "iwisdm_low",
                          "--dataset_subsample", "12", "--output_dir", str(out), "--do_eval"]) == 0
    (pred,) = prediction_files(out)
    with open(results_paths(pred)["json"]) as f:
        saved = json.load(f)
    result = score_records(load_records(pred), prediction_file=pred, write=False, quiet=True)
    config = dict(saved["config"], model_option=[f"api_key={SECRET}", "timeout=3"], api_key=SECRET)
    result.update(config=config, run_id=saved["run_id"])
    return result, {"report_dir": pred[:-5] + ".report", "prediction_file": pred}


def test_content_has_cis_breakdowns_verdicts_plots_and_no_credential(scored):
    result, files = scored
    c = run_content(result, files)
    m = result["metrics"]
    assert c["metrics"]["accuracy"] == pytest.approx(m["accuracy"])
    assert c["metrics"]["accuracy_ci_low"] <= m["accuracy"] <= c["metrics"]["accuracy_ci_high"]
    assert c["params"]["api_key"] == "<redacted>" and SECRET not in json.dumps(c)
    assert c["params"]["model"] == "random" and c["params"]["dataset_name"] == "iWISDM"
    cols, rows = c["tables"]["per-sample verdicts"]
    assert len(rows) == 12 and "correct" in cols
    assert sum(r[cols.index("correct")] for r in rows) == round(m["accuracy"] * 12)
    assert any(t.startswith("breakdown complexity") for t in c["tables"])
    assert "iWISDM accuracy by complexity" in c["tables"]
    assert {os.path.basename(p) for p in c["plots"]} >= {"accuracy.png", "iwisdm_complexity.png"}


def test_markdown_tables_parse():
    assert parse_markdown_table("| a | b |\n|---|---:|\n| 1 | x |\n") == (["a", "b"], [["1", "x"]])
    assert parse_markdown_table("no table") is None


def test_unknown_backend_is_one_line(scored):
    with pytest.raises(ReformError, match="valid trackers are mlflow, wandb"):
        log_run("tensorboard", *scored)


@pytest.mark.slow
def test_mlflow_local_store_read_back(scored, tmp_path, monkeypatch):
    pytest.importorskip("mlflow", reason="mlflow not installed (pip install '.[mlflow]')")
    from mlflow.tracking import MlflowClient
    monkeypatch.chdir(tmp_path)  # nothing may land in the current directory
    uri = f"sqlite:///{tmp_path / 'store' / 'mlflow.db'}"
    os.makedirs(tmp_path / "store")
    result, files = scored
    out = log_run("mlflow", result, files, tracking_uri=uri)
    client = MlflowClient(tracking_uri=uri)
    run = client.get_run(out["run_id"])
    assert run.data.metrics["accuracy"] == pytest.approx(result["metrics"]["accuracy"])
    assert "accuracy_ci_low" in run.data.metrics and "accuracy_ci_high" in run.data.metrics
    assert run.data.params["api_key"] == "<redacted>" and run.data.params["model"] == "random"
    assert SECRET not in json.dumps(run.data.params)
    plots = {os.path.basename(a.path) for a in client.list_artifacts(out["run_id"], "plots")}
    assert {"accuracy.png", "iwisdm_complexity.png"} <= plots
    tables = {os.path.basename(a.path) for a in client.list_artifacts(out["run_id"], "tables")}
    assert "per-sample_verdicts.json" in tables
    local = client.download_artifacts(out["run_id"], "tables/per-sample_verdicts.json", str(tmp_path / "dl"))
    with open(local) as f:
        table = json.load(f)
    assert len(table["data"]) == 12 and "correct" in table["columns"]
    assert not os.path.exists(tmp_path / "mlruns")


@pytest.mark.slow
def test_wandb_offline_files(scored, tmp_path, monkeypatch):
    pytest.importorskip("wandb", reason="wandb not installed (pip install '.[wandb]')")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("WANDB_SILENT", "true")
    result, files = scored
    out = log_run("wandb", result, files, directory=str(tmp_path))
    run_dirs = glob.glob(str(tmp_path / "wandb" / "offline-run-*"))
    assert len(run_dirs) == 1 and run_dirs[0].endswith(out["run_id"])
    fdir = os.path.join(run_dirs[0], "files")
    # offline mode keeps config, history and summary in the run's .wandb record log (protobuf: its
    # keys and JSON values are stored as plain bytes)
    with open(glob.glob(os.path.join(run_dirs[0], "run-*.wandb"))[0], "rb") as f:
        log = f.read()
    acc = json.dumps(result["metrics"]["accuracy"]).encode()
    assert b"accuracy_ci_low" in log and b"accuracy_ci_high" in log and acc in log
    assert b"<redacted>" in log and b"dataset_name" in log and b"iWISDM" in log
    assert b"table-file" in log and SECRET.encode() not in log
    tables = glob.glob(os.path.join(fdir, "media", "table", "**", "*.table.json"), recursive=True)
    verdicts = [t for t in tables if "per-sample_verdicts" in t]
    with open(verdicts[0]) as f:
        assert len(json.load(f)["data"]) == 12
    images = glob.glob(os.path.join(fdir, "media", "images", "**", "*.png"), recursive=True)
    assert len(images) >= 2
    for path in glob.glob(str(tmp_path / "wandb" / "**" / "*"), recursive=True):
        if os.path.isfile(path):
            with open(path, "rb") as f:
                assert SECRET.encode() not in f.read(), path


@pytest.mark.parametrize("backend", ["mlflow", "wandb"])
def test_a_missing_extra_is_one_line_naming_the_pip_command(scored, monkeypatch, backend):
    import sys
    monkeypatch.setitem(sys.modules, backend, None)  # as if not installed: import raises ImportError
    with pytest.raises(ReformError, match=rf"^--log_to {backend}: the {backend} package is not installed; "
                                          rf"run: pip install '\.\[{backend}\]'"):
        log_run(backend, *scored)


@pytest.mark.slow
def test_run_eval_and_run_loader_eval_log_to_mlflow(tmp_path, monkeypatch):
    """--log_to mlflow from both command lines: the run's metrics, read back through MlflowClient."""
    pytest.importorskip("mlflow", reason="mlflow not installed (pip install '.[mlflow]')")
    import json
    from mlflow.tracking import MlflowClient

    from reform_eval import run_eval
    from reform_eval import run_loader_eval
    from tests.conftest import write_custom_dataset
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.chdir(tmp_path)  # whatever MLflow writes by default stays out of the repository
    cfg = write_custom_dataset(str(tmp_path / "data"), n=8)
    out = tmp_path / "out"
    assert run_eval.main(["--model", "random", "--dataset_name", "custom", "--dataset_config", cfg,
                          "--output_dir", str(out), "--do_eval", "--log_to", "mlflow"]) == 0
    (pred,) = prediction_files(out)
    assert run_loader_eval.main(["--prediction_file", pred, "--output_dir", str(tmp_path / "re"),
                                 "--log_to", "mlflow"]) == 0
    client = MlflowClient(tracking_uri=uri)
    runs = [r for e in client.search_experiments() for r in client.search_runs([e.experiment_id])]
    assert len(runs) == 2
    accuracy = json.load(open([str(out / n) for n in os.listdir(out) if n.endswith(".results.json")][0]))
    assert all(abs(r.data.metrics["accuracy"] - accuracy["metrics"]["accuracy"]) < 1e-9 for r in runs)
