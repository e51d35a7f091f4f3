"""Score a prediction file offline, through the same metric code as ``run_eval --do_eval``.

    python run_loader_eval.py --formulation SingleChoice --infer_method likelihood \\
        --eval_stability --prediction_file output/preds.json

Accepts a JSON array or JSONL of prediction records (and, for benchmarks that register a
reader, a results directory in their official format). Prints the metrics table and writes
``results.json`` and ``results.md`` beside the file (or into ``--output_dir``).
"""
from __future__ import annotations

import argparse
import logging
import os
import sys
from typing import Any, Dict, List, Optional, Sequence

from utils.errors import ReformError

logger = logging.getLogger("run_loader_eval")


def _infer(records: List[Dict[str, Any]], key: str, given: Optional[str], flag: str) -> str:
    if given:
        return given
    values = {r.get(key) for r in records if r.get(key)}
    if len(values) == 1:
        return values.pop()
    raise ReformError(f"cannot tell {flag} from the records ({sorted(map(str, values)) or 'none given'}); pass {flag}")


def score_records(records: List[Dict[str, Any]], formulation: Optional[str] = None,
                  infer_method: Optional[str] = None, eval_stability: bool = False,
                  likelihood_reduction: str = "sum", prediction_file: Optional[str] = None,
                  output_dir: Optional[str] = None, metric_options: Optional[Dict[str, Any]] = None,
                  extra: Optional[Dict[str, Any]] = None, metric: Optional[str] = None,
                  write: bool = True, quiet: bool = False) -> Dict[str, Any]:
    """The one scoring path: metrics -> printed table -> results.json / results.md."""
    from metrics import evaluate
    from utils.predictions import write_json_atomic
    from utils.report import metrics_report

    formulation = _infer(records, "formulation", formulation, "--formulation")
    infer_method = _infer(records, "inference_method", infer_method, "--infer_method")
    result = evaluate(records, formulation, infer_method, eval_stability=eval_stability,
                      likelihood_reduction=likelihood_reduction, metric=metric,
                      file=prediction_file, **(metric_options or {}))
    summary = {"metrics": result["metrics"], "metric": result["metric"], "formulation": formulation,
               "infer_method": infer_method, "likelihood_reduction": likelihood_reduction,
               "eval_stability": eval_stability, "prediction_file": prediction_file,
               "num_records": len(records)}
    if extra:
        summary = {**extra, **summary}
    report = metrics_report(result, title=f"{records[0].get('benchmark', '')} {formulation} {infer_method}".strip())
    if not quiet:
        print(report)
    if write:
        out_dir = output_dir or (os.path.dirname(os.path.abspath(prediction_file)) if prediction_file else ".")
        write_json_atomic(os.path.join(out_dir, "results.json"), summary)
        with open(os.path.join(out_dir, "results.md"), "w", encoding="utf-8") as f:
            f.write(report)
        per_sample_path = os.path.join(out_dir, "per_sample_scores.json")
        write_json_atomic(per_sample_path, result.get("per_sample", []), indent=None)
        with open(os.path.join(out_dir, "log.txt"), "a", encoding="utf-8") as f:
            f.write(report)
    summary["tables"] = result.get("tables", {})
    summary["per_sample"] = result.get("per_sample", [])
    return summary


def load_records(prediction_file: str, dataset_name: Optional[str] = None) -> List[Dict[str, Any]]:
    """Records from a file, or from a results directory read by the benchmark's registered reader."""
    from utils.predictions import PREDICTION_DIR_READERS, read_predictions
    if os.path.isdir(prediction_file) and dataset_name:
        import metrics  # noqa: F401  (metric modules register directory readers)
        from build.registry import get_builder_class
        name = get_builder_class(dataset_name).name
        if name not in PREDICTION_DIR_READERS:
            raise ReformError(f"{prediction_file}: is a directory, and {name} has no results-directory reader")
        return PREDICTION_DIR_READERS[name](prediction_file)
    if dataset_name and os.path.isfile(prediction_file):
        import metrics  # noqa: F401  (metric modules register file readers)
        from build.registry import get_builder_class
        from utils.predictions import PREDICTION_FILE_READERS
        ext = os.path.splitext(prediction_file)[1].lower()
        reader = PREDICTION_FILE_READERS.get((get_builder_class(dataset_name).name, ext))
        if reader is not None:
            return reader(prediction_file)
    return read_predictions(prediction_file)


def loader_eval(prediction_file: str, formulation: Optional[str] = None, infer_method: Optional[str] = None,
                eval_stability: bool = False, likelihood_reduction: str = "sum",
                dataset_name: Optional[str] = None, output_dir: Optional[str] = None,
                metric_options: Optional[Dict[str, Any]] = None, write: bool = True,
                quiet: bool = False, export_mme_results: Optional[str] = None) -> Dict[str, Any]:
    """Python API: score ``prediction_file`` and return the results dict (as written to results.json).

    ``export_mme_results``: also write the records in the official MME tool's results format there.
    """
    import build  # noqa: F401  (registers builders for dataset-name lookups)
    records = load_records(prediction_file, dataset_name)
    if not records:
        raise ReformError(f"{prediction_file}: holds no prediction records")
    if any(r.get("release_reference") for r in records):
        from metrics.mmmt_if_release import print_release_report
        return print_release_report(records, prediction_file, output_dir, write=write, quiet=quiet)
    result = score_records(records, formulation, infer_method, eval_stability, likelihood_reduction,
                           prediction_file=prediction_file, output_dir=output_dir,
                           metric_options=metric_options, write=write, quiet=quiet)
    if export_mme_results:
        from metrics.mme import write_official_results
        write_official_results(records, export_mme_results, likelihood_reduction=likelihood_reduction)
    return result


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description="Score a prediction file offline.",
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--prediction_file", required=True, help="JSON array / JSONL of records (or a results directory)")
    p.add_argument("--formulation", default=None, help="SingleChoice or Generation (default: from the records)")
    p.add_argument("--infer_method", default=None, help="generation or likelihood (default: from the records)")
    p.add_argument("--eval_stability", action="store_true")
    p.add_argument("--likelihood_reduction", default="sum", choices=["sum", "mean"])
    p.add_argument("--dataset_name", default=None, help="needed for a results directory")
    p.add_argument("--output_dir", default=None, help="where results.json goes (default: beside the file)")
    p.add_argument("--metric_option", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--mme_parse", default=None, choices=["official", "stripped", "word"],
                   help="MME answer parsing rule (default: official)")
    p.add_argument("--export_mme_results", default=None, metavar="DIR",
                   help="MME: also write the records in the official eval tool's results format")
    return p


def main(argv: Optional[Sequence[str]] = None) -> int:
    from run_eval import metric_options_from
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        loader_eval(args.prediction_file, args.formulation, args.infer_method, args.eval_stability,
                    args.likelihood_reduction, args.dataset_name, args.output_dir, metric_options_from(args),
                    export_mme_results=args.export_mme_results)
    except ReformError as e:
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code
    return 0


def cli() -> None:
    """Console-script entry point."""
    sys.exit(main())


if __name__ == "__main__":
    cli()
