"""Score prediction files offline, through the same code as ``run_eval --do_eval``.

    python run_loader_eval.py --prediction_file output/preds.json
    python run_loader_eval.py --prediction_file output/A.json output/B.json output/C.json

    python run_loader_eval.py --explain output/A.json output/B.json

One file: prints the metrics and writes ``<stem>.scored-<hash>.results.json`` (+ ``.md``,
``.per_sample.json``) beside it (or into ``--output_dir``); results that ``run_eval`` wrote
are never replaced. Several files, directories or globs (several models on one benchmark):
each is scored, then a comparison (table with confidence intervals, paired tests, plots,
``report.html``) is written into ``--output_dir`` (default: their common directory).
``--explain A B``: why run B's answers differ from run A's (every recorded difference, and
which of them touch each flipped sample), each run scored with its own recorded settings
(docs/provenance.md).
This file is the command line only: the logic is ``evaluation.score`` and
``evaluation.reporting.explain_files.explain_files``.
"""
from __future__ import annotations

import argparse
import logging
from typing import Optional, Sequence

from .evaluation.boundary import run_cli
from .evaluation.config import MAX_N_BOOT, HelpFormatter, OneLineParser, add_scoring_flags
from .evaluation.engine import score
from .evaluation.reporting.explain_files import explain_files
from .evaluation.trackers import check_store as check_tracker_store
from .evaluation.reporting.scoring import loader_eval  # noqa: F401  (the Python API, re-exported)
from .utils.distributed import end_process
from .utils.errors import ReformError
from .utils.options import metric_options


def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog="run_loader_eval.py", formatter_class=HelpFormatter,
                                description="Score prediction files offline (one run, or a comparison of several).")
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--prediction_file", nargs="+",
                      help="JSON array / JSONL of records, a results directory, a directory of prediction files, "
                           "or a glob; several for a comparison")
    what.add_argument("--explain", nargs=2, metavar=("A", "B"),
                      help="explain why run B's answers differ from run A's: A and B are prediction files, their "
                           "results files (the scoring they name is used) or report folders; each run is scored "
                           "with its own recorded settings; with --output_dir, explain.md/.json are written there")
    p.add_argument("--formulation", default=None, help="SingleChoice or Generation (default: from the records)")
    p.add_argument("--infer_method", default=None, help="generation or likelihood (default: from the records)")
    p.add_argument("--eval_stability", action="store_true",
                   help="report instability across duplicates (needs --dataset_duplication >= 2 at run time)")
    p.add_argument("--dataset_name", default=None, help="needed for a benchmark's own results directory or file")
    p.add_argument("--output_dir", default=None,
                   help="where results (and a comparison) go (default: beside the file / their common directory)")
    add_scoring_flags(p)
    p.add_argument("--seed", type=int, default=0, help="seed of the bootstrap confidence intervals")
    p.add_argument("--n_boot", type=int, default=1000,
                   help=f"bootstrap resamples for confidence intervals (1 to {MAX_N_BOOT})")
    return p


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = build_parser().parse_args(argv)

    def body() -> int:
        if not 1 <= args.n_boot <= MAX_N_BOOT:
            raise ReformError(f"--n_boot must be a whole number from 1 to {MAX_N_BOOT}, got {args.n_boot}")
        if args.log_to:
            check_tracker_store(args.log_to)  # the store opened as logging will, before any scoring
        logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
        if args.explain:
            explain_files(args.explain[0], args.explain[1], dataset_name=args.dataset_name, output_dir=args.output_dir,
                          formulation=args.formulation, infer_method=args.infer_method, scoring_flags={
                              "--mme_parse": args.mme_parse, "--metric_option": args.metric_option,
                              "--likelihood_reduction": args.likelihood_reduction != "sum",
                              "--strip_reasoning": args.strip_reasoning, "--eval_stability": args.eval_stability,
                              "--export_mme_results": args.export_mme_results, "--log_to": args.log_to})
            return 0
        score(args.prediction_file, formulation=args.formulation, infer_method=args.infer_method,
              eval_stability=args.eval_stability, likelihood_reduction=args.likelihood_reduction,
              dataset_name=args.dataset_name, output_dir=args.output_dir,
              metric_options=metric_options(args.metric_option, args.mme_parse, args.strip_reasoning),
              export_mme_results=args.export_mme_results, seed=args.seed, n_boot=args.n_boot, log_to=args.log_to)
        return 0
    return run_cli(body, "run_loader_eval")


def cli() -> None:
    """Console-script entry point."""
    end_process(main())


if __name__ == "__main__":
    cli()
