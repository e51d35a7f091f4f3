"""Time to build the report for 5 models x the full MME set (2,374 questions each).

Why: report.html must stay usable, and quick to write, at the largest benchmark we run. The
dataset is the real question lists laid out with placeholder images (build.mme's
``write_placeholder_release``); five runs come from the real baselines' interface: the
``random`` baseline with seeds 0-3 and ``constant``. Scoring is timed apart; the timed part
is ``compare_runs``: cluster bootstrap (1,000 resamples), paired tests, plots, thumbnails and
report.html.

The question lists are the ones shipped in ``configs/data/mme_questions`` unless ``--questions``
names another folder.

Usage: ``python bench/report.py [--questions DIR] [--n_boot 1000] [--keep DIR] [--smoke]``

Prints: report_seconds=<s>
"""
from __future__ import annotations

import argparse
import logging
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from reform_eval.build.mme import shipped_questions  # noqa: E402
from reform_eval.utils.errors import ReformError  # noqa: E402


def make_runs(questions: str, work: str, subtasks=None):
    """Five scored runs over the MME set (``subtasks``: only those), predictions from the real
    baseline interfaces."""
    from reform_eval.build import build_dataset
    from reform_eval.build.mme import write_placeholder_release
    from reform_eval.metrics import evaluate
    from reform_eval.models.interfaces.baseline_interface import ConstantBaseline, RandomBaseline
    from reform_eval.utils.predictions import make_record
    release = os.path.join(work, "release")
    write_placeholder_release(questions, release, subtasks=subtasks)
    options = {"root": release, "prompt": "official", **({"subtasks": list(subtasks)} if subtasks else {})}
    samples, _ = build_dataset("MME", "Generation", options)
    models = [(f"random-seed{s}", RandomBaseline({"seed": s})) for s in range(4)]
    models.append(("constant", ConstantBaseline({})))
    runs = []
    for name, model in models:
        preds = model.forward("generation", samples, [s["question"] for s in samples])
        records = [make_record(s, p, prompt=s["question"]) for s, p in zip(samples, preds)]
        for r, s in zip(records, samples):
            r.setdefault("prompt", s["question"])
        res = evaluate(records, "Generation", "generation")
        res.update(formulation="Generation", infer_method="generation",
                   prediction_file=os.path.join(work, f"{name}.json"))
        runs.append({"name": name, "records": records, "result": res})
    return runs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--questions", default=shipped_questions(),
                    help="folder of the official <subtask>.txt lists (default: the shipped configs/data/mme_questions)")
    ap.add_argument("--n_boot", type=int, default=1000)
    ap.add_argument("--keep", default=None, metavar="DIR", help="also copy the report folder here")
    ap.add_argument("--smoke", action="store_true", help="two subtasks, 20 resamples: checks that the bench runs "
                    "(seconds), measures nothing")
    args = ap.parse_args()
    subtasks = ["existence", "OCR"] if args.smoke else None
    if args.smoke:
        args.n_boot = 20
    logging.basicConfig(level=logging.WARNING)
    from reform_eval.evaluation.reporting.report import compare_runs
    with tempfile.TemporaryDirectory() as work:
        t0 = time.perf_counter()
        try:
            runs = make_runs(args.questions, work, subtasks)
        except ReformError as e:  # a --questions folder without the lists: one line, no traceback
            print(f"error: {e}", file=sys.stderr)
            sys.exit(2)
        t1 = time.perf_counter()
        n = [len(r["records"]) for r in runs]
        comp = compare_runs(runs, os.path.join(work, "report"), n_boot=args.n_boot)
        t2 = time.perf_counter()
        size = os.path.getsize(comp["files"]["report_html"])
        print(f"models={len(runs)} records_per_model={n[0]} n_boot={args.n_boot} "
              f"setup_and_scoring_seconds={t1 - t0:.2f} report_html_bytes={size}")
        if args.keep:
            import shutil
            shutil.copytree(os.path.join(work, "report"), args.keep, dirs_exist_ok=True)
        print(f"report_seconds={t2 - t1:.2f}")


if __name__ == "__main__":
    main()
