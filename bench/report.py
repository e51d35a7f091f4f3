"""Time to build the report for 5 models x the full MME set (2,374 questions each).

Why: report.html must stay usable, and quick to write, at the largest benchmark we run. The
dataset is the real question lists laid out with placeholder images (build.mme's
``write_placeholder_release``); five runs come from the real baselines' interface: the
``random`` baseline with seeds 0-3 and ``constant``. Scoring is timed apart; the timed part
is ``compare_runs``: cluster bootstrap (1,000 resamples), paired tests, plots, thumbnails and
report.html.

Usage: ``python bench/report.py [--questions DIR] [--n_boot 1000] [--keep DIR]``; prints
``report_seconds=<s>``.
"""
from __future__ import annotations

import argparse
import logging
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def default_questions() -> str:
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    for path in (os.path.join(os.path.dirname(here), "shared", "data", "mme"), "/work/shared/data/mme"):
        if os.path.isdir(path):
            return path
    return os.path.join(os.path.dirname(here), "shared", "data", "mme")


def make_runs(questions: str, work: str):
    """Five scored runs over the full MME set, predictions from the real baseline interfaces."""
    from build import build_dataset
    from build.mme import write_placeholder_release
    from metrics import evaluate
    from models.interfaces.baseline_interface import ConstantBaseline, RandomBaseline
    from utils.predictions import make_record
    release = os.path.join(work, "release")
    write_placeholder_release(questions, release)
    samples, _ = build_dataset("MME", "Generation", {"root": release, "prompt": "official"})
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
    ap.add_argument("--questions", default=default_questions(), help="folder of the official <subtask>.txt lists")
    ap.add_argument("--n_boot", type=int, default=1000)
    ap.add_argument("--keep", default=None, metavar="DIR", help="also copy the report folder here")
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)
    from evaluation.reporting.report import compare_runs
    with tempfile.TemporaryDirectory() as work:
        t0 = time.perf_counter()
        runs = make_runs(args.questions, work)
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
