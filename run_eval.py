"""Evaluate one model on one benchmark: build samples, run the model, merge, score.

Single process: ``python run_eval.py --model llava --model_name tiny --dataset_name iWISDM ...``
Several:        ``torchrun --nproc_per_node=N run_eval.py ...`` (gloo on CPU, nccl on GPU).

This file is the command line only: argv -> ``evaluation.RunConfig`` -> ``evaluation.evaluate``
-> a short summary on the console; the exception boundary turns any failure into one line.
"""
from __future__ import annotations

import sys
from typing import Optional, Sequence

from evaluation.boundary import run_cli
from evaluation.config import RunConfig, build_parser  # noqa: F401  (build_parser: for --help tests)
from evaluation.engine import RunResult, evaluate
from evaluation.execute import die_with_parent  # noqa: F401  (used by DataLoader workers and tests)


def summary(result: RunResult) -> str:
    """What the run did and where it went, in a few lines."""
    lines = []
    if result.reused:
        lines.append(f"predictions reused from {result.prediction_file} (pass --overwrite to run again)")
    if result.results_files:
        lines.append(f"results: {result.results_files['json']}")
        if result.report:
            lines.append(f"report: {result.report}")
    elif result.num_records:
        lines.append(f"predictions: {result.prediction_file}\nto score them: python run_loader_eval.py "
                     f"--prediction_file {result.prediction_file}  (or re-run this command with --do_eval)")
    return "\n".join(lines)


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)

    def body() -> int:
        result = evaluate(RunConfig.from_namespace(args))
        text = summary(result)
        if text:
            print(text, flush=True)
        return 0
    return run_cli(body, "run_eval")


def cli() -> None:
    """Console-script entry point."""
    sys.exit(main())


if __name__ == "__main__":
    cli()
