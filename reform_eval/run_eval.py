"""Evaluate one model on one benchmark: build samples, run the model, merge, score.

Single process: ``python run_eval.py --model llava --model_name tiny --dataset_name iWISDM ...``
Several:        ``torchrun --nproc_per_node=N run_eval.py ...`` (gloo on CPU, nccl on GPU).

This file is the command line only: argv -> ``evaluation.RunConfig`` -> ``evaluation.evaluate``
-> a short summary on the console; the exception boundary turns any failure into one line.
"""
from __future__ import annotations

from typing import Optional, Sequence

from .evaluation.boundary import run_cli
from .evaluation.config import RunConfig, build_parser  # noqa: F401  (build_parser: for --help tests)
from .evaluation.engine import evaluate
from .utils.distributed import end_process, process_ends_after_run
from .utils.lifetime import die_with_parent  # noqa: F401  (used by DataLoader workers and tests)


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)

    def body() -> int:
        result = evaluate(RunConfig.from_namespace(args))
        text = result.console_text()
        if text:
            print(text, flush=True)
        return 0
    return run_cli(body, "run_eval")


def cli() -> None:
    """Console-script entry point."""
    process_ends_after_run()
    end_process(main())


if __name__ == "__main__":
    cli()
