"""Experiment trackers: one scored run logged to MLflow or Weights & Biases (``--log_to``).

Why here (above the scoring layer): a tracker logs what scoring made (the results dict of
``evaluation.reporting.scoring.score_records``) and what reporting drew (the PNG plots and
``comparison.json`` of the report directory); it changes nothing in them. Each backend logs:

* the run's config, credentials redacted (``utils.secrets.redact``), as parameters;
* the headline metrics, each with its 95% CI (``<metric>_ci_low`` / ``_ci_high``) where the
  report's bootstrap gave one;
* the breakdown tables (the metric's tables, and the report's breakdowns with their CIs);
* the per-sample verdicts as one table;
* the plots (every ``*.png`` under the report directory).

Both libraries are optional extras (``pip install .[mlflow]`` / ``.[wandb]``), imported only
when asked for; a missing one is a one-line ReformError naming the pip command. Neither needs
the network: MLflow writes to a local store (``tracking_uri``: a directory, ``file:`` or
``sqlite:`` URI), W&B to its offline directory when ``WANDB_MODE=offline``.
"""
from __future__ import annotations

import glob
import importlib.util
import json
import math
import os
import re
from typing import Any, Dict, List, Optional, Tuple

from .reporting.scoring import headline
from ..utils.errors import ReformError
from ..utils.invocation import command_for
from ..utils.secrets import json_default, redact
from ..utils.world import probe_folder

BACKENDS = ("mlflow", "wandb")
#: one tracker table cell at most this long (a model's reply can be megabytes)
MAX_CELL = 2000


def log_run(backend: str, result: Dict[str, Any], files: Optional[Dict[str, str]] = None, *,
            run_name: Optional[str] = None, tracking_uri: Optional[str] = None,
            experiment: str = "reform-eval", directory: Optional[str] = None) -> Dict[str, Any]:
    """Log one scored run; returns ``{"backend", "run_id", "location"}``.

    ``result``: the dict ``score_records`` returns (``metrics``, ``tables``, ``per_sample``,
    ``config``, ...). ``files``: ``report_dir`` (plots and ``comparison.json``) and any other
    files to attach (``prediction_file``, ``results_json``, ...). ``tracking_uri`` (MLflow) and
    ``directory`` (W&B's ``dir``) say where the run goes; ``experiment`` is the MLflow
    experiment or W&B project.
    """
    if backend not in BACKENDS:
        raise ReformError(f"--log_to {backend!r}: valid trackers are {', '.join(BACKENDS)}")
    content = run_content(result, files or {})
    name = run_name or content["name"]
    try:
        if backend == "mlflow":
            return _log_mlflow(content, name, tracking_uri, experiment)
        return _log_wandb(content, name, directory, experiment)
    except ReformError:
        raise
    except Exception as e:  # noqa: BLE001  (the tracker refused: the world's condition, not our defect)
        saved = (files or {}).get("results_json") or (files or {}).get("prediction_file")
        again = (f"; the results are saved ({saved}): log them again with {command_for('run_loader_eval')} "
                 f"--prediction_file {(files or {}).get('prediction_file')} --log_to {backend}") if saved else ""
        raise ReformError(f"{_refusal(backend, tracking_uri, directory, e)}{again}") from None


def check_store(backend: str, tracking_uri: Optional[str] = None, experiment: str = "reform-eval",
                directory: Optional[str] = None) -> None:
    """Before any work: open the tracker's store the way ``log_run`` will (MLflow: the same
    tracking URI, the experiment looked up or created by the same code; W&B: its run folder
    written), so a store that refuses (MLflow 3 refuses a ``file:`` store) is one line before the
    model runs, not an error after it."""
    check_installed(backend)
    try:
        if backend == "mlflow":
            import mlflow  # heavy optional extra: imported only when --log_to mlflow asks for it
            _open_mlflow_experiment(mlflow, _mlflow_uri(tracking_uri), experiment)
        else:
            probe_folder(_wandb_dir(directory), "WANDB_DIR")
    except ReformError:
        raise
    except Exception as e:  # noqa: BLE001  (the tracker's own refusal, in its words)
        raise ReformError(_refusal(backend, tracking_uri, directory, e) + "; nothing was run") from None


def _refusal(backend: str, tracking_uri: Optional[str], directory: Optional[str], e: BaseException) -> str:
    """One line: which store refused, its reason, and the way out."""
    text = " ".join(str(e).split())
    reason = (re.split(r"(?<=[.!?]) ", text, maxsplit=1)[0][:240] or type(e).__name__)  # its first sentence
    opt_out = re.search(r"set `?([A-Z][A-Z0-9_]+=[A-Za-z0-9]+)`? to opt out", text)  # MLflow 3's file-store note
    if opt_out:
        reason += f" (MLflow's own opt-out: {opt_out.group(1)})"
    if backend == "mlflow":
        uri = _mlflow_uri(tracking_uri) or "(MLflow's default store)"
        return (f"--log_to mlflow: the tracking store {uri} (MLFLOW_TRACKING_URI) refused: {type(e).__name__}: "
                f"{reason}; set MLFLOW_TRACKING_URI to a store this MLflow accepts (e.g. sqlite:///<folder>/mlflow.db "
                "or a tracking server's http:// address)")
    return (f"--log_to wandb: {_wandb_dir(directory)} (WANDB_DIR) refused: {type(e).__name__}: {reason}; set "
            "WANDB_DIR to a writable folder (and WANDB_MODE=offline without a W&B account)")


def _mlflow_uri(tracking_uri: Optional[str]) -> Optional[str]:
    """The tracking URI logging uses: the one given, else ``MLFLOW_TRACKING_URI``; a plain folder
    becomes a ``file:`` URI."""
    tracking_uri = tracking_uri or os.environ.get("MLFLOW_TRACKING_URI")  # the user's store, every call
    if tracking_uri and "://" not in tracking_uri and not tracking_uri.startswith(("file:", "sqlite:")):
        tracking_uri = "file:" + os.path.abspath(tracking_uri)
    return tracking_uri or None


def _open_mlflow_experiment(mlflow: Any, tracking_uri: Optional[str], experiment: str) -> None:
    """Point MLflow at the store and make the experiment current (created where missing): the
    first thing logging does, and the whole of the pre-check."""
    if tracking_uri:
        mlflow.set_tracking_uri(tracking_uri)
    if mlflow.get_experiment_by_name(experiment) is None:
        # beside a local store, not in the current directory (MLflow's default ./mlruns)
        local = tracking_uri[len("sqlite:///"):] if tracking_uri and tracking_uri.startswith("sqlite:///") else None
        root = os.path.join(os.path.dirname(os.path.abspath(local)), "mlartifacts") if local else None
        mlflow.create_experiment(experiment, artifact_location=root)
    mlflow.set_experiment(experiment)


def _wandb_dir(directory: Optional[str]) -> str:
    """Where W&B writes its run folder: the one given, else ``WANDB_DIR``, else the current folder."""
    return os.path.abspath(directory or os.environ.get("WANDB_DIR") or os.getcwd())


# --------------------------------------------------------------------------- content
def run_content(result: Dict[str, Any], files: Dict[str, str]) -> Dict[str, Any]:
    """What any tracker logs, as plain data: params, metrics, tables (name -> (columns, rows)),
    plots (PNG paths) and artifacts (other files)."""
    report_dir = files.get("report_dir")
    comparison = _read_comparison(report_dir)
    metrics: Dict[str, float] = {k: float(v) for k, v in headline(result.get("metrics", {})).items()
                                 if math.isfinite(float(v))}
    tables: Dict[str, Tuple[List[str], List[List[Any]]]] = {}
    if comparison:
        model = comparison["models"][0]
        for k, iv in model.get("headline", {}).items():
            for part in ("value", "low", "high"):
                if isinstance(iv.get(part), (int, float)):
                    metrics[k if part == "value" else f"{k}_ci_{part}"] = float(iv[part])
        for bname, groups in model.get("breakdowns", {}).items():
            cols = ["group", "n"] + sorted({m for row in groups.values() for m in row if m != "n"})
            rows = []
            for g, row in groups.items():
                cells: List[Any] = [str(g), row.get("n")]
                for m in cols[2:]:
                    iv = row.get(m) or {}
                    cells.append(_fmt_interval(iv))
                rows.append(cells)
            tables[f"breakdown {bname} (95% CI)"] = (cols, rows)
    for title, md in (result.get("tables") or {}).items():
        parsed = parse_markdown_table(md) if isinstance(md, str) else None
        if parsed:
            tables[title] = parsed
    per_sample = result.get("per_sample") or []
    if per_sample:
        cols = sorted({k for p in per_sample for k in p})
        tables["per-sample verdicts"] = (cols, [[_cell(p.get(c)) for c in cols] for p in per_sample])
    params = _flatten(redact(result.get("config") or {}))
    for key in ("metric", "formulation", "infer_method", "run_id", "prediction_file"):
        if result.get(key) is not None:
            params.setdefault(key, str(result[key]))
    plots = sorted(glob.glob(os.path.join(report_dir, "**", "*.png"), recursive=True)) if report_dir else []
    artifacts = [p for k, p in files.items() if k != "report_dir" and p and os.path.isfile(p)]
    name = str((result.get("config") or {}).get("model") or "run")
    if result.get("run_id"):
        name = f"{name}-{result['run_id']}"
    return {"name": name, "params": params, "metrics": metrics, "tables": tables, "plots": plots,
            "artifacts": artifacts}


def _read_comparison(report_dir: Optional[str]) -> Optional[Dict[str, Any]]:
    path = os.path.join(report_dir, "comparison.json") if report_dir else None
    if not path or not os.path.isfile(path):
        return None
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        raise ReformError(f"{path}: cannot read the report's comparison ({e})") from None
    return data if isinstance(data, dict) and data.get("models") else None


def _fmt_interval(iv: Dict[str, Any]) -> Optional[str]:
    if not isinstance(iv, dict) or iv.get("value") is None:
        return None
    if iv.get("low") is None or iv.get("high") is None:
        return f"{iv['value']:.4g}"
    return f"{iv['value']:.4g} [{iv['low']:.4g}, {iv['high']:.4g}]"


_SEP_ROW = re.compile(r"^\|?\s*:?-{2,}:?\s*(\|\s*:?-{2,}:?\s*)*\|?$")


def parse_markdown_table(md: str) -> Optional[Tuple[List[str], List[List[str]]]]:
    """(columns, rows) of the first pipe table in ``md``, or None."""
    lines = [ln.strip() for ln in md.splitlines() if ln.strip().startswith("|")]
    if len(lines) < 2 or not _SEP_ROW.match(lines[1]):
        return None

    def cells(line: str) -> List[str]:
        return [c.strip() for c in line.strip().strip("|").split("|")]
    cols = cells(lines[0])
    rows = [cells(ln) for ln in lines[2:]]
    return cols, [r + [""] * (len(cols) - len(r)) if len(r) < len(cols) else r[:len(cols)] for r in rows]


def _cell(v: Any) -> Any:
    """A table cell: scalars as they are, anything else as (cut) JSON text."""
    if v is None or isinstance(v, (bool, int, float)):
        return v
    text = v if isinstance(v, str) else json.dumps(v, default=json_default, sort_keys=True)
    return text if len(text) <= MAX_CELL else text[:MAX_CELL] + "..."


def _flatten(obj: Any, prefix: str = "") -> Dict[str, str]:
    """Nested config -> ``{"a.b": "value"}`` (lists as JSON), each value at most MAX_CELL chars."""
    if isinstance(obj, dict) and (obj or not prefix):  # an empty top level is no parameter at all
        out: Dict[str, str] = {}
        for k, v in obj.items():
            out.update(_flatten(v, f"{prefix}{k}."))
        return out
    text = obj if isinstance(obj, str) else json.dumps(obj, default=json_default)
    return {prefix.rstrip("."): text[:MAX_CELL]}


def check_installed(backend: str) -> None:
    """Before any work: the tracker's package can be found (a missing extra is one line)."""
    if importlib.util.find_spec(backend) is None:
        raise _missing(backend)


def _missing(backend: str) -> ReformError:
    return ReformError(f"--log_to {backend}: the {backend} package is not installed; "
                       f"run: pip install '.[{backend}]' (or pip install {backend})")


# --------------------------------------------------------------------------- MLflow
def _log_mlflow(content: Dict[str, Any], name: str, tracking_uri: Optional[str], experiment: str) -> Dict[str, Any]:
    try:
        import mlflow  # heavy optional extra: imported only when --log_to mlflow asks for it
    except ImportError:
        raise _missing("mlflow") from None
    _open_mlflow_experiment(mlflow, _mlflow_uri(tracking_uri), experiment)
    with mlflow.start_run(run_name=name) as run:
        params = content["params"]
        keys = sorted(params)
        for i in range(0, len(keys), 100):  # MLflow takes at most 100 params per call
            mlflow.log_params({k: params[k] for k in keys[i:i + 100]})
        if content["metrics"]:
            mlflow.log_metrics(content["metrics"])
        for title, (cols, rows) in content["tables"].items():
            mlflow.log_table({c: [r[i] for r in rows] for i, c in enumerate(cols)},
                             artifact_file=f"tables/{_file_name(title)}.json")
        for path in content["plots"]:
            mlflow.log_artifact(path, artifact_path="plots")
        for path in content["artifacts"]:
            mlflow.log_artifact(path, artifact_path="files")
        run_id = run.info.run_id
    return {"backend": "mlflow", "run_id": run_id, "location": mlflow.get_tracking_uri()}


# --------------------------------------------------------------------------- W&B
def _log_wandb(content: Dict[str, Any], name: str, directory: Optional[str], project: str) -> Dict[str, Any]:
    try:
        import wandb  # heavy optional extra: imported only when --log_to wandb asks for it
    except ImportError:
        raise _missing("wandb") from None
    if directory:
        os.makedirs(directory, exist_ok=True)
    run = wandb.init(project=project, name=name, dir=directory, config=content["params"], reinit="finish_previous")
    try:
        summary = dict(content["metrics"])
        for title, (cols, rows) in content["tables"].items():
            summary[f"tables/{_file_name(title)}"] = wandb.Table(columns=cols, allow_mixed_types=True, data=[[_wandb_cell(c) for c in r]
                                                                                     for r in rows])
        for path in content["plots"]:
            summary[f"plots/{os.path.splitext(os.path.basename(path))[0]}"] = wandb.Image(path)
        run.log(summary)
        for k, v in content["metrics"].items():
            run.summary[k] = v
        for path in content["artifacts"]:
            run.save(path, base_path=os.path.dirname(path), policy="now")
        run_id, location = run.id, run.dir
    finally:
        run.finish()
    return {"backend": "wandb", "run_id": run_id, "location": location}


def _wandb_cell(v: Any) -> Any:
    return v if v is None or isinstance(v, (bool, int, float, str)) else str(v)


def _file_name(title: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", title).strip("_")[:80] or "table"
